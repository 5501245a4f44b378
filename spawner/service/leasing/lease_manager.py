"""Leases: the only code that changes who holds which devices, kept in step with the store.

A change is written to the store before it is applied to the in-memory pool and queue (a placement is
undone if the write fails), so whatever happens in between, the store is right and the next start restores
from it. Restoring re-applies every granted lease at exactly its recorded devices and puts queued leases back
in their order; a lease whose devices the pool no longer has is released with reason "devices gone: …".

One manager owns a store at a time; its methods take a lock, so HTTP handlers on several threads may call it.
Quotas count queued leases as held (a queued lease is admitted later without its user's groups at hand), so
a new request is checked against them at once (:meth:`LeaseManager.quota_refusal`, which the form asks too).

Within a priority the queue is ordered by fair share: before each admission pass the manager takes a snapshot
of every user's GPU usage over the last ``usage_window`` seconds (granted leases, and those released inside
the window) and the queue sorts by it. Whoever waits for a lease to be granted later (the job manager) is
told through ``on_granted`` callbacks, called under the lock with the leases just granted: they must only
take note, never call back into the manager.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TypeVar

from ...pool import expected_start as estimate
from ...pool import gpu_equivalents
from ...pool.devices import Health, Node, decisive
from ...pool.explain import explain_refusal
from ...pool.fair_share import DEFAULT_WINDOW, UsageSpan, recent_usage
from ...pool.leases import Lease, LeaseState, NewLease, OwnerKind
from ...pool.policies import PlacementPolicy
from ...pool.queue import AdmissionQueue, QueuedRequest, competes
from ...pool.quotas import QuotaExceeded, QuotaPolicy
from ...pool.requests import Request
from ...pool.state import Allocation, OutsideUse, PoolState
from ...pool.trial import count_fits
from ..store.health_store import HealthStore
from ..store.lease_store import LeaseNotFound, LeaseStore
from .recorded import queue_entry, restore_leases

log = logging.getLogger(__name__)
T = TypeVar("T")


class NeverFits(ValueError):
    """A request that even an empty, healthy pool could not serve; queueing it would wait forever."""


class LeaseManager:
    """Grants, queues and releases leases over one pool, recording each change in ``store`` first;
    ``released_at_start`` holds the leases that restoring had to release, for the caller to report."""

    def __init__(
        self,
        nodes: Iterable[Node],
        store: LeaseStore,
        *,
        policy: str | PlacementPolicy = "gpupool",
        quotas: QuotaPolicy | None = None,
        clock: Callable[[], float] = time.time,
        usage_window: float = DEFAULT_WINDOW,
    ) -> None:
        self.store = store
        self.quotas = quotas
        # requests not granted at once, by why: "queued" (no room now), "quota", "never_fits" (for /metrics)
        self.refusals: collections.Counter[str] = collections.Counter()
        self.usage_window = usage_window
        self._clock = clock
        self._lock = threading.RLock()
        self._pool = PoolState(nodes, policy)
        self._queue = AdmissionQueue()
        self._granted_listeners: list[Callable[[list[Lease]], None]] = []
        self._health_marks: dict[tuple[str, int | None], dict[Health, str]] = {}
        self._held_because: str | None = None  # see hold_placements
        self.released_at_start = restore_leases(self.store, self._pool, self._queue, self._clock)
        self._restore_health_marks()
        self.admit()  # the pool may have grown while the service was down

    @property
    def pool(self) -> PoolState:
        """The live allocations, for reading; change them only through this manager."""
        return self._pool

    # ---- asking and giving back -------------------------------------------------------------------------

    def request_lease(
        self,
        user: str,
        groups: Iterable[str],
        owner_kind: OwnerKind,
        owner_name: str,
        profile_slug: str,
        request: Request,
        priority: int = 0,
        *,
        arrival: float | None = None,
        lease_id: str | None = None,
    ) -> Lease:
        """A granted lease when devices are free and nobody competing waits ahead, else a queued one.

        ``arrival`` (default now) is the time the queue orders by: a job the pool put back in the queue keeps
        the place its first submission earned. ``lease_id`` picks the new lease's id (default: a random one).
        Raises :class:`~...pool.quotas.QuotaExceeded` or :class:`NeverFits`, and then stores nothing.
        """
        with self._lock:
            refusal = self.quota_refusal(user, groups, request)
            if refusal is not None:  # unless no quota would help: then say that instead
                reason, never = explain_refusal(self._pool.nodes, request)
                self.refusals["never_fits" if never else "quota"] += 1
                raise NeverFits(reason) if never else refusal
            at = self._clock() if arrival is None else arrival
            new = NewLease(owner_kind, user, owner_name, profile_slug, request, priority, at)
            if lease_id is not None:
                new = replace(new, id=lease_id)
            # Never slip past a competing request already waiting at this priority or above.
            blocked = self._held_because is not None or any(
                e.priority >= priority and competes(e.request.gpu, request.gpu) for e in self._queue.entries()
            )
            outcome = None if blocked else self._pool.place(request, new.id)
            if isinstance(outcome, Allocation):
                try:
                    return self.store.add_granted(new, outcome.node, outcome.grants)
                except BaseException:
                    self._pool.release(new.id)
                    raise
            if outcome is None:
                reason, never = explain_refusal(self._pool.nodes, request)
            else:
                reason, never = outcome.reason, outcome.never_fits
            if never:
                self.refusals["never_fits"] += 1
                raise NeverFits(reason)
            self.refusals["queued"] += 1
            lease = self.store.add_queued(new)
            self._queue.add(entry := queue_entry(lease))
            if entry.backfills:  # it may start now if it ends before those it would pass can start
                self.admit()
            return self._with_position(self.store.get(lease.id) or lease)

    def release(self, lease_id: str, reason: str = "released") -> Lease:
        """Give the lease's devices back and admit whoever waits for them; a second call changes nothing."""
        with self._lock:
            lease = self.get(lease_id)
            if lease.state is LeaseState.RELEASED:
                return lease
            released = self.store.mark_released(lease_id, reason, self._clock())
            if lease_id in self._queue:
                self._queue.remove(lease_id)
            self._pool.release(lease_id)
            self.admit()
            return released

    def admit(self) -> list[Lease]:
        """Grant queued leases that fit now, in queue order (see :mod:`...pool.queue`); return them."""
        granted: list[Lease] = []

        def try_place(entry: QueuedRequest) -> bool:
            outcome = self._pool.place(entry.request, entry.id)
            if not isinstance(outcome, Allocation):
                return False
            try:
                granted.append(self.store.mark_granted(entry.id, outcome.node, outcome.grants, self._clock()))
            except BaseException:
                self._pool.release(entry.id)
                raise
            return True

        def may_pass(entry: QueuedRequest, blocked: list[QueuedRequest]) -> bool:
            starts = (self.expected_start(b.id) for b in blocked)
            return estimate.ends_in_time(entry.request, starts, self._clock())

        with self._lock:
            if self._held_because is not None:
                return granted
            if len(self._queue) > 1:
                usage = self.recent_usage()
                self._queue.reorder(lambda user: usage.get(user, 0.0))
            self._queue.admit(try_place, may_pass)
            if granted:
                for listener in self._granted_listeners:
                    listener(granted)
        return granted

    def hold_placements(self, because: str | None) -> None:
        """While ``because`` is set, place nothing: new requests queue and their owners read why, queued ones
        stay queued, held devices stay held. A Kubernetes API server that stopped answering is such a time:
        a pod or Job placed then could be neither made nor seen. None places again, admitting what fits."""
        with self._lock:
            if because == self._held_because:
                return
            self._held_because = because
        if because is None:
            log.info("placing again")
            self.admit()
        else:
            log.warning("placing nothing new: %s", because)

    @property
    def placements_held(self) -> str | None:
        """Why nothing is placed now (see :meth:`hold_placements`); None while placing."""
        return self._held_because

    def on_granted(self, listener: Callable[[list[Lease]], None]) -> None:
        """Call ``listener`` with the leases each admission pass grants (see the module docstring)."""
        with self._lock:
            self._granted_listeners.append(listener)

    def recent_usage(self) -> dict[str, float]:
        """GPU-seconds per user over the last ``usage_window`` seconds: the fair-share snapshot."""
        with self._lock:
            now = self._clock()
            spans = [
                UsageSpan(
                    lease.user,
                    gpu_equivalents.of_grants(lease.devices),
                    lease.granted_at or now,
                    lease.released_at,
                )
                for lease in self.store.granted_since(now - self.usage_window)
            ]
            return recent_usage(spans, now, self.usage_window)

    def set_health(self, node: str, health: Health, gpu_index: int | None = None, reason: str = "") -> None:
        """Mark a node, or one GPU on it: UNHEALTHY (a fault) or DRAINED (an admin) adds that mark, HEALTHY
        clears every mark. Held devices stay held (their owners are told by whoever called); new placements
        avoid a marked device. KeyError names an unknown node or GPU, and then nothing changes.

        Faults and drains are kept apart, so undraining a device that failed meanwhile leaves it unhealthy:
        a device is UNHEALTHY while it has a fault mark, else DRAINED while drained, else HEALTHY."""
        with self._lock:
            marks = dict(self._health_marks.get((node, gpu_index), {}))
            if health is Health.HEALTHY:
                marks.clear()
            else:
                marks[health] = reason
            self._apply_marks(node, gpu_index, marks)

    def clear_health(self, node: str, health: Health, gpu_index: int | None = None) -> None:
        """Take one kind of mark (DRAINED or UNHEALTHY) off a node or GPU; placements resume once it has
        none left, and queued work is admitted then. KeyError names an unknown node or GPU."""
        with self._lock:
            marks = dict(self._health_marks.get((node, gpu_index), {}))
            marks.pop(health, None)
            self._apply_marks(node, gpu_index, marks)

    def set_outside_use(self, node: str, use: OutsideUse) -> str | None:
        """Devices on ``node`` that work outside gpupool holds (other pods on a cluster), replacing what was
        said before; what could not be held because it is not free (None when all was). Not stored: only
        the backend knows it, and it tells again after a restart. Queued work is admitted if room was freed.
        KeyError names an unknown node."""
        with self._lock:
            missing = self._pool.hold_outside(node, use)
            self.admit()
            return missing

    def health_marks(self) -> dict[tuple[str, int | None], dict[Health, str]]:
        """(node, GPU index or None for the whole node) -> its marks and their reasons."""
        with self._lock:
            return {key: dict(marks) for key, marks in self._health_marks.items()}

    def health_of(self, node: str, gpu_index: int | None = None) -> Health:
        """What the marks of a node, or of one GPU on it, make it (not counting its node's marks)."""
        with self._lock:
            return decisive(self._health_marks.get((node, gpu_index), {}))

    def leases_on(self, node: str, gpu_index: int | None = None) -> list[Lease]:
        """The granted leases holding devices on ``node`` (on its GPU ``gpu_index``, when given)."""
        with self._lock:
            gpus = self._pool.node(node).gpus  # KeyError for an unknown node
            uuid = None
            if gpu_index is not None:
                uuid = next((g.uuid for g in gpus if g.index == gpu_index), None)
                if uuid is None:
                    raise KeyError(f"node {node} has no GPU {gpu_index}")
            return [
                lease
                for lease in self.all_leases(active_only=True)
                if lease.state is LeaseState.GRANTED
                and lease.node == node
                and (uuid is None or any(g.gpu_uuid == uuid for g in lease.devices))
            ]

    def _restore_health_marks(self) -> None:
        """Take the stored drains and faults out of the pool before the first admission after a restart: a
        trial's queued job started on a GPU still marked failed. What the marks do to running work is the
        health keeper's, later (``HealthKeeper.restore``); a mark on a device the pool lacks waits for it."""
        for mark in HealthStore(self.store.engine).all():
            with contextlib.suppress(KeyError):  # a mark is never HEALTHY, so this admits nothing yet
                self.set_health(mark.node, mark.health, mark.gpu_index, mark.reason)

    def _apply_marks(self, node: str, gpu_index: int | None, marks: dict[Health, str]) -> None:
        health = decisive(marks)
        self._pool.set_health(node, health, gpu_index)  # KeyError before anything is recorded
        if marks:
            self._health_marks[(node, gpu_index)] = marks
        else:
            self._health_marks.pop((node, gpu_index), None)
        if health is Health.HEALTHY:
            self.admit()

    # ---- reading ----------------------------------------------------------------------------------------

    def get(self, lease_id: str) -> Lease:
        with self._lock:
            lease = self.store.get(lease_id)
            if lease is None:
                raise LeaseNotFound(f"no lease {lease_id!r}")
            return self._with_position(lease)

    def leases_for(self, user: str, *, active_only: bool = False) -> list[Lease]:
        """A user's leases, oldest first."""
        with self._lock:
            return [
                self._with_position(lease)
                for lease in self.store.list_for_user(user, active_only=active_only)
            ]

    def all_leases(self, *, active_only: bool = False) -> list[Lease]:
        """Every user's leases, oldest first: what an administrator reads."""
        with self._lock:
            return [self._with_position(lease) for lease in self.store.list_all(active_only=active_only)]

    def inspect(self, read: Callable[[PoolState], T]) -> T:
        """``read(pool)`` with no lease changing meanwhile, for a consistent picture (the inventory)."""
        with self._lock:
            return read(self._pool)

    def quota_refusal(self, user: str, groups: Iterable[str], request: Request) -> QuotaExceeded | None:
        """The limit of ``user``'s quota that ``request`` would break on top of all they hold, or None."""
        with self._lock:
            held = [lease.request for lease in self.store.list_for_user(user, active_only=True)]
            return None if self.quotas is None else self.quotas.check(user, groups, request, held)

    def availability(self, asks: Mapping[str, Request], limit: int = 64) -> dict[str, tuple[int, int]]:
        """Per key of ``asks`` (a profile's slug): how many of its request could start now (at most ``limit``;
        trial owners placed by the real policy under the lock, then given back) and how many leases of that
        profile are queued. While anyone competing waits, a new request would queue behind them: 0."""
        with self._lock:
            queued: dict[str, int] = {}
            for lease in self.store.active():
                if lease.state is LeaseState.QUEUED:
                    queued[lease.profile] = queued.get(lease.profile, 0) + 1
            waiting = [e.request.gpu for e in self._queue.entries()]
            counts, held = {}, self._held_because is not None
            for key, request in asks.items():
                blocked = held or any(competes(need, request.gpu) for need in waiting)
                counts[key] = (0 if blocked else count_fits(self._pool, request, limit), queued.get(key, 0))
            return counts

    def position(self, lease_id: str) -> int | None:
        """Place in the whole queue (0 is next), or None when the lease is not queued."""
        with self._lock:
            if lease_id in self._queue:
                return self._queue.position(lease_id)
            self.get(lease_id)  # an unknown id is an error, not "not queued"
            return None

    def waiting_message(self, lease_id: str) -> str | None:
        """What a waiting user reads; None when not queued (see :meth:`waiting`)."""
        return (self.waiting(lease_id) or (None, None))[0]

    def waiting(self, lease_id: str) -> tuple[str, float | None] | None:
        """A queued lease's message (``Waiting for a free H100-80GB: 2 ahead of you; expected to start by 14:05
        UTC (in about 12 min)``) and its expected start, worked out once for both; None when not queued."""
        with self._lock:
            if lease_id not in self._queue:
                self.get(lease_id)
                return None
            said = self._queue.waiting_message(lease_id, self._queue.get(lease_id).description)
            if self._held_because is not None:  # no estimate holds while nothing is placed
                return f"{said}; {self._held_because}", None
            start = self.expected_start(lease_id)
            return f"{said}; {estimate.in_words(start, self._clock(), estimate.time_of_day)}", start

    def expected_start(self, lease_id: str) -> float | None:
        """When a queued lease can expect to start (:mod:`...pool.expected_start`); None if not queued or unknown."""
        with self._lock:
            if lease_id not in self._queue:
                return None
            ahead = [entry.request for entry in self._queue.ahead_of(lease_id)]
            return self._estimate(self._queue.get(lease_id).request, ahead)

    def expected_start_of_new(self, request: Request) -> float | None:
        """When ``request``, asked now, could expect to start behind every competing entry already queued."""
        with self._lock:
            ahead = [e.request for e in self._queue.entries() if competes(e.request.gpu, request.gpu)]
            return self._estimate(request, ahead)

    def _estimate(self, request: Request, ahead: list[Request]) -> float | None:
        """The queue played forward: what of ``request``'s kind is free now, then the holders' time limits;
        None while placements are held (see :meth:`hold_placements`)."""
        if self._held_because is not None:
            return None
        unit = estimate.unit_of(request)
        free = 0.0 if unit is None else count_fits(self._pool, unit, 64) * estimate.amount(unit.gpu)
        held = estimate.returning_holders(self.store.active(), self._pool.comes_back)
        return estimate.expected_start(request, ahead, held, self._clock(), competes, free)

    def _with_position(self, lease: Lease) -> Lease:
        return replace(lease, position=self._queue.position(lease.id)) if lease.id in self._queue else lease
