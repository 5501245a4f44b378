"""The telemetry loop: sample the backend every few seconds, keep recent samples and per-minute aggregates.

The service owns the loop (the domain keeps no clock); a sampler's blocking reads (NVML, ``/proc``) run in a
worker thread so the API stays responsive, and the results are recorded on the event loop, where the API
reads them. A failing pass is logged and the loop goes on: telemetry must never take the service down.

``GPUPOOL_SAMPLE_SECONDS`` sets the interval (default 2; 0 turns sampling off).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Protocol

from ...backends.simulated_telemetry import PidsOf, SimulatedSampler
from ...pool import gpu_equivalents
from ...pool.devices import Node
from ...pool.leases import LeaseState
from ...telemetry.activity import DEFAULT_THRESHOLD_PERCENT
from ...telemetry.aggregates import Holder, MinuteAggregate, MinuteAggregator
from ...telemetry.history import DEFAULT_INTERVAL_SECONDS, DEFAULT_WINDOW_SECONDS, SampleHistory
from ...telemetry.samples import Snapshot
from ..leasing.lease_manager import LeaseManager

log = logging.getLogger(__name__)

MINUTES_KEPT = 100_000  # closed per-minute aggregates kept in memory until a store takes them


class Sampler(Protocol):
    """What every backend's sampler offers (:class:`~...backends.nvml_telemetry.NvmlSampler`,
    :class:`~...backends.simulated_telemetry.SimulatedSampler`)."""

    simulated: bool
    backend: str

    def open(self) -> None: ...

    def sample(self, at: float) -> Snapshot: ...

    def close(self) -> None: ...


def make_sampler(
    backend: str, nodes: Iterable[Node], *, nvml: ModuleType | None = None, pids_of: PidsOf | None = None
) -> Sampler:
    """The sampler for the pool's backend: NVML on this host for "nvml", the cluster's dcgm-exporter for
    "kubernetes" (connected to the leases and pods by the assembly), simulated otherwise."""
    if backend == "kubernetes":
        from ..kube_pool import KubeSampler  # only a cluster needs kubernetes_asyncio

        return KubeSampler(list(nodes))
    if backend == "nvml":
        from ...backends.nvml_telemetry import NvmlSampler  # only a GPU host needs pynvml loaded

        names = [n.name for n in nodes]
        return NvmlSampler(names[0] if names else None, nvml=nvml)
    return SimulatedSampler(nodes, pids_of)


class Telemetry:
    """Recent samples and per-minute aggregates of ``manager``'s pool, fed by :meth:`run` (or by
    :meth:`record`, in tests and benchmarks). ``on_minutes`` receives each batch of closed minutes, for a
    store to keep; they are also kept in ``minutes`` (the newest ``MINUTES_KEPT``)."""

    def __init__(
        self,
        manager: LeaseManager,
        sampler: Sampler,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        window: float = DEFAULT_WINDOW_SECONDS,
        idle_threshold: float = DEFAULT_THRESHOLD_PERCENT,
        on_minutes: Callable[[list[MinuteAggregate]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.manager = manager
        self.sampler = sampler
        self.interval = interval
        self.history = SampleHistory(window, interval or DEFAULT_INTERVAL_SECONDS)
        # "used" is what the activity tracker calls busy: above the idle threshold (an admin trial saw a GPU at
        # 6% listed as held but idle on the admin page, and counted used in its usage)
        self.aggregator = MinuteAggregator(idle_threshold=idle_threshold, max_gap=max(10.0, 3 * interval))
        self.minutes: deque[MinuteAggregate] = deque(maxlen=MINUTES_KEPT)
        self.on_minutes = on_minutes
        self.clock = clock
        self.passes = 0
        self.failures = 0
        self.running = False
        self._observers: list[Callable[[Snapshot], None]] = []

    def add_observer(self, observer: Callable[[Snapshot], None]) -> None:
        """Call ``observer`` with every snapshot recorded, on the event loop (the health checks); one that
        raises is logged and the others still run."""
        self._observers.append(observer)

    @property
    def simulated(self) -> bool:
        return self.sampler.simulated

    def holders(self) -> dict[str, list[Holder]]:
        """Device UUID -> who holds it through a granted lease (several for a shared GPU)."""
        held: dict[str, list[Holder]] = {}
        for lease in self.manager.all_leases(active_only=True):
            if lease.state is LeaseState.GRANTED:
                for grant in lease.devices:
                    holder = Holder(lease.user, lease.profile, lease.id, gpu_equivalents.of_grant(grant))
                    held.setdefault(grant.uuid, []).append(holder)
        return held

    def record(self, snapshot: Snapshot) -> list[MinuteAggregate]:
        """Keep a snapshot: into the ring buffers, and into the minute aggregates with who held each device."""
        self.history.add(snapshot)
        held = self.holders()
        closed: list[MinuteAggregate] = []
        for sample in snapshot.samples:
            closed.extend(self.aggregator.add(sample, held.get(sample.uuid, ())))
        self._keep(closed)
        for observer in self._observers:
            try:
                observer(snapshot)
            except Exception:
                log.exception("telemetry observer %r failed", observer)
        return closed

    def close_minutes_of(self, user: str) -> None:
        """Keep now what ``user`` held in the minutes still open: their records are about to be filed away."""
        self._keep(self.aggregator.close_held_by(user))

    def _keep(self, closed: list[MinuteAggregate]) -> None:
        if closed:
            self.minutes.extend(closed)
            if self.on_minutes is not None:
                self.on_minutes(closed)

    async def sample_once(self) -> Snapshot:
        """One pass: the sampler's reads in a worker thread, the bookkeeping here on the event loop."""
        snapshot = await asyncio.to_thread(self.sampler.sample, self.clock())
        self.record(snapshot)
        self.passes += 1
        return snapshot

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled; close the sampler on the way out."""
        if self.interval <= 0:
            return
        self.running = True
        try:
            await asyncio.to_thread(self.sampler.open)
            loop = asyncio.get_running_loop()
            next_at = loop.time()
            while True:
                try:
                    await self.sample_once()
                except Exception:  # one bad pass (a GPU that fell off the bus) must not end telemetry
                    self.failures += 1
                    log.exception("telemetry pass failed; trying again in %.1f s", self.interval)
                next_at = max(next_at + self.interval, loop.time())  # no burst after a stall
                await asyncio.sleep(next_at - loop.time())
        finally:
            self._keep(self.aggregator.flush())
            self.running = False
            await asyncio.to_thread(self.sampler.close)
