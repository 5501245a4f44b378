"""The health marks an admin sets, stored: drains and faults that must outlive a restart.

A mark is written before it is applied and re-applied at start-up through the same path, so a job that was
still running on a marked device when the service stopped is stopped and requeued then, and a GPU an admin
took out is never handed to new work after a restart. Faults the telemetry or a backend finds are not
stored: they are found again by the next samples or the backend's next report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from sqlalchemy import Engine, Float, Integer, MetaData, String, Table, delete, inspect, select
from sqlalchemy.orm import Mapped, mapped_column

from ...pool.devices import Health
from .schema import Base


def device_key(node: str, gpu_index: int | None) -> str:
    """``node`` or ``node/gpu`` as the CLI writes it."""
    return node if gpu_index is None else f"{node}/{gpu_index}"


class HealthMarkRow(Base):
    __tablename__ = "health_marks"

    key: Mapped[str] = mapped_column(String(300), primary_key=True)  # "node" or "node/gpu_index"
    health: Mapped[str] = mapped_column(String(16), primary_key=True)  # "drained" or "unhealthy"
    node: Mapped[str] = mapped_column(String(253))
    gpu_index: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(1000))
    by: Mapped[str] = mapped_column(String(255))
    at: Mapped[float] = mapped_column(Float)


_MARKS = cast(Table, HealthMarkRow.__table__)


@dataclass(frozen=True)
class StoredMark:
    """A drain or an admin's fault mark on a node or one GPU: who set it, when and why."""

    node: str
    gpu_index: int | None
    health: Health
    reason: str
    by: str
    at: float

    @property
    def key(self) -> str:
        return device_key(self.node, self.gpu_index)


class HealthStore:
    """The stored marks, in the database behind ``engine`` (the lease store's)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._adopt_old_drains()

    def add(self, mark: StoredMark) -> None:
        """Record a mark; marking again keeps the first record (who and when it began)."""
        with self.engine.begin() as connection:
            found = select(_MARKS.c.key).where(_MARKS.c.key == mark.key, _MARKS.c.health == mark.health.value)
            if connection.scalar(found) is None:
                connection.execute(
                    _MARKS.insert(),
                    {
                        "key": mark.key,
                        "health": mark.health.value,
                        "node": mark.node,
                        "gpu_index": mark.gpu_index,
                        "reason": mark.reason,
                        "by": mark.by,
                        "at": mark.at,
                    },
                )

    def remove(self, node: str, gpu_index: int | None, health: Health) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                delete(_MARKS).where(
                    _MARKS.c.key == device_key(node, gpu_index), _MARKS.c.health == health.value
                )
            )

    def all(self) -> list[StoredMark]:
        with self.engine.begin() as connection:
            rows = connection.execute(select(_MARKS).order_by(_MARKS.c.at)).all()
        return [StoredMark(r.node, r.gpu_index, Health(r.health), r.reason, r.by, r.at) for r in rows]

    def _adopt_old_drains(self) -> None:
        """Databases from before health marks kept drains in a ``drains`` table: carry them over, once."""
        if "drains" not in inspect(self.engine).get_table_names():
            return
        old = Table("drains", MetaData(), autoload_with=self.engine)
        with self.engine.begin() as connection:
            rows = connection.execute(select(old)).all()
        for row in rows:
            by = str(row.by)
            self.add(
                StoredMark(row.node, row.gpu_index, Health.DRAINED, f"drained by {by}", by, row.drained_at)
            )
        old.drop(self.engine)
