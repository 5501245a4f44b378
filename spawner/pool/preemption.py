"""Preemption: making room for a user who has waited too long for an interactive server.

A batch job that checkpoints loses at most one interval when it is stopped and requeued, while a researcher
waiting at the progress page loses the afternoon. So when a server has waited ``after`` seconds, the pool
stops one running job whose devices would serve it, of a preemptible priority class, youngest first (it has
the least work since its start to lose), and requeues it with its checkpoint folder. Never a server; one
preemption at a time, so a second job is stopped only if the first did not make room. The waiting server
was let into the queue by its quota, so preempting for it never lets anyone past a quota.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .queue import competes
from .requests import GpuNeed

PREEMPTED = "preempted"  # how a preemption's reason begins: what the job's history and retries go by


@dataclass(frozen=True)
class WaitingServer:
    """A server's queued lease: who waits, for what, since when."""

    lease_id: str
    user: str
    need: GpuNeed | None
    waiting_since: float
    description: str = ""


@dataclass(frozen=True)
class RunningJob:
    """A running job as preemption sees it: what its lease holds, its class, since when it runs."""

    job_id: str
    user: str
    need: GpuNeed | None
    priority_class: str
    started_at: float
    stopping: bool = False  # a stop (cancel, limit, fault, preemption) is under way


@dataclass(frozen=True)
class Preemption:
    """Stop ``job`` to make room for ``server``; ``reason`` is the job's history line."""

    job: RunningJob
    server: WaitingServer
    reason: str


def choose(
    waiting: Iterable[WaitingServer],
    running: Iterable[RunningJob],
    *,
    now: float,
    after: float,
    preemptible: frozenset[str],
) -> Preemption | None:
    """The one preemption to make now for the longest-waiting server past ``after``; None when no server has
    waited that long, no running job of a ``preemptible`` class holds what it needs, or a job is already
    stopping (its devices may be what the server needs)."""
    jobs = list(running)
    if any(job.stopping for job in jobs):
        return None
    for server in sorted(waiting, key=lambda s: s.waiting_since):
        waited = now - server.waiting_since
        if server.need is None or waited < after:
            continue
        candidates = [j for j in jobs if j.priority_class in preemptible and competes(j.need, server.need)]
        if candidates:
            job = max(candidates, key=lambda j: j.started_at)
            what = server.description or "its devices"
            reason = (
                f"{PREEMPTED}: {server.user}'s server had waited {waited / 60:.0f} min for {what}; "
                "requeued with its checkpoint folder"
            )
            return Preemption(job, server, reason)
    return None


def is_preemption(reason: str) -> bool:
    """Whether a stop's reason is a preemption (which uses none of the job's retries)."""
    return reason.startswith(PREEMPTED)
