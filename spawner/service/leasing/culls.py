"""What the idle culler tells the service: the cull warnings it gave, and the culls it made.

Warnings live in memory: a restarted service forgets them, so the culler's hook warns again and the cull
comes one warning period later, the safe direction. A warning whose lease has been released is dropped when
read. Culls are kept in the store (:mod:`..store.cull_store`); their counts by limit feed
``gpupool_culls_total{limit=…}`` on the metrics page, starting from the stored ones.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Literal, get_args

from ...pool.leases import LeaseState
from ..store.cull_store import CullRecord, CullStore
from ..store.lease_store import LeaseNotFound
from .lease_manager import LeaseManager

CullLimit = Literal["idle_timeout", "gpu_idle_timeout", "max_lifetime"]  # the profile limits a cull reaches
CULL_LIMITS: tuple[str, ...] = get_args(CullLimit)


@dataclass(frozen=True)
class CullWarning:
    user: str
    server: str
    lease_id: str | None
    cull_at: float
    reason: str
    warned_at: float


class Culls:
    """Pending cull warnings by (user, server), one per server (the newest wins), and the culls made by limit."""

    def __init__(
        self, manager: LeaseManager, store: CullStore | None = None, *, keep_after_cull: float = 600.0
    ) -> None:
        self.manager = manager
        self.store = store
        self.keep_after_cull = keep_after_cull
        self._warnings: dict[tuple[str, str], CullWarning] = {}
        # culls made, by the limit reached: every one kept, so a restart does not reset the metric
        self.counts: collections.Counter[str] = store.counts() if store is not None else collections.Counter()

    def record(self, cull: CullRecord) -> None:
        """A cull the culler is ordering now: kept when there is a store, and counted, once per lease."""
        if self.store is None or self.store.add(cull):
            self.counts[cull.limit] += 1

    def since(self, start: float, user: str | None = None, limit: int = 500) -> list[CullRecord]:
        """The culls kept from ``start`` on, newest first, at most ``limit`` (none without a store)."""
        return self.store.since(start, user, limit) if self.store is not None else []

    def of_lease(self, lease_id: str) -> CullRecord | None:
        """The cull kept for ``lease_id``'s server, if any (none without a store)."""
        return self.store.of_lease(lease_id) if self.store is not None else None

    def put(self, warning: CullWarning) -> None:
        self._warnings[(warning.user, warning.server)] = warning

    def get(self, user: str, server: str) -> CullWarning | None:
        return self._warnings.get((user, server))

    def withdraw(self, user: str, server: str) -> bool:
        return self._warnings.pop((user, server), None) is not None

    def pending(self, now: float, user: str | None = None) -> list[CullWarning]:
        """The warnings still in force (their lease active, or none named and not long past), oldest first."""
        for key, warning in list(self._warnings.items()):
            if self._ended(warning, now):
                del self._warnings[key]
        found = [w for w in self._warnings.values() if user is None or w.user == user]
        return sorted(found, key=lambda w: w.warned_at)

    def _ended(self, warning: CullWarning, now: float) -> bool:
        if warning.lease_id is None:
            return now > warning.cull_at + self.keep_after_cull
        try:
            return self.manager.get(warning.lease_id).state is LeaseState.RELEASED
        except LeaseNotFound:
            return True
