"""What a lease's server or job uses of the CPU and memory its profile gives, read from its control group.

GPUs are half of what a profile holds; the other half is CPU and memory (:mod:`gpupool.spawner.limits` makes
each server and job a cgroup with those limits). A researcher whose training is starved by a 4-core profile,
or who holds 128 GiB to use 3, sees it in ``GpuMonitor``; an admin sees it on the dashboard. CPU use is a rate:
the CPU time the group used between two readings of the same lease, so the first reading has none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from ...limits import HostCgroups
from ...pool.leases import Lease

LimitsBy = Literal["cgroup", "kubernetes", "none"]  # what holds a server or job to its limits
STALE_S = 300.0  # an older reading says nothing about the CPU use now
MIN_SPAN_S = 1.0  # readings closer together than this give the previous rate: too short a span is noise


@dataclass(frozen=True)
class HostUse:
    """One lease's CPU (cores) and memory (MiB): its limits, what holds it to them (``cgroup``, ``kubernetes``
    or ``none``), and what it used when read; None when unknown."""

    limits_by: LimitsBy
    cpu_limit: float
    memory_limit_mib: int
    cpu_used: float | None = None
    memory_used_mib: float | None = None

    @classmethod
    def limits_of(cls, lease: Lease, limits_by: LimitsBy) -> HostUse:
        """``lease``'s limits, its use not (yet) known."""
        return cls(limits_by, lease.request.cpu_milli / 1000, lease.request.memory_mib)


class HostUsage:
    """Reads the cgroups of leases' servers and jobs, remembering each one's last CPU reading for the rate."""

    def __init__(self, host: HostCgroups, clock: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        self.clock = clock
        self._last: dict[str, tuple[float, float, float | None]] = {}  # group -> (when, CPU seconds, rate)

    def of(self, lease: Lease, group_name: str | None) -> HostUse:
        """``lease``'s use, its server's or job's group being ``group_name`` (None: it has no running one)."""
        limits = HostUse.limits_of(lease, "cgroup" if self.host.enforced else "none")
        group = self.host.group(group_name) if group_name else None
        if group is None:
            return limits
        used = group.memory_used()
        return replace(
            limits,
            cpu_used=self._rate(group_name or "", group.cpu_seconds()),
            memory_used_mib=None if used is None else used / 1024**2,
        )

    def _rate(self, name: str, seconds: float | None) -> float | None:
        if seconds is None:
            return None
        now = self.clock()
        for old in [n for n, (when, *_) in self._last.items() if now - when > STALE_S]:  # ended runs
            del self._last[old]
        before = self._last.get(name)
        if before is not None and 0 <= now - before[0] < MIN_SPAN_S:  # the dashboard and a monitor at once
            return before[2]
        rate = None
        if before is not None and now > before[0] and seconds >= before[1]:
            rate = (seconds - before[1]) / (now - before[0])
        self._last[name] = (now, seconds, rate)
        return rate
