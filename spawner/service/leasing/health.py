"""Device health in the service: drains an admin asks for, kept in the store, and faults the telemetry finds.

**Drains** are recorded in a ``drains`` table in the lease store's database (same engine, same habits as the
job store), not in a file next to it: the store may be PostgreSQL on another machine (``GPUPOOL_DB_URL``),
where "next to the store" means nothing, and one database keeps one backup and one truth. A drain is written
before it is applied and re-applied at start-up through the same path, so a job that was still running on a
drained device when the service stopped is stopped and requeued then.

**Faults**: :func:`unhealthy_reason` judges one telemetry sample: a critical XID (:data:`CRITICAL_XIDS`) or
a GPU that fell off the bus (NVML answers "GPU is lost") makes its physical GPU unhealthy. The
:class:`HealthKeeper` watches every snapshot (a :class:`~..telemetry.telemetry_loop.Telemetry` observer), marks the GPU
once, requeues the jobs on it through the job manager and logs every server lease on it. A fault mark lives in
memory: after a restart the next samples judge the GPU again (a lost GPU is found again at once; an XID is an
event, so a GPU that logged one before the restart is trusted until it logs another).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Engine, Float, Integer, String, Table, delete, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ...pool.devices import Health
from ...telemetry.samples import Sample, Snapshot
from ..jobs.job_manager import JobManager

log = logging.getLogger(__name__)

# XIDs after which the GPU must not take new work until it is reset or replaced (NVIDIA's XID catalogue; the
# application-caused ones such as 13, 31, 43, 45 and 68 are left out: the next job may well run fine).
CRITICAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapping recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
_LOST = "gpu is lost"  # NVML's sentence for NVML_ERROR_GPU_IS_LOST, as the samplers put it in ``problems``


def unhealthy_reason(sample: Sample) -> str | None:
    """Why the sample's physical GPU must leave the pool (a critical XID, a lost GPU), or None."""
    if any(_LOST in problem.lower() for problem in sample.problems):
        return "the GPU fell off the bus (NVML: GPU is lost)"
    critical = sorted({code for code in sample.xid_errors or () if code in CRITICAL_XIDS})
    if critical:
        return ", ".join(f"XID {code}: {CRITICAL_XIDS[code]}" for code in critical)
    return None


# ---- drains in the store -----------------------------------------------------------------------------------


class _Base(DeclarativeBase):
    pass


class DrainRow(_Base):
    __tablename__ = "drains"

    key: Mapped[str] = mapped_column(String(300), primary_key=True)  # "node" or "node/gpu_index"
    node: Mapped[str] = mapped_column(String(253))
    gpu_index: Mapped[int | None] = mapped_column(Integer)
    drained_at: Mapped[float] = mapped_column(Float)
    by: Mapped[str] = mapped_column(String(255))


_DRAINS = cast(Table, DrainRow.__table__)


@dataclass(frozen=True)
class Drain:
    node: str
    gpu_index: int | None
    drained_at: float
    by: str

    @property
    def key(self) -> str:
        return device_key(self.node, self.gpu_index)


def device_key(node: str, gpu_index: int | None) -> str:
    """``node`` or ``node/gpu`` as the CLI writes it."""
    return node if gpu_index is None else f"{node}/{gpu_index}"


class DrainStore:
    """The drained nodes and GPUs, in the database behind ``engine`` (the lease store's)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        _Base.metadata.create_all(engine)

    def add(self, drain: Drain) -> None:
        """Record a drain; draining again keeps the first record."""
        with self.engine.begin() as connection:
            if connection.scalar(select(_DRAINS.c.key).where(_DRAINS.c.key == drain.key)) is None:
                connection.execute(
                    _DRAINS.insert(),
                    {
                        "key": drain.key,
                        "node": drain.node,
                        "gpu_index": drain.gpu_index,
                        "drained_at": drain.drained_at,
                        "by": drain.by,
                    },
                )

    def remove(self, node: str, gpu_index: int | None) -> None:
        with self.engine.begin() as connection:
            connection.execute(delete(_DRAINS).where(_DRAINS.c.key == device_key(node, gpu_index)))

    def all(self) -> list[Drain]:
        with self.engine.begin() as connection:
            rows = connection.execute(select(_DRAINS).order_by(_DRAINS.c.drained_at)).all()
        return [Drain(row.node, row.gpu_index, row.drained_at, row.by) for row in rows]


# ---- the keeper --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    node: str
    gpu_index: int
    reason: str
    at: float


class HealthKeeper:
    """Drains and faults over one job manager (and through it, its lease manager)."""

    def __init__(
        self, jobs: JobManager, drains: DrainStore, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.jobs = jobs
        self.drains = drains
        self.clock = clock
        self.faults: dict[tuple[str, int], Fault] = {}
        self._unknown: set[tuple[str, int]] = set()

    def restore(self) -> None:
        """Re-apply the stored drains (at start-up); one whose node or GPU is gone is logged and kept."""
        for drain in self.drains.all():
            try:
                stopped = self.jobs.drain(drain.node, drain.gpu_index, drain.by)
            except KeyError as error:
                log.warning("drain of %s not applied: %s is not in the pool", drain.key, error.args[0])
                continue
            log.info("%s stays drained (by %s); %d jobs stopped", drain.key, drain.by, len(stopped))

    def check(self, node: str, gpu_index: int | None) -> None:
        """KeyError naming an unknown node or GPU."""
        self.jobs.leases.leases_on(node, gpu_index)

    def drain(self, node: str, gpu_index: int | None, by: str) -> tuple[list[str], list[str]]:
        """Drain (recorded first, then applied); the ids of the jobs stopped to be requeued and of the server
        leases that keep running there."""
        self.check(node, gpu_index)
        self.drains.add(Drain(node, gpu_index, self.clock(), by))
        stopped = self.jobs.drain(node, gpu_index, by)
        return [job.id for job in stopped], self._tell_servers(node, gpu_index, f"drained by {by}")

    def undrain(self, node: str, gpu_index: int | None) -> Health:
        """Undrain (removed from the store first); the device's health now."""
        self.check(node, gpu_index)
        self.drains.remove(node, gpu_index)
        self.jobs.undrain(node, gpu_index)
        return self.jobs.leases.health_of(node, gpu_index)

    def observe(self, snapshot: Snapshot) -> None:
        """A telemetry observer: mark a GPU with a critical XID or lost from the bus unhealthy, once."""
        for sample in snapshot.samples:
            key = (sample.node, sample.gpu_index)
            if key in self.faults or key in self._unknown:
                continue
            reason = unhealthy_reason(sample)
            if reason is None:
                continue
            try:
                stopped = self.jobs.fault(sample.node, sample.gpu_index, reason)
            except KeyError as error:
                self._unknown.add(key)
                log.warning("telemetry reports %s for %s, which is not in the pool", reason, error.args[0])
                continue
            self.faults[key] = Fault(sample.node, sample.gpu_index, reason, snapshot.time)
            log.warning(
                "GPU %d of node %s marked unhealthy: %s; %d jobs stopped to be requeued",
                sample.gpu_index,
                sample.node,
                reason,
                len(stopped),
            )
            self._tell_servers(sample.node, sample.gpu_index, f"unhealthy: {reason}")

    def _tell_servers(self, node: str, gpu_index: int | None, what: str) -> list[str]:
        """Log every server lease on the device (they keep running); their ids."""
        servers = [
            lease for lease in self.jobs.leases.leases_on(node, gpu_index) if lease.owner_kind == "server"
        ]
        for lease in servers:
            log.warning(
                "server %s of %s (lease %s) runs on %s, now %s",
                lease.owner_name,
                lease.user,
                lease.id,
                device_key(node, gpu_index),
                what,
            )
        return [lease.id for lease in servers]


# ---- node conditions a backend reports ---------------------------------------------------------------------


class NodeConditions:
    """Whole-node faults a backend reports as they come and go (Kubernetes: NotReady, cordoned, tainted, MIG
    being reconfigured), applied through the same fault path as telemetry's: the node is marked unhealthy,
    its jobs are stopped and requeued, its servers logged. When the backend says the node is fine again, the
    node's fault mark is cleared (a drain stays) and queued work is admitted. Like telemetry faults, these
    marks live in memory: after a restart the backend reports the node's state again."""

    def __init__(self, jobs: JobManager) -> None:
        self.jobs = jobs
        self.faults: dict[str, str] = {}  # node -> why it is out

    def update(self, node: str, problem: str | None) -> list[str]:
        """Apply the node's current problem (None: healthy); the ids of the jobs stopped to be requeued."""
        if self.faults.get(node) == problem:
            return []
        if problem is None:
            self.faults.pop(node, None)
            self.jobs.leases.clear_health(node, Health.UNHEALTHY)
            log.info("node %s may take work again", node)
            return []
        self.faults[node] = problem
        stopped = self.jobs.fault(node, None, problem)
        servers = [lease for lease in self.jobs.leases.leases_on(node) if lease.owner_kind == "server"]
        log.warning(
            "node %s marked unhealthy: %s; %d jobs stopped to be requeued, %d servers keep running there",
            node,
            problem,
            len(stopped),
            len(servers),
        )
        return [job.id for job in stopped]
