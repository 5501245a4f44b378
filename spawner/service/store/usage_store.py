"""Long-term usage: the telemetry's per-minute aggregates, stored, and the GPU-hours reports built from them.

The sampler keeps ten minutes in memory; what an admin asks a month later ("who held GPUs without using
them?") needs the minutes kept. Each closed minute of each held device is one row, in the lease store's
database; a report sums them per user, profile and device into GPU-hours held against GPU-hours used.

Each minute is weighed by its holder's GPU-equivalents (:mod:`...pool.gpu_equivalents`), so a 1g.10gb slice of
an H100 held for an hour is 1/7 of a GPU-hour and a quarter share 0.25: the same figures as the dashboard and
``/metrics``.
Minutes nobody held are not stored: idle hardware is the dashboard's business, not a user's bill.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, Engine, Float, Integer, String, Table, func, insert, select

from ...telemetry.aggregates import MinuteAggregate
from .schema import Base

MINUTES = Table(
    "usage_minutes",
    Base.metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("minute", Float, nullable=False, index=True),
    Column("uuid", String(96), nullable=False),
    Column("node", String(253), nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("mig_profile", String(32)),
    Column("user", String(255), nullable=False, index=True),
    Column("profile", String(63), nullable=False),
    Column("lease_id", String(64), nullable=False),
    Column("weight", Float, nullable=False),  # the part of a GPU this device is
    Column("seconds_held", Float, nullable=False),
    Column("seconds_used", Float, nullable=False),
    Column("seconds_unknown", Float, nullable=False),
    Column("utilization_mean", Float),
)


@dataclass(frozen=True)
class UsageRow:
    """GPU-hours one user held and used on one profile over a report's span."""

    user: str
    profile: str
    gpu_hours_held: float
    gpu_hours_used: float
    gpu_hours_unknown: float  # held while utilisation could not be read: neither used nor idle

    @property
    def idle_share(self) -> float | None:
        """The part of the held hours known to be idle; None when nothing known was held."""
        known = self.gpu_hours_held - self.gpu_hours_unknown
        return None if known <= 0 else max(0.0, known - self.gpu_hours_used) / known


class UsageStore:
    """Stored minutes and reports over them; ``add`` is what ``Telemetry(on_minutes=…)`` calls."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(self, minutes: Iterable[MinuteAggregate]) -> None:
        """Store the held ones among ``minutes``."""
        rows: list[dict[str, Any]] = [
            {
                "minute": m.minute,
                "uuid": m.uuid,
                "node": m.node,
                "gpu_index": m.gpu_index,
                "mig_profile": m.mig_profile,
                "user": m.holder.user,
                "profile": m.holder.profile,
                "lease_id": m.holder.lease_id,
                "weight": m.holder.gpu_equivalents,
                "seconds_held": m.seconds_held,
                "seconds_used": m.seconds_used,
                "seconds_unknown": m.seconds_unknown,
                "utilization_mean": m.utilization_mean,
            }
            for m in minutes
            if m.holder is not None and m.seconds_held > 0
        ]
        if rows:
            with self.engine.begin() as connection:
                connection.execute(insert(MINUTES), rows)

    def report(self, since: float, until: float, user: str | None = None) -> list[UsageRow]:
        """GPU-hours held, used and unknown per user and profile for minutes starting in [since, until)."""
        hours = 3600.0
        held = func.sum(MINUTES.c.seconds_held * MINUTES.c.weight) / hours
        used = func.sum(MINUTES.c.seconds_used * MINUTES.c.weight) / hours
        unknown = func.sum(MINUTES.c.seconds_unknown * MINUTES.c.weight) / hours
        query = (
            select(MINUTES.c.user, MINUTES.c.profile, held, used, unknown)
            .where(MINUTES.c.minute >= since, MINUTES.c.minute < until)
            .group_by(MINUTES.c.user, MINUTES.c.profile)
            .order_by(MINUTES.c.user, MINUTES.c.profile)
        )
        if user is not None:
            query = query.where(MINUTES.c.user == user)
        with self.engine.connect() as connection:
            return [
                UsageRow(str(u), str(p), float(h or 0), float(s or 0), float(k or 0))
                for u, p, h, s, k in connection.execute(query)
            ]
