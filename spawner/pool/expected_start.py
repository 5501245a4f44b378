"""When a waiting request can expect to start: from the leases that hold what it waits for and how long each
said it would hold it.

A lease's expected end is its grant time plus ``Request.seconds`` (a user's wall-time, a job's maximum
runtime, else the profile's lifetime limit). A waiting request needs, in order, what the competing requests
ahead of it take and then its own amount; the devices come back as the holders' expected ends pass. So the
estimate is the first expected end at which the competing holders have given back that much. It is an
estimate: leases often end early (which only makes it sooner), and fragmentation over nodes is ignored. A
holder that gave no time makes every start that depends on it unknown (None), never a guess.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .devices import FULL_MILLI
from .requests import GpuNeed, GpuShare, MigSlice, Request, WholeGpus


@dataclass(frozen=True)
class Holder:
    """A granted lease as the estimate sees it: what it holds and when it was granted."""

    request: Request
    granted_at: float

    @property
    def expected_end(self) -> float | None:
        seconds = self.request.seconds
        return None if seconds is None else self.granted_at + seconds


def amount(need: GpuNeed | None) -> float:
    """How much of its kind a need takes: whole GPUs, MIG instances, or a GPU's fraction."""
    if isinstance(need, WholeGpus):
        return need.count
    if isinstance(need, MigSlice):
        return 1
    if isinstance(need, GpuShare):
        return need.milli / FULL_MILLI
    return 0


def expected_start(
    waiting: Request,
    ahead: Sequence[Request],
    holders: Iterable[Holder],
    now: float,
    competes: Callable[[GpuNeed | None, GpuNeed | None], bool],
) -> float | None:
    """When ``waiting`` can expect to start behind ``ahead`` (the competing requests queued before it), given
    the granted ``holders``; None when it waits on a holder that gave no time, or for something no holder
    holds (a CPU-only request, or devices that are out of the pool)."""
    if waiting.gpu is None:
        return None
    needed = sum(amount(r.gpu) for r in ahead) + amount(waiting.gpu)
    ends = sorted(
        ((h.expected_end, amount(h.request.gpu)) for h in holders if competes(h.request.gpu, waiting.gpu)),
        key=lambda row: float("inf") if row[0] is None else row[0],
    )
    freed = 0.0
    for end, given_back in ends:
        if end is None:
            return None
        freed += given_back
        if freed >= needed - 1e-9:
            return max(end, now)
    return None


def time_of_day(at: float) -> str:
    """``14:05 UTC``: the host's time of day, with its zone named."""
    return time.strftime("%H:%M %Z", time.localtime(at))


def in_words(start: float | None, now: float, clock: Callable[[float], str]) -> str:
    """``expected to start by 14:05 (in about 12 min)``; ``no expected start yet`` when unknown. ``clock``
    renders a time of day (the caller's time zone)."""
    if start is None:
        return "no expected start yet (what holds it set no time limit)"
    minutes = max(0.0, start - now) / 60
    if minutes < 1:
        return f"expected to start by {clock(start)} (within a minute)"
    span = f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"
    return f"expected to start by {clock(start)} (in about {span})"
