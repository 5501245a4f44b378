"""How a ``batch/v1`` Job and its pods say what happened to a run: pure readers of the API's plain dicts, so the
Kubernetes job runner's judgement is tested without a cluster and shares one reading of the conditions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .job_manifests import MAIN_CONTAINER
from .manifests import KUEUE_QUEUE_LABEL

JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")  # what the Job controller labels pods with


def finished_condition(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Job's ``Complete`` or ``Failed`` condition when it is true: the Job controller is done with it."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            found: Mapping[str, Any] = condition
            return found
    return None


def disrupted_pod(pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """A pod the cluster took away: failed, with the ``DisruptionTarget`` condition."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") == "Failed" and true_condition(status, "DisruptionTarget") is not None:
            return pod
    return None


def main_exit_code(pods: Iterable[Mapping[str, Any]]) -> int | None:
    """The exit code of the main container in the newest pod that ran it to the end, if any."""
    newest = sorted(pods, key=_created, reverse=True)
    for pod in newest:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated")
            if container.get("name") == MAIN_CONTAINER and terminated and "exitCode" in terminated:
                return int(terminated["exitCode"])
    return None


def true_condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            found: Mapping[str, Any] = condition
            return found
    return None


def owner_job(pod: Mapping[str, Any]) -> str | None:
    meta = pod.get("metadata") or {}
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == "Job":
            return str(owner.get("name"))
    labels = meta.get("labels") or {}
    for label in JOB_NAME_LABELS:
        if label in labels:
            return str(labels[label])
    return None


def holdup(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> str | None:
    """What still keeps a Job's command from running, in words (a suspended Job, a pod not yet scheduled or
    waiting for its image or a Secret); None once a pod runs it, or the Job has ended."""
    if finished_condition(job) is not None:
        return None
    if (job.get("spec") or {}).get("suspend"):
        queue = ((job.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
        return (
            f"its Job is suspended until Kueue admits it (queue {queue})" if queue else "its Job is suspended"
        )
    phases = [((p.get("status") or {}).get("phase"), p) for p in pods]
    live = [p for phase, p in phases if phase in (None, "Pending", "Running")]
    if not live:  # a pod that ran (its Job's condition still to come) or one on a lost node: nothing to say
        return None if phases else "its Job has no pod yet"
    newest = max(live, key=_created)
    status = newest.get("status") or {}
    if status.get("phase") == "Running":
        return None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"its pod is not scheduled: {condition.get('message') or condition.get('reason')}"
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            why = ": ".join(str(w) for w in (waiting.get("reason"), waiting.get("message")) if w)
            return f"its pod is waiting: {why or 'starting'}"
    return "its pod is starting"


def _created(pod: Mapping[str, Any]) -> str:
    """A pod's creation time, for ordering (RFC 3339 sorts as text); '' when not yet set."""
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")
