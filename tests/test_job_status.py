"""What a Kubernetes Job, its pods and its events say of a run that has not started, read from the API's plain
dicts (the end-to-end cases, a real scheduler's refusal, a Job waiting for Kueue and a ResourceQuota's
refusal, are in ``test_kube_jobs``)."""

from __future__ import annotations

from typing import Any

from gpupool.spawner.kube.create_refusals import CreateRefusals
from gpupool.spawner.kube.job_status import holdup

JOB: dict[str, Any] = {"metadata": {"name": "gpupool-job-1-1"}, "spec": {}, "status": {}}


def _pod(phase: str | None, created: str | None = "2026-12-07T00:00:00Z", **status: Any) -> dict[str, Any]:
    meta = {"name": f"pod-{phase}-{created}"} | ({"creationTimestamp": created} if created else {})
    return {"metadata": meta, "status": ({"phase": phase} if phase else {}) | status}


def test_each_reason_a_run_has_not_started_is_said_and_a_running_or_ended_pod_says_nothing() -> None:
    assert holdup(JOB, []) == "its Job has no pod yet"
    unscheduled = {"type": "PodScheduled", "status": "False", "message": "0/2 nodes are available"}
    assert holdup(JOB, [_pod("Pending", conditions=[unscheduled])]) == (
        "its pod is not scheduled: 0/2 nodes are available"
    )
    pulling = {"name": "main", "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}
    assert holdup(JOB, [_pod("Pending", containerStatuses=[pulling])]) == (
        "its pod is waiting: ErrImagePull: not found"
    )
    assert holdup(JOB, [_pod("Pending")]) == "its pod is starting"
    assert holdup(JOB, [_pod("Running")]) is None
    # the review: a pod that ran, before its Job's condition lands, is not "no pod yet"
    assert holdup(JOB, [_pod("Succeeded")]) is None and holdup(JOB, [_pod("Failed")]) is None
    complete = JOB | {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert holdup(complete, [_pod("Pending")]) is None


def test_a_pod_without_a_creation_time_yet_is_not_taken_for_the_newest() -> None:
    older_running = _pod("Running", "2026-12-07T00:00:00Z")
    assert holdup(JOB, [older_running, _pod("Pending", None)]) is None


def test_a_suspended_job_names_its_kueue_queue() -> None:
    suspended = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a"}}, "spec": {"suspend": True}}
    assert holdup(suspended, []) == "its Job is suspended until Kueue admits it (queue team-a)"


def _event(job: str, message: str, reason: str = "FailedCreate", kind: str = "Job") -> dict[str, Any]:
    return {"involvedObject": {"kind": kind, "name": job}, "reason": reason, "message": message}


def test_a_refusal_is_timed_from_the_first_heard_and_says_the_newest_reason_in_the_clusters_words() -> None:
    now = [100.0]
    refusals = CreateRefusals(clock=lambda: now[0])
    refusals.heard(
        [
            _event("gpupool-job-1-1", "Error creating: pods is forbidden: exceeded quota: a"),
            _event("gpupool-job-1-1", "Error creating: x", reason="SuccessfulCreate"),
            _event("gpupool-job-2-1", "Error creating: x", kind="CronJob"),
        ]
    )
    assert refusals.of("gpupool-job-2-1") is None
    now[0] = 130.0
    refusals.heard([_event("gpupool-job-1-1", "Error creating: admission webhook denied the request")])
    refusal = refusals.of("gpupool-job-1-1")
    assert refusal is not None and refusal.seconds == 30.0
    assert refusal.message == "admission webhook denied the request"
    assert refusal.waiting(300) == (
        "the cluster refuses to create its pod: admission webhook denied the request (for 30 s; the run fails "
        "after 300 s of this)"
    )
    assert refusal.waiting(0).endswith("(for 30 s; it waits until its maximum runtime)")
    refusals.forget("gpupool-job-1-1")
    assert refusals.of("gpupool-job-1-1") is None
