"""A node's GPUs built from its GPU Feature Discovery labels and allocatable resources: whole, time-sliced
(shared) or MIG, each with a synthetic stable UUID (``k8s-<node>-gpu<i>``)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..pool.devices import Gpu, GpuMode, MigInstance
from ..pool.mig import Placement, fit, profile_memory_gb
from ..pool.products import PRODUCTS, UnknownProduct, canonical_product, normalize_product
from .gfd import (
    COUNT,
    GPU_RESOURCE,
    MEMORY,
    MIG_CONFIG,
    PRODUCT,
    REPLICAS,
    SHARED_SUFFIX,
    NodeLabelError,
    device_count,
    label_version,
    mig_profile,
)
from .mig_layout import lay_out, mig_geometry, name_instances, per_gpu


@dataclass(frozen=True)
class _Allocatable:
    """The node's allocatable GPU resources: MIG instances by profile (mixed strategy only), whole GPUs (or,
    under the single strategy, instances), and time-sliced shares."""

    mig: dict[str, int]
    whole: int
    shared: int

    @classmethod
    def read(
        cls, where: str, allocatable: Mapping[str, str], strategy: str, shared_resource: str
    ) -> _Allocatable:
        mig = {
            profile: device_count(value, f"{where}: status.allocatable.{key}")
            for key, value in allocatable.items()
            if (profile := mig_profile(key)) is not None
        }
        shared = device_count(
            allocatable.get(shared_resource, "0"), f"{where}: status.allocatable.{shared_resource}"
        )
        return cls(
            mig={profile: n for profile, n in mig.items() if n > 0 and strategy == "mixed"},
            # shared GPUs that kept the name nvidia.com/gpu are shares, not whole GPUs
            whole=0
            if shared_resource == GPU_RESOURCE
            else device_count(
                allocatable.get(GPU_RESOURCE, "0"), f"{where}: status.allocatable.{GPU_RESOURCE}"
            ),
            shared=shared,
        )


@dataclass(frozen=True)
class _GpuMaker:
    """Builds the node's GPUs, all of one product and driver."""

    node: str
    labels: Mapping[str, str]
    product: str
    single_profile: str | None
    capability: str
    driver: str
    cuda: str = ""  # the CUDA version the driver supports, from GFD's cuda.runtime labels

    def __call__(
        self, index: int, mode: GpuMode, instances: Sequence[Placement] = (), shares: int | None = None
    ) -> Gpu:
        uuid = f"k8s-{self.node}-gpu{index}"
        # The label is the physical GPU's memory, except under the single strategy (a slice's memory).
        labelled = (
            0
            if self.single_profile
            else device_count(self.labels.get(MEMORY, "0"), f"node {self.node}: label {MEMORY}")
        )
        memory = labelled or (PRODUCTS[self.product].memory_mib if self.product in PRODUCTS else 0)
        return Gpu(
            uuid=uuid,
            index=index,
            product=self.product,
            memory_mib=memory,
            compute_capability=self.capability,
            driver_version=self.driver,
            cuda_version=self.cuda,
            mode=mode,
            mig_instances=tuple(
                MigInstance("", p.profile, p.start, profile_memory_gb(p.profile) * 1024, uuid)
                for p in instances
            ),
            max_shares=shares,
            shares_only=mode is GpuMode.SHARED,  # the device plugin serves it as replicas only
        )


def node_gpus(
    name: str, labels: dict[str, str], allocatable: dict[str, str], strategy: str, shared_resource: str
) -> tuple[Gpu, ...]:
    """The node's GPUs; :class:`NodeLabelError` when its labels and allocatable resources contradict."""
    where = f"node {name}"
    alloc = _Allocatable.read(where, allocatable, strategy, shared_resource)
    raw_product = labels.get(PRODUCT)
    if raw_product is None:
        if alloc.whole or alloc.mig or alloc.shared:
            raise NodeLabelError(
                f"{where}: allocatable GPU resources but no {PRODUCT} label; is GPU Feature Discovery running?"
            )
        return ()
    if shared_resource == GPU_RESOURCE and raw_product.upper().endswith(SHARED_SUFFIX):
        raw_product = raw_product[: -len(SHARED_SUFFIX)]  # the GPU's own name
    single_profile = None
    if strategy == "single" and "-MIG-" in raw_product.upper():
        single_profile = re.split(r"-MIG-", raw_product, flags=re.IGNORECASE)[1].lower()
    try:
        product = normalize_product(raw_product)
    except UnknownProduct:
        product = canonical_product(raw_product)  # a site's own model: whole GPUs still work
    physical = device_count(labels.get(COUNT, "0"), f"{where}: label {COUNT}")
    driver = label_version(labels, "nvidia.com/cuda.driver", ("major", "minor", "rev")) or label_version(
        labels, "nvidia.com/cuda.driver-version", ("major", "minor", "revision")
    )
    capability = label_version(labels, "nvidia.com/gpu.compute", ("major", "minor"))
    cuda = label_version(labels, "nvidia.com/cuda.runtime", ("major", "minor")) or label_version(
        labels, "nvidia.com/cuda.runtime-version", ("major", "minor")
    )
    gpu = _GpuMaker(name, labels, product, single_profile, capability, driver, cuda)
    if single_profile is not None:
        return _single_strategy(gpu, where, single_profile, alloc.whole or physical)
    layouts = _mixed_layouts(where, labels, product, alloc, physical) if alloc.mig else []
    non_mig = max(physical - len(layouts), 0) if physical else alloc.whole
    replicas = _replicas(labels, alloc.shared, non_mig) if alloc.shared else None
    gpus = [gpu(i, GpuMode.SHARED if replicas else GpuMode.WHOLE, shares=replicas) for i in range(non_mig)]
    gpus += [gpu(non_mig + i, GpuMode.MIG, layout) for i, layout in enumerate(layouts)]
    return name_instances(name, gpus, alloc.mig)


def _single_strategy(gpu: _GpuMaker, where: str, profile: str, devices: int) -> tuple[Gpu, ...]:
    """Every GPU split alike into ``profile`` instances, ``devices`` of them exposed."""
    geo = mig_geometry(where, gpu.product)
    each = per_gpu(geo, profile, where)
    layout = fit(geo, [profile] * each)
    assert layout is not None  # per_gpu found that many fit
    gpus = [gpu(i, GpuMode.MIG, layout) for i in range(math.ceil(devices / each))]
    return name_instances(gpu.node, gpus, {profile: devices})


def _mixed_layouts(
    where: str, labels: Mapping[str, str], product: str, alloc: _Allocatable, physical: int
) -> list[tuple[Placement, ...]]:
    """The MIG GPUs' layouts under the mixed strategy: the counted instances on the GPUs neither whole nor
    shared (on every GPU when ``nvidia.com/mig.config`` is an ``all-…`` configuration)."""
    geo = mig_geometry(where, product)
    config = labels.get(MIG_CONFIG, "")
    every_gpu = config.startswith("all-") and config != "all-disabled"
    shared_gpus = (
        alloc.shared // _replicas(labels, alloc.shared, physical - alloc.whole) if alloc.shared else 0
    )
    mig_gpus = physical if every_gpu else physical - alloc.whole - shared_gpus
    found = lay_out(geo, alloc.mig, max(mig_gpus, 1))
    if found is None:
        counts = ", ".join(f"{n} × {p}" for p, n in sorted(alloc.mig.items()))
        raise NodeLabelError(
            f"{where}: allocatable MIG instances ({counts}) do not fit {max(mig_gpus, 1)} {product} GPU(s) "
            f"({COUNT}={physical}, allocatable {GPU_RESOURCE}={alloc.whole})"
        )
    return [layout for layout in found if layout]


def _replicas(labels: Mapping[str, str], shared_alloc: int, gpus: int) -> int:
    """Holders per shared GPU: the ``nvidia.com/gpu.replicas`` label, else allocatable over the GPUs."""
    raw = labels.get(REPLICAS, "")
    if raw.isdigit() and int(raw) >= 2:
        return int(raw)
    return max(2, shared_alloc // max(gpus, 1))
