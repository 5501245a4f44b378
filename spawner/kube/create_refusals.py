"""Jobs whose pods the cluster refuses to create, from the Job controller's ``FailedCreate`` events.

A ResourceQuota, a LimitRange or an admission webhook can refuse a Job's pod. The Job then shows nothing
(no pod, no condition); the Job controller records the refusal as an event and tries again, ever less often,
while gpupool's lease holds the GPUs for a command that never starts. :class:`CreateRefusals` keeps each
Job's newest refusal and how long it has been refused, so the job runner can say why and give the GPUs back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# What the job runner's events watch asks the API server for: only these events of Jobs, not every event.
FAILED_CREATE_SELECTOR = "involvedObject.kind=Job,reason=FailedCreate"
_PREFIX = "Error creating: "  # the Job controller's opening words, which say nothing a reader needs


@dataclass(frozen=True)
class Refusal:
    """The cluster's newest reason for not creating a Job's pod, and for how many seconds it has refused."""

    message: str
    seconds: float

    def waiting(self, patience_s: float) -> str:
        """What a job shows while it waits on this refusal; ``patience_s``: when its run fails (0: never)."""
        then = (
            f"the run fails after {patience_s:.0f} s of this"
            if patience_s > 0
            else "it waits until its maximum runtime"
        )
        return f"the cluster refuses to create its pod: {self.message} (for {self.seconds:.0f} s; {then})"

    def ended(self) -> str:
        """Why the run failed."""
        return f"the cluster refused to create its pod for {self.seconds:.0f} s: {self.message}"


class CreateRefusals:
    """Each Job's newest ``FailedCreate`` message, and when this process first heard one (``clock``: a
    monotonic clock, so a skewed cluster clock cannot shorten the wait)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._refused: dict[str, tuple[str, float]] = {}  # Job name -> (message, first heard)

    def heard(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Take in events (a watch's or a list's, oldest first); any but a Job's ``FailedCreate`` is ignored."""
        for event in events:
            involved = event.get("involvedObject") or {}
            if involved.get("kind") != "Job" or event.get("reason") != "FailedCreate":
                continue
            name = str(involved.get("name"))
            message = str(event.get("message") or "no reason given").removeprefix(_PREFIX)
            first = self._refused.get(name, (message, self._clock()))[1]
            self._refused[name] = (message, first)

    def of(self, job: str) -> Refusal | None:
        """The refusal of ``job``'s pods, if the cluster has refused one."""
        found = self._refused.get(job)
        return None if found is None else Refusal(found[0], self._clock() - found[1])

    def forget(self, job: str) -> None:
        """``job`` is done with: a later refusal of the same name starts afresh."""
        self._refused.pop(job, None)
