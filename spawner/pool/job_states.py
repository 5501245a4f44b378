"""Training jobs as the pool sees them: the job state machine and the priority classes. No I/O, no clock.

A job is one command run on the devices of one lease. Its states::

    queued ──▶ running ──▶ succeeded | failed | cancelled | timed-out
      │          │  ▲
      │          ▼  │
      │        requeued ──▶ failed | cancelled
      ▼
    failed | cancelled

``requeued`` is the pool's doing, never the user's code: a device or node under the run failed, so the run was
stopped and the job waits for a new lease, resuming from its checkpoint directory. A user's own non-zero exit
is ``failed``. Every change is a :class:`Transition` with its time and reason, kept in ``history``; times come
from the caller's clock (seconds), this module only orders them.

Priority classes rank whole classes of work: interactive servers (priority 0, what the hub's spawners ask
with) above batch jobs (-10) above low-priority jobs (-20). Within a class the queue orders by fair share
(see :mod:`.fair_share`), then arrival.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from .preemption import is_preemption


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    REQUEUED = "requeued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed-out"

    @property
    def finished(self) -> bool:
        """A state nothing leaves: the job holds no lease and runs no process."""
        return self in FINISHED

    @property
    def waiting(self) -> bool:
        """Waiting for a lease: what the cap on a user's queued jobs counts."""
        return self in (JobState.QUEUED, JobState.REQUEUED)


FINISHED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT})
_ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset(FINISHED | {JobState.REQUEUED}),
    JobState.REQUEUED: frozenset({JobState.RUNNING, JobState.FAILED, JobState.CANCELLED}),
}

PRIORITY_CLASSES: MappingProxyType[str, int] = MappingProxyType({"interactive": 0, "batch": -10, "low": -20})
DEFAULT_JOB_CLASS = "batch"
MAX_RETRIES = 20  # requeues after a fault one job may ask for
USER_JOB_CLASSES = frozenset({"batch", "low"})  # "interactive" is for servers, and jobs an admin submits


class InvalidTransition(ValueError):
    """A state change the job state machine does not allow; the message says from what to what."""


class UnknownPriorityClass(ValueError):
    """A priority class name that is not one of :data:`PRIORITY_CLASSES`."""


def priority_of(priority_class: str) -> int:
    """The queue priority of a class name; :class:`UnknownPriorityClass` names the valid ones."""
    try:
        return PRIORITY_CLASSES[priority_class]
    except KeyError:
        known = ", ".join(PRIORITY_CLASSES)
        raise UnknownPriorityClass(f"priority_class must be one of {known}, got {priority_class!r}") from None


NEVER_STARTED = "never started"
"""How the reason of a requeue begins when the run never began: the service stopped between recording the run
and starting it."""


DRAINED_BY = "drained by"
"""How the reason of a requeue begins when an admin drained the job's devices."""


def uses_no_retry(reason: str) -> bool:
    """Whether a requeue for ``reason`` leaves the job's retries alone: a preemption, an admin's drain, or a
    run that never started. None is the job's failure."""
    return is_preemption(reason) or reason.startswith((NEVER_STARTED, DRAINED_BY))


@dataclass(frozen=True)
class Transition:
    state: JobState
    at: float
    reason: str


@dataclass(frozen=True)
class StopRequest:
    """A stop the pool asked for and is carrying out: SIGTERM sent at ``term_at``, SIGKILL due at ``kill_at``;
    once the process group is gone the job moves to ``then`` (cancelled, timed-out, or requeued)."""

    then: JobState
    reason: str
    term_at: float
    kill_at: float
    killed: bool = False


@dataclass(frozen=True)
class Job:
    """One job as recorded. ``attempts`` counts runs started; ``pid``/``pid_start`` identify the current run's
    process group leader (its start time in clock ticks since boot, so a reused pid is never mistaken for it).
    """

    id: str
    user: str
    name: str
    profile: str
    command: tuple[str, ...]
    working_dir: str
    env: dict[str, str]
    priority_class: str
    retries: int
    max_runtime: float | None
    submitted_at: float
    state: JobState = JobState.QUEUED
    history: tuple[Transition, ...] = ()
    submission_id: str | None = None
    groups: frozenset[str] = frozenset()
    attempts: int = 0
    lease_id: str | None = None
    job_dir: str = ""  # log, exit statuses and checkpoints live here, inside the user's home
    pid: int | None = None
    pid_start: int | None = None
    started_at: float | None = None  # the current (or last) run's start
    finished_at: float | None = None
    exit_code: int | None = None
    stop: StopRequest | None = None

    def __post_init__(self) -> None:
        if not self.history:
            object.__setattr__(self, "history", (Transition(self.state, self.submitted_at, "submitted"),))

    @property
    def reason(self) -> str:
        """Why the job is in its state, as the last transition says."""
        return self.history[-1].reason

    @property
    def requeues(self) -> int:
        """Runs the pool ended and put back in the queue, less those that use no retry (:func:`uses_no_retry`)."""
        return sum(1 for t in self.history if t.state is JobState.REQUEUED and not uses_no_retry(t.reason))

    @property
    def may_requeue(self) -> bool:
        """Whether a run the pool ends now may go back to the queue (retries left)."""
        return self.requeues < self.retries

    def requeue_fails(self, reason: str) -> bool:
        """Whether a requeue for ``reason`` ends the job failed instead: it would spend a retry, and none is
        left."""
        return not self.may_requeue and not uses_no_retry(reason)

    def to(self, state: JobState, at: float, reason: str, **changes: Any) -> Job:
        """This job in ``state`` with the transition recorded; :class:`InvalidTransition` if not allowed."""
        if state not in _ALLOWED.get(self.state, frozenset()):
            raise InvalidTransition(f"job {self.id} is {self.state}; it cannot become {state} ({reason})")
        if at < self.history[-1].at:
            at = self.history[-1].at  # a clock that stepped back never reorders the history
        # A stop under way belongs to the run it stops: whatever state comes next, it is over.
        ended = {"stop": None} | ({"finished_at": at} if state.finished else {})
        return replace(
            self,
            state=state,
            history=(*self.history, Transition(state, at, reason)),
            **(ended | changes),
        )

    def with_stop(self, stop: StopRequest) -> Job:
        """This running job with a stop under way; the first stop asked for is the one carried out, except
        that a cancel overrides a pool's requeue (the user no longer wants the job)."""
        if self.state is not JobState.RUNNING:
            raise InvalidTransition(f"job {self.id} is {self.state}; only a running job is stopped")
        if self.stop is not None and not (
            stop.then is JobState.CANCELLED and self.stop.then is JobState.REQUEUED
        ):
            return self
        if self.stop is not None:
            stop = replace(
                stop, term_at=self.stop.term_at, kill_at=self.stop.kill_at, killed=self.stop.killed
            )
        return replace(self, stop=stop)
