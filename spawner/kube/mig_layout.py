"""Laying a node's counted MIG instances onto its GPUs: Kubernetes counts instances per node, so gpupool
finds legal placements (:mod:`..pool.mig`) for them, GPU by GPU, and names each instance with a synthetic
stable UUID (``k8s-<node>-<profile>-<n>``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from ..pool.devices import Gpu, MigInstance
from ..pool.mig import Geometry, Placement, fit, geometry
from .gfd import PRODUCT, NodeLabelError

_SEARCH_LIMIT = 20_000  # layout attempts before giving up on a node's MIG counts (real counts need a few)


def lay_out(geo: Geometry, counts: Mapping[str, int], gpus: int) -> list[tuple[Placement, ...]] | None:
    """Legal layouts of ``counts`` MIG instances (profile -> how many) on ``gpus`` GPUs, one per GPU (some may
    be empty), or None when they cannot fit. An even split (``all-balanced`` on every GPU) is tried first;
    otherwise an exhaustive search, largest instances first, skipping GPUs that hold the same so far."""
    for profile in counts:
        geo.profile(profile)  # an unknown name raises, listing the product's profiles
    if gpus < 1:
        return None
    if all(n % gpus == 0 for n in counts.values()):
        even = fit(geo, [p for p, n in counts.items() for _ in range(n // gpus)])
        if even is not None:
            return [even] * gpus
    order = sorted(
        (p for p, n in counts.items() for _ in range(n)), key=lambda p: (-geo.profiles[p].memory_slices, p)
    )
    if sum(geo.profiles[p].memory_slices for p in order) > gpus * geo.memory_slices:
        return None
    assigned: list[list[str]] = [[] for _ in range(gpus)]
    budget = [_SEARCH_LIMIT]
    fits: dict[tuple[str, ...], bool] = {}

    def fits_one_gpu(profiles: list[str]) -> bool:
        key = tuple(sorted(profiles))
        if key not in fits:
            shapes = Counter(geo.profiles[p].shape for p in profiles)
            fits[key] = (
                sum(s.memory_slices * n for s, n in shapes.items()) <= geo.memory_slices
                and sum(s.compute_slices * n for s, n in shapes.items()) <= geo.compute_slices
                and all(n <= s.max_count for s, n in shapes.items())
                and fit(geo, profiles) is not None
            )
        return fits[key]

    def search(at: int) -> bool:
        if at == len(order):
            return True
        tried: set[tuple[str, ...]] = set()
        for slot in assigned:
            key = tuple(slot)
            if key in tried:
                continue
            tried.add(key)
            budget[0] -= 1
            if budget[0] < 0:
                return False
            if fits_one_gpu([*slot, order[at]]):
                slot.append(order[at])
                if search(at + 1):
                    return True
                slot.pop()
        return False

    if not search(0):
        return None
    layouts = [fit(geo, slot) for slot in assigned]
    return [layout for layout in layouts if layout is not None]


def per_gpu(geo: Geometry, profile: str, where: str) -> int:
    """How many instances of ``profile`` one GPU holds under the single strategy (every GPU split alike)."""
    try:
        geo.profile(profile)
    except ValueError as error:
        raise NodeLabelError(f"{where}: label {PRODUCT}: {error}") from None
    count = 1
    while fit(geo, [profile] * (count + 1)) is not None:
        count += 1
    return count


def mig_geometry(where: str, product: str) -> Geometry:
    try:
        return geometry(product)
    except ValueError as error:
        raise NodeLabelError(f"{where}: MIG resources on a GPU without MIG geometry: {error}") from None


def name_instances(node: str, gpus: list[Gpu], counts: Mapping[str, int]) -> tuple[Gpu, ...]:
    """Give MIG instances their synthetic UUIDs, numbered per profile across the node, and keep at most
    ``counts`` of each (the single strategy's last GPU may be partly exposed)."""
    seen: Counter[str] = Counter()
    named = []
    for g in gpus:
        instances = []
        for instance in g.mig_instances:
            if seen[instance.profile] >= counts.get(instance.profile, 0):
                continue
            uuid = f"k8s-{node}-{instance.profile}-{seen[instance.profile]}"
            seen[instance.profile] += 1
            instances.append(MigInstance(uuid, instance.profile, instance.start, instance.memory_mib, g.uuid))
        named.append(replace(g, mig_instances=tuple(instances)))
    return tuple(named)
