"""When a waiting request can expect to start: from the leases that hold what it waits for and how long each
said it would hold it.

A lease's expected end is its grant time plus ``Request.seconds`` (a user's wall-time, a job's maximum
runtime, else the profile's lifetime limit). The estimate plays the queue forward: what is free now, then
the holders' devices as their expected ends pass, go to the competing requests ahead in order, each giving
its devices back after its own time limit, until the waiting one's turn. It is an estimate: leases often end
early (which only makes it sooner), and fragmentation over nodes is ignored. Anything with no time limit
that the answer depends on makes it unknown (None), never a guess.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from .devices import FULL_MILLI
from .leases import Lease
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


def returning_holders(
    leases: Iterable[Lease], comes_back: Callable[[str | None, Iterable[str]], bool]
) -> list[Holder]:
    """The granted ``leases`` as holders, less those whose devices never return to the pool when released:
    on a node or GPU drained or failed (``comes_back(node, gpu_uuids)`` False), however soon they end."""
    return [
        Holder(lease.request, lease.granted_at)
        for lease in leases
        if lease.granted_at is not None and comes_back(lease.node, [d.gpu_uuid for d in lease.devices])
    ]


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
    free: float = 0.0,
) -> float | None:
    """When ``waiting`` can expect to start behind ``ahead`` (the competing requests queued before it, in
    order), given the granted ``holders`` and ``free``, what of its kind is free now (see :func:`unit_of`).

    Each request, in order, starts once enough has come back, and gives its amount back ``seconds`` later:
    the queue played forward on the time limits. None when that waits on something with no time limit, or
    for more than the pool holds (a CPU-only request, or devices that are out of the pool)."""
    if waiting.gpu is None:
        return None
    returns = [
        (_end(h.expected_end), amount(h.request.gpu)) for h in holders if competes(h.request.gpu, waiting.gpu)
    ]
    heapq.heapify(returns)
    clock, available = now, free
    for request in (*ahead, waiting):
        need = amount(request.gpu)
        while available < need - 1e-9:
            if not returns or returns[0][0] == math.inf:
                return None
            end, given_back = heapq.heappop(returns)
            clock, available = max(clock, end), available + given_back
        available -= need
        heapq.heappush(returns, (_end(None if request.seconds is None else clock + request.seconds), need))
    return clock


def _end(at: float | None) -> float:
    return math.inf if at is None else at


def unit_of(request: Request) -> Request | None:
    """One unit of ``request``'s kind (one such GPU, one such MIG instance, or its share) and nothing else:
    what the caller counts free places for, to give :func:`expected_start` its ``free``."""
    need = request.gpu
    if isinstance(need, WholeGpus):
        return Request(0, 0, replace(need, count=1))
    return None if need is None else Request(0, 0, need)


def ends_in_time(request: Request, starts: Iterable[float | None], now: float) -> bool:
    """Backfill's test: ``request`` (which says how long it holds) started ``now`` ends by each of ``starts``,
    the expected starts of the waiting requests it would pass; an unknown start is never passed."""
    if request.seconds is None:
        return False
    return all(start is not None and now + request.seconds <= start for start in starts)


NO_EXPECTED_START = "no expected start yet (what it waits for has no time limit, or is drained or failed)"


def time_of_day(at: float) -> str:
    """``14:05 UTC``: the host's time of day, with its zone named."""
    return time.strftime("%H:%M %Z", time.localtime(at))


def in_words(start: float | None, now: float, clock: Callable[[float], str]) -> str:
    """``expected to start by 14:05 (in about 12 min)``; ``no expected start yet`` when unknown. ``clock``
    renders a time of day (the caller's time zone)."""
    if start is None:
        return NO_EXPECTED_START
    return f"expected to start by {time_and_span(start, now, clock)}"


def time_and_span(start: float, now: float, clock: Callable[[float], str]) -> str:
    """``14:05 UTC (in about 12 min)``: a time of day with how far off it is, which tells today's from
    tomorrow's."""
    minutes = max(0.0, start - now) / 60
    if minutes < 1:
        return f"{clock(start)} (within a minute)"
    hours = minutes / 60
    if minutes < 90:
        span = f"{minutes:.0f} min"
    elif round(hours, 1) < 24:  # 23.96 h is "1 day", not "24 h"
        span = f"{_tenths(hours)} h"
    else:
        days = _tenths(hours / 24)
        span = f"{days} day" if days == "1" else f"{days} days"
    return f"{clock(start)} (in about {span})"


def _tenths(amount: float) -> str:
    """``11.9``, but ``12`` rather than ``12.0``: a trial read "in about 12.0 h" as oddly exact."""
    return f"{amount:.1f}".removesuffix(".0")
