"""Small pools built straight from domain records, for tests of the pool layer."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.spawner.pool import mig
from gpupool.spawner.pool.devices import Gpu, GpuMode, Health, MigInstance, Node
from gpupool.spawner.pool.products import PRODUCTS


def gpu(
    node: str,
    index: int,
    product: str = "H100-80GB",
    *,
    mode: GpuMode = GpuMode.WHOLE,
    layout: Sequence[str] = (),
    nvlink: int | None = None,
    max_shares: int | None = None,
    health: Health = Health.HEALTHY,
) -> Gpu:
    """A GPU; ``layout`` holds MIG instances as ``profile@start`` and makes it a MIG GPU."""
    uuid = f"GPU-{node}-{index}"
    instances = []
    for text in layout:
        profile, start = text.split("@")
        memory = mig.profile_memory_gb(profile) * 1024
        instances.append(MigInstance(f"MIG-{node}-{index}-{start}", profile, int(start), memory, uuid))
    return Gpu(
        uuid=uuid,
        index=index,
        product=product,
        memory_mib=PRODUCTS[product].memory_mib if product in PRODUCTS else 16384,
        nvlink_group=nvlink,
        mode=GpuMode.MIG if layout else mode,
        mig_instances=tuple(instances),
        max_shares=max_shares,
        health=health,
    )


def node(name: str, gpus: Sequence[Gpu] = (), cpu: int = 64, memory_gib: int = 512) -> Node:
    return Node(name, cpu * 1000, memory_gib * 1024, tuple(gpus))
