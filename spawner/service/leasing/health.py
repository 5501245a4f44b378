"""Device health in the service, in one place: :class:`HealthKeeper` takes every mark that keeps work off a
node or GPU, applies it through the job manager (nothing new is placed there; jobs running there are stopped
and requeued; servers keep running and are logged) and lifts it again.

Where marks come from, and which outlive a restart:

- **Drains** and **admin faults** (``POST admin/drain``, ``POST admin/faults``) are stored
  (:mod:`..store.health_store`) before they are applied, and re-applied at start-up, until an admin undrains
  or repairs the device.
- **Telemetry faults**: :func:`unhealthy_reason` judges one sample: a critical XID (:data:`CRITICAL_XIDS`) or a
  GPU that fell off the bus (NVML answers "GPU is lost"). They live in memory: after a restart the next
  samples judge the GPU again (a lost GPU is found again at once; an XID is an event, so a GPU that logged
  one before the restart is trusted until it logs another, or until an admin marks it).
- **Node conditions** a backend reports (Kubernetes: NotReady, cordoned, tainted, MIG being reconfigured)
  come and go with the backend's reports, which it makes again after a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...pool.devices import Health
from ...pool.job_states import Job
from ...telemetry.samples import Sample, Snapshot
from ..jobs.job_manager import JobManager
from ..store.health_store import HealthStore, StoredMark, device_key

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


# ---- the keeper --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    node: str
    gpu_index: int
    reason: str
    at: float


class HealthKeeper:
    """Every health mark over one job manager (and through it, its lease manager)."""

    def __init__(
        self, jobs: JobManager, store: HealthStore, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.jobs = jobs
        self.store = store
        self.clock = clock
        self.faults: dict[tuple[str, int], Fault] = {}  # found by the telemetry
        self.node_problems: dict[str, str] = {}  # reported by the backend
        self._unknown: set[tuple[str, int]] = set()

    def restore(self) -> None:
        """Re-apply the stored marks (at start-up); one whose node or GPU is gone is logged and kept."""
        for mark in self.store.all():
            try:
                stopped = self._apply(mark.node, mark.gpu_index, mark.health, mark.reason, mark.by)
            except KeyError as error:
                missing = str(error.args[0])  # a node's name, or a sentence naming a GPU the node lacks
                said = missing if " " in missing else f"node {missing} is not in the pool"
                log.warning("%s of %s not applied, kept for when it is back: %s", mark.health, mark.key, said)
                continue
            log.info("%s stays %s (%s); %d jobs stopped", mark.key, mark.health, mark.reason, len(stopped))

    def check(self, node: str, gpu_index: int | None) -> None:
        """KeyError naming an unknown node or GPU."""
        self.jobs.leases.leases_on(node, gpu_index)

    def drain(self, node: str, gpu_index: int | None, by: str) -> tuple[list[str], list[str]]:
        """Drain (stored first, then applied); the ids of the jobs stopped to be requeued and of the server
        leases that keep running there."""
        return self._mark(node, gpu_index, Health.DRAINED, f"drained by {by}", by)

    def undrain(self, node: str, gpu_index: int | None) -> Health:
        """Undrain (removed from the store first); the device's health now."""
        return self._lift(node, gpu_index, Health.DRAINED)

    def fault(self, node: str, gpu_index: int | None, by: str) -> tuple[list[str], list[str]]:
        """An admin marks the device unhealthy (stored first, then applied) until :meth:`repair`; like
        :meth:`drain`, the ids of the jobs stopped and of the server leases there."""
        return self._mark(node, gpu_index, Health.UNHEALTHY, f"marked unhealthy by {by}", by)

    def repair(self, node: str, gpu_index: int | None) -> Health:
        """The device was reset or replaced: its unhealthy marks (an admin's, the telemetry's) are lifted."""
        if gpu_index is not None:
            self.faults.pop((node, gpu_index), None)
        else:
            self.faults = {key: fault for key, fault in self.faults.items() if key[0] != node}
        return self._lift(node, gpu_index, Health.UNHEALTHY)

    def observe(self, snapshot: Snapshot) -> None:
        """A telemetry observer: mark a GPU with a critical XID or lost from the bus unhealthy, once."""
        for sample in snapshot.samples:
            key = (sample.node, sample.gpu_index)
            if key in self.faults or key in self._unknown:
                continue
            reason = unhealthy_reason(sample)
            if reason is not None:
                self._telemetry_fault(sample.node, sample.gpu_index, reason, snapshot.time)

    def node_condition(self, node: str, problem: str | None) -> list[str]:
        """Apply a node's current condition as its backend reports it (None: fine again, and the node's fault
        mark is lifted; a drain stays); the ids of the jobs stopped to be requeued."""
        if self.node_problems.get(node) == problem:
            return []
        if problem is None:
            self.node_problems.pop(node, None)
            self.jobs.leases.clear_health(node, Health.UNHEALTHY)
            log.info("node %s may take work again", node)
            return []
        self.node_problems[node] = problem
        stopped = self.jobs.fault(node, None, problem)
        servers = self._tell_servers(node, None, f"unhealthy: {problem}")
        log.warning(
            "node %s marked unhealthy: %s; %d jobs stopped to be requeued, %d servers keep running there",
            node,
            problem,
            len(stopped),
            len(servers),
        )
        return [job.id for job in stopped]

    def _telemetry_fault(self, node: str, gpu_index: int, reason: str, at: float) -> None:
        try:
            stopped = self.jobs.fault(node, gpu_index, reason)
        except KeyError as error:
            self._unknown.add((node, gpu_index))
            log.warning("telemetry reports %s for %s, which is not in the pool", reason, error.args[0])
            return
        self.faults[(node, gpu_index)] = Fault(node, gpu_index, reason, at)
        log.warning(
            "GPU %d of node %s marked unhealthy: %s; %d jobs stopped to be requeued",
            gpu_index,
            node,
            reason,
            len(stopped),
        )
        self._tell_servers(node, gpu_index, f"unhealthy: {reason}")

    def _mark(
        self, node: str, gpu_index: int | None, health: Health, reason: str, by: str
    ) -> tuple[list[str], list[str]]:
        self.check(node, gpu_index)
        self.store.add(StoredMark(node, gpu_index, health, reason, by, self.clock()))
        stopped = self._apply(node, gpu_index, health, reason, by)
        return [job.id for job in stopped], self._tell_servers(node, gpu_index, reason)

    def _apply(self, node: str, gpu_index: int | None, health: Health, reason: str, by: str) -> list[Job]:
        if health is Health.DRAINED:
            return self.jobs.drain(node, gpu_index, by)
        return self.jobs.fault(node, gpu_index, reason)

    def _lift(self, node: str, gpu_index: int | None, health: Health) -> Health:
        self.check(node, gpu_index)
        self.store.remove(node, gpu_index, health)
        self.jobs.clear_mark(node, gpu_index, health)
        return self.jobs.leases.health_of(node, gpu_index)

    def _tell_servers(self, node: str, gpu_index: int | None, what: str) -> list[str]:
        """Log every server lease on the device (they keep running); their ids."""
        servers = [
            lease for lease in self.jobs.leases.leases_on(node, gpu_index) if lease.owner_kind == "server"
        ]
        for lease in servers:
            log.warning(
                "%s's server%s (lease %s) runs on %s, now %s",
                lease.user,
                f" {lease.owner_name}" if lease.owner_name else "",
                lease.id,
                device_key(node, gpu_index),
                what,
            )
        return [lease.id for lease in servers]
