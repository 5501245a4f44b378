"""How a ``batch/v1`` Job and its pods say what happened to a run: pure readers of the API's plain dicts, so the
Kubernetes job runner's judgement is tested without a cluster and shares one reading of the conditions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .job_manifests import MAIN_CONTAINER

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
    newest = sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp")), reverse=True)
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
