"""What a pool is made of: nodes, GPUs, MIG instances and shared GPUs, as immutable records.

These describe hardware and how the admin laid it out. Who holds what lives in :mod:`.state`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

# "true" on a node whose GPUs are made up: a pool file's (the simulated backend), or one that gpupool's stand-in
# kubelet registers (``gpupool kube up``). A real node never carries it.
SIMULATED_LABEL = "gpupool.io/simulated"
# which backend found a node: "simulated", "nvml" or "kubernetes"
BACKEND_LABEL = "gpupool.io/backend"


class Health(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # failed: lost GPU, critical XID, node NotReady
    DRAINED = "drained"  # taken out by an admin: running work stays, nothing new is placed


def decisive(healths: Iterable[Health]) -> Health:
    """The one of ``healths`` that decides for a device: unhealthy before drained before healthy (a device with
    a fault and a drain, or on a failed node, is unhealthy)."""
    found = set(healths)
    return next((h for h in (Health.UNHEALTHY, Health.DRAINED) if h in found), Health.HEALTHY)


class GpuMode(StrEnum):
    """How a GPU is handed out."""

    WHOLE = "whole"  # leased only as a whole device
    MIG = "mig"  # split into the MIG instances the admin configured; each is leased on its own
    SHARED = "shared"  # time-shared in fractions of 1000 milli; a fully free one may still go whole


FULL_MILLI = 1000


@dataclass(frozen=True)
class MigInstance:
    """A configured MIG instance: its profile and the memory slice it starts at on its parent GPU."""

    uuid: str
    profile: str
    start: int
    memory_mib: int
    parent_uuid: str
    gpu_instance_id: int | None = None  # the driver's GPU instance id (dcgm-exporter's GPU_I_ID), where read


@dataclass(frozen=True)
class Gpu:
    """One physical GPU on a node."""

    uuid: str
    index: int
    product: str  # canonical product name (see products.normalize_product) or a site's own model label
    memory_mib: int
    compute_capability: str = ""
    driver_version: str = ""
    cuda_version: str = ""  # the CUDA version the driver supports ("12.4"), where reported (see software.py)
    nvlink_group: int | None = None  # GPUs with the same group on a node are NVLinked together
    mode: GpuMode = GpuMode.WHOLE
    mig_instances: tuple[MigInstance, ...] = ()
    max_shares: int | None = None  # SHARED mode: at most this many holders at once (None: only milli limits)
    # SHARED mode: only ever handed out in shares, even when nobody holds one (on Kubernetes the device plugin
    # serves a shared GPU as replicas; a request for one is a replica, never the whole GPU)
    shares_only: bool = False
    health: Health = Health.HEALTHY

    @property
    def label(self) -> str:
        return f"{self.product} #{self.index}"


@dataclass(frozen=True)
class Node:
    """A machine in the pool with its CPU, memory and GPUs."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[Gpu, ...] = ()
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    health: Health = Health.HEALTHY

    @property
    def products(self) -> frozenset[str]:
        return frozenset(g.product for g in self.gpus)

    @property
    def simulated(self) -> bool:
        return self.labels.get(SIMULATED_LABEL) == "true"


def pool_is_simulated(nodes: Iterable[Node]) -> bool:
    """Whether a pool is labelled "simulated" (form, listings, dashboard, widgets, telemetry): the one rule for
    it. Any simulated node makes it so, so that no made-up GPU passes for a real one."""
    return any(node.simulated for node in nodes)
