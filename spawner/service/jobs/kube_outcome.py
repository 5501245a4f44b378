"""How one attempt of a gpupool job, run as a ``batch/v1`` Job, ended: a pure reading of the Job and its pods.

The Job's ``Complete`` condition is exit status 0; ``Failed`` with reason ``DeadlineExceeded`` is a timeout;
``Failed`` otherwise (the failure policy's ``FailJob`` on the main container's non-zero exit, or
``BackoffLimitExceeded``) is a failure with the main container's exit code. A pod that failed with the
``DisruptionTarget`` condition (preemption, eviction, a drained or lost node) is a lost run: the Job is deleted
and the manager requeues the job. A Job that vanished without gpupool deleting it is a lost run too: the
user's command did nothing wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...kube.job_status import disrupted_pod, finished_condition, main_exit_code, true_condition
from .runner import Outcome


def job_outcome(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> Outcome:
    """How the attempt a Job ran ended (see the module docstring for the mapping)."""
    condition = finished_condition(job)
    reason = str((condition or {}).get("reason") or "")
    message = str((condition or {}).get("message") or "")
    if condition is not None and condition.get("type") == "Complete":
        return Outcome(0)
    if condition is not None and reason == "DeadlineExceeded":
        deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
        return Outcome(
            main_exit_code(pods),
            timed_out=f"ran past its maximum runtime of {deadline} s (the Job's activeDeadlineSeconds)",
        )
    code = main_exit_code(pods)
    if condition is not None and code is not None:
        return Outcome(code)
    disrupted = disrupted_pod(pods)
    if disrupted is not None:
        why = true_condition(disrupted.get("status") or {}, "DisruptionTarget") or {}
        node = (disrupted.get("spec") or {}).get("nodeName") or "its node"
        said = ": ".join(str(part) for part in (why.get("reason"), why.get("message")) if part)
        return Outcome(None, lost=f"its pod {_name(disrupted)} on {node} was disrupted ({said or 'evicted'})")
    if condition is not None:
        return Outcome(None, reason=f"its Kubernetes Job failed ({reason}: {message})".replace(": )", ")"))
    return Outcome(None, lost="its Kubernetes Job stopped running without saying how")


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))
