"""The job state machine, priority classes and fair share: pure domain, no processes, no clock."""

from __future__ import annotations

import pytest

from gpupool.spawner.pool.fair_share import UsageSpan, recent_usage
from gpupool.spawner.pool.job_states import (
    InvalidTransition,
    Job,
    JobState,
    StopRequest,
    UnknownPriorityClass,
    priority_of,
)


def job(retries: int = 1) -> Job:
    return Job(
        "j1",
        "alice",
        "train",
        "h100",
        ("python", "train.py"),
        "/home/alice",
        {},
        "batch",
        retries,
        None,
        10.0,
    )


def test_a_job_runs_and_succeeds_with_every_transition_timed_and_explained() -> None:
    done = job().to(JobState.RUNNING, 11.0, "attempt 1 started").to(JobState.SUCCEEDED, 20.0, "exit 0")
    assert [(t.state, t.at, t.reason) for t in done.history] == [
        (JobState.QUEUED, 10.0, "submitted"),
        (JobState.RUNNING, 11.0, "attempt 1 started"),
        (JobState.SUCCEEDED, 20.0, "exit 0"),
    ]
    assert done.state.finished and done.finished_at == 20.0 and done.reason == "exit 0"


@pytest.mark.parametrize("end", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT])
def test_a_finished_job_never_changes_state_again(end: JobState) -> None:
    finished = job().to(JobState.RUNNING, 11.0, "started").to(end, 12.0, "ended")
    for state in JobState:
        with pytest.raises(InvalidTransition, match=f"is {end}"):
            finished.to(state, 13.0, "again")


def test_a_queued_job_cannot_finish_as_if_it_had_run() -> None:
    for state in (JobState.SUCCEEDED, JobState.TIMED_OUT, JobState.REQUEUED):
        with pytest.raises(InvalidTransition):
            job().to(state, 11.0, "never ran")


def test_a_job_the_pool_stops_is_requeued_until_its_retries_are_used() -> None:
    running = job(retries=1).to(JobState.RUNNING, 11.0, "attempt 1")
    assert running.may_requeue
    again = running.to(JobState.REQUEUED, 12.0, "GPU 0 failed").to(JobState.RUNNING, 13.0, "attempt 2")
    assert again.requeues == 1 and not again.may_requeue


def test_a_stop_belongs_to_the_run_it_stopped_and_never_carries_into_the_next() -> None:
    running = job().to(JobState.RUNNING, 11.0, "attempt 1")
    stopping = running.with_stop(StopRequest(JobState.REQUEUED, "GPU 0 failed", 12.0, 14.0))
    again = stopping.to(JobState.REQUEUED, 13.0, "GPU 0 failed").to(JobState.RUNNING, 14.0, "attempt 2")
    assert again.stop is None


def test_a_clock_that_steps_back_never_reorders_the_history() -> None:
    moved = job().to(JobState.RUNNING, 5.0, "started")
    assert [t.at for t in moved.history] == [10.0, 10.0]


def test_a_cancel_overrides_a_pending_requeue_but_a_fault_never_overrides_a_cancel() -> None:
    running = job().to(JobState.RUNNING, 11.0, "started")
    requeue = running.with_stop(StopRequest(JobState.REQUEUED, "fault", 12.0, 14.0))
    cancel = requeue.with_stop(StopRequest(JobState.CANCELLED, "cancelled", 13.0, 15.0))
    assert cancel.stop is not None and cancel.stop.then is JobState.CANCELLED
    assert cancel.stop.kill_at == 14.0  # the grace period already running is not restarted
    assert cancel.with_stop(StopRequest(JobState.REQUEUED, "fault", 13.5, 15.5)).stop == cancel.stop
    assert cancel.to(JobState.CANCELLED, 14.0, "cancelled").stop is None


def test_interactive_servers_rank_above_batch_jobs_and_unknown_classes_name_the_valid_ones() -> None:
    assert priority_of("interactive") > priority_of("batch") > priority_of("low")
    assert priority_of("interactive") == 0  # what a server lease asks with
    with pytest.raises(UnknownPriorityClass, match="interactive, batch, low"):
        priority_of("urgent")


# ---- fair share ----------------------------------------------------------------------------------------


def test_recent_usage_counts_gpu_seconds_inside_the_window_only() -> None:
    spans = [
        UsageSpan("alice", 2.0, 0.0, 50.0),  # half inside the window [25, 100]
        UsageSpan("alice", 1.0, 90.0, None),  # still held: counted up to now
        UsageSpan("bob", 0.25, 0.0, 10.0),  # before the window
    ]
    assert recent_usage(spans, now=100.0, window=75.0) == {"alice": 2.0 * 25 + 10.0}
