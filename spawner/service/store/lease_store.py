"""The lease store: the one durable record of who holds which devices, so a restart loses nothing.

SQLite by default (WAL, foreign keys on), any SQLAlchemy URL otherwise (``postgresql+psycopg://…``). The
schema (:mod:`.schema`) is created when the store opens the database.
The store only records: :class:`~..leasing.lease_manager.LeaseManager` decides, and is the only writer.

Times are UTC seconds since the epoch (floats) from the manager's clock. A request is stored as JSON in the
field names of the profiles file (``gpus``, ``mig``, ``share``); devices as a JSON list of grants.
"""

from __future__ import annotations

import os
from dataclasses import asdict, replace
from typing import Any, cast

from sqlalchemy import (
    JSON,
    CheckConstraint,
    ColumnElement,
    Engine,
    Float,
    Integer,
    String,
    Table,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Mapped, mapped_column, sessionmaker
from sqlalchemy.pool import StaticPool

from ...pool.leases import Lease, LeaseState, NewLease, OwnerKind
from ...pool.requests import GpuNeed, GpuShare, MigSlice, Request, WholeGpus
from ...pool.software import Software
from ...pool.state import Grant
from .schema import Base, create_schema

_NEED_KINDS: dict[str, type[GpuNeed]] = {"gpus": WholeGpus, "mig": MigSlice, "share": GpuShare}


class LeaseRow(Base):
    __tablename__ = "leases"
    __table_args__ = (
        CheckConstraint("owner_kind IN ('server', 'job')", name="owner_kind_known"),
        CheckConstraint("state IN ('queued', 'granted', 'released')", name="state_known"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, unique=True)  # arrival order, kept across restarts
    owner_kind: Mapped[str] = mapped_column(String(8))
    user: Mapped[str] = mapped_column(String(255), index=True)
    owner_name: Mapped[str] = mapped_column(String(255))
    profile: Mapped[str] = mapped_column(String(63))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    priority: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    node: Mapped[str | None] = mapped_column(String(253))
    devices: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)
    granted_at: Mapped[float | None] = mapped_column(Float)
    released_at: Mapped[float | None] = mapped_column(Float)
    release_reason: Mapped[str | None] = mapped_column(String(1000))


class LeaseNotFound(LookupError):
    """No lease has this id."""


class LeaseStore:
    """Leases in a database; every write is one short transaction and returns a plain :class:`Lease`.

    The process that owns the pool is the store's only writer, so the store keeps every active (queued or
    granted) lease in memory too, written through after each commit: reads of live leases, the hot path of
    the API, cost no query, and released leases are read from the database.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = _engine(url)
        create_schema(self.engine)  # the other stores share this engine and its tables
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        with self._sessions.begin() as session:
            self._next_seq = (session.scalar(select(func.max(LeaseRow.seq))) or 0) + 1
        # Insertion order is arrival order (seq): loaded in seq order, and new leases get the next seq.
        self._active: dict[str, Lease] = {
            lease.id: lease for lease in self._query(LeaseRow.state != LeaseState.RELEASED.value)
        }

    def close(self) -> None:
        self.engine.dispose()

    def add_queued(self, new: NewLease) -> Lease:
        """Record a new lease waiting in the queue."""
        return self._add(new, LeaseState.QUEUED)

    def add_granted(self, new: NewLease, node: str, devices: tuple[Grant, ...]) -> Lease:
        """Record a new lease granted at once, in one transaction, so no crash leaves it half-written."""
        return self._add(new, LeaseState.GRANTED, node, devices)

    def _add(
        self, new: NewLease, state: LeaseState, node: str | None = None, devices: tuple[Grant, ...] = ()
    ) -> Lease:
        granted = state is LeaseState.GRANTED
        lease = Lease(
            id=new.id,
            owner_kind=new.owner_kind,
            user=new.user,
            owner_name=new.owner_name,
            profile=new.profile,
            request=new.request,
            priority=new.priority,
            state=state,
            created_at=new.created_at,
            node=node,
            devices=devices,
            granted_at=new.created_at if granted else None,
        )
        with self.engine.begin() as connection:
            connection.execute(
                _INSERT,
                {
                    "id": lease.id,
                    "seq": self._next_seq,
                    "owner_kind": lease.owner_kind,
                    "user": lease.user,
                    "owner_name": lease.owner_name,
                    "profile": lease.profile,
                    "request": request_to_json(lease.request),
                    "priority": lease.priority,
                    "state": state.value,
                    "node": node,
                    "devices": [asdict(g) for g in devices],
                    "created_at": lease.created_at,
                    "granted_at": lease.granted_at,
                    "released_at": None,
                    "release_reason": None,
                },
            )
        self._next_seq += 1
        self._active[lease.id] = lease
        return lease

    def mark_granted(self, lease_id: str, node: str, devices: tuple[Grant, ...], at: float) -> Lease:
        """A queued lease now holds ``devices`` on ``node``."""
        lease = self.get(lease_id)
        if lease is None:
            raise LeaseNotFound(f"no lease {lease_id!r}")
        if lease.state is not LeaseState.QUEUED:
            raise ValueError(f"lease {lease_id} is {lease.state}, only a queued lease can be granted")
        granted = replace(lease, state=LeaseState.GRANTED, node=node, devices=devices, granted_at=at)
        self._update(
            lease_id,
            state=LeaseState.GRANTED.value,
            node=node,
            devices=[asdict(g) for g in devices],
            granted_at=at,
        )
        self._active[lease_id] = granted
        return granted

    def mark_released(self, lease_id: str, reason: str, at: float) -> Lease:
        """The lease gives everything back; releasing a released lease changes nothing and returns it."""
        lease = self.get(lease_id)
        if lease is None:
            raise LeaseNotFound(f"no lease {lease_id!r}")
        if lease.state is LeaseState.RELEASED:
            return lease
        self._update(lease_id, state=LeaseState.RELEASED.value, released_at=at, release_reason=reason)
        del self._active[lease_id]
        return replace(lease, state=LeaseState.RELEASED, released_at=at, release_reason=reason)

    def _update(self, lease_id: str, **values: Any) -> None:
        statement = update(_TABLE).where(_TABLE.c.id == bindparam("lease_id"))
        with self.engine.begin() as connection:
            connection.execute(statement, {"lease_id": lease_id, **values})

    def get(self, lease_id: str) -> Lease | None:
        active = self._active.get(lease_id)
        if active is not None:
            return active
        found = self._query(LeaseRow.id == lease_id)
        return found[0] if found else None

    def list_for_user(self, user: str, *, active_only: bool = False) -> list[Lease]:
        """A user's leases, oldest first; released ones too unless ``active_only``."""
        if active_only:
            return [lease for lease in self._active.values() if lease.user == user]
        return self._query(LeaseRow.user == user)

    def list_all(self, *, active_only: bool = False) -> list[Lease]:
        """Every user's leases, oldest first; released ones too unless ``active_only``."""
        return self.active() if active_only else self._query()

    def granted_since(self, since: float) -> list[Lease]:
        """Every lease that held devices at some time after ``since``: granted ones, and those released since
        (what fair share adds up)."""
        released = self._query(
            LeaseRow.state == LeaseState.RELEASED.value,
            LeaseRow.granted_at.is_not(None),
            LeaseRow.released_at >= since,
        )
        return [lease for lease in self._active.values() if lease.state is LeaseState.GRANTED] + released

    def active(self) -> list[Lease]:
        """Every queued or granted lease, in arrival order: what a restart must restore."""
        return list(self._active.values())

    def _query(self, *where: ColumnElement[bool]) -> list[Lease]:
        with self._sessions.begin() as session:
            return [
                _lease(row) for row in session.scalars(select(LeaseRow).where(*where).order_by(LeaseRow.seq))
            ]


_TABLE = cast(Table, LeaseRow.__table__)
# Built once: SQLAlchemy then reuses the compiled SQL, and each write only binds its values.
_INSERT = insert(_TABLE)


def sqlite_url(path: str) -> str:
    return f"sqlite:///{path}"


def _engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    in_memory = parsed.database in (None, "", ":memory:")
    if not in_memory:
        _private_file(str(parsed.database))
    # One shared connection for an in-memory database, or every connection would see an empty one.
    options: dict[str, Any] = {"poolclass": StaticPool} if in_memory else {}
    engine = create_engine(url, connect_args={"check_same_thread": False}, **options)

    @event.listens_for(engine, "connect")
    def _pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
            # With WAL, NORMAL syncs at checkpoints, not at every commit: a killed service loses nothing
            # (the commit is in the OS's hands); only a power cut may lose the last moments, never corrupt.
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def _private_file(path: str) -> None:
    """Create the database file readable by its owner only (jobs' environments are in it), before SQLite
    does with the umask's 0644; its WAL and shared-memory files take the same mode from it."""
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    os.chmod(path, 0o600)  # an existing file from before keeps no wider mode


def _lease(row: LeaseRow) -> Lease:
    return Lease(
        id=row.id,
        owner_kind=cast(OwnerKind, row.owner_kind),
        user=row.user,
        owner_name=row.owner_name,
        profile=row.profile,
        request=request_from_json(row.request),
        priority=row.priority,
        state=LeaseState(row.state),
        created_at=row.created_at,
        node=row.node,
        devices=tuple(Grant(**g) for g in row.devices),
        granted_at=row.granted_at,
        released_at=row.released_at,
        release_reason=row.release_reason,
    )


# ---- requests as JSON ------------------------------------------------------------------------------------


def request_to_json(request: Request) -> dict[str, Any]:
    """``{"cpu_milli", "memory_mib", "gpu": null | {"kind": "gpus" | "mig" | "share", <its fields>}}``, and
    ``"seconds"`` when the request says how long it holds."""
    need = request.gpu
    gpu = None
    if need is not None:
        kind = next(name for name, cls in _NEED_KINDS.items() if isinstance(need, cls))
        gpu = {"kind": kind, **asdict(need), "products": sorted(need.products)}
        if not need.software:
            del gpu["software"]  # what any GPU has: stored as before
    held = {} if request.seconds is None else {"seconds": request.seconds}
    return {"cpu_milli": request.cpu_milli, "memory_mib": request.memory_mib, "gpu": gpu, **held}


def request_from_json(data: dict[str, Any]) -> Request:
    gpu = data.get("gpu")
    need: GpuNeed | None = None
    if gpu is not None:
        fields = {k: v for k, v in gpu.items() if k != "kind"}
        fields |= {
            "products": frozenset(fields.get("products", ())),
            "software": Software(**fields.get("software", {})),
        }
        need = _NEED_KINDS[gpu["kind"]](**fields)
    return Request(data["cpu_milli"], data["memory_mib"], need, data.get("seconds"))
