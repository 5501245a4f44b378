"""The culls the idle culler made, kept: who, when, which limit and why.

The culler's hook reports each cull as it stops a server (``POST culls``). Counting them was all the service did,
in memory; an admin asking "whose servers were culled last week, and for what?" found the answer only in the
hub's log. Each cull is now a row beside the leases, read by ``GET culls`` and the admin dashboard, and the
counts on the metrics page start from them, so a restart does not reset ``gpupool_culls_total``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from sqlalchemy import Column, Engine, Float, Integer, String, Table, func, insert, select

from .schema import Base

CULLS = Table(
    "culls",
    Base.metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False, index=True),
    Column("user", String(255), nullable=False, index=True),
    Column("server", String(255), nullable=False),
    Column("lease_id", String(64)),
    Column("limit", String(32), nullable=False),
    Column("reason", String(1000), nullable=False),
)


@dataclass(frozen=True)
class CullRecord:
    """One cull: ``server`` is the server's name ("" for the default one), ``limit`` the profile limit reached."""

    at: float
    user: str
    server: str
    lease_id: str | None
    limit: str
    reason: str


class CullStore:
    """The culls table of the service's database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(self, record: CullRecord) -> bool:
        """Keep ``record``; False, keeping nothing, when its lease's cull is kept already (the hook reports a
        cull before the hub stops the server, and reports it again at the next pass if that stop failed)."""
        with self.engine.begin() as connection:
            if record.lease_id is not None and connection.scalar(
                select(func.count()).select_from(CULLS).where(CULLS.c.lease_id == record.lease_id)
            ):
                return False
            connection.execute(insert(CULLS).values(**vars(record) | {"reason": record.reason[:1000]}))
        return True

    def of_lease(self, lease_id: str) -> CullRecord | None:
        """The cull kept for ``lease_id``'s server, if any (one at most: :meth:`add`)."""
        with self.engine.connect() as connection:
            r = connection.execute(select(CULLS).where(CULLS.c.lease_id == lease_id).limit(1)).first()
        return None if r is None else CullRecord(r.at, r.user, r.server, r.lease_id, r.limit, r.reason)

    def since(self, start: float, user: str | None = None, limit: int = 500) -> list[CullRecord]:
        """The culls from ``start`` on, newest first, at most ``limit``; ``user``'s alone when given."""
        query = select(CULLS).where(CULLS.c.at >= start)
        if user is not None:
            query = query.where(CULLS.c.user == user)
        with self.engine.connect() as connection:
            rows = connection.execute(query.order_by(CULLS.c.at.desc(), CULLS.c.id.desc()).limit(limit))
            return [CullRecord(r.at, r.user, r.server, r.lease_id, r.limit, r.reason) for r in rows]

    def counts(self) -> collections.Counter[str]:
        """Every cull kept, by the limit reached."""
        with self.engine.connect() as connection:
            rows = connection.execute(select(CULLS.c.limit, func.count()).group_by(CULLS.c.limit))
            return collections.Counter({limit: count for limit, count in rows})
