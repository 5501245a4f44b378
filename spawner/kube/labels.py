"""The pool as Kubernetes describes it: Node objects with GPU Feature Discovery labels become domain nodes, and
Pods' extended-resource requests become usage per node. Pure: plain dicts in (as the API returns them), domain
records out.

What a node's labels and allocatable resources say, and what gpupool makes of it:

- ``nvidia.com/gpu.product`` (``NVIDIA-H100-80GB-HBM3``; under the single strategy ``…-MIG-1g.10gb``),
  ``nvidia.com/gpu.memory`` (MiB), ``nvidia.com/gpu.count``, ``nvidia.com/gpu.compute.major/minor`` and
  ``nvidia.com/cuda.driver.major/minor/rev`` describe the node's physical GPUs.
- ``nvidia.com/mig.strategy``: ``none`` (or absent): every GPU is whole; ``mixed``: allocatable
  ``nvidia.com/gpu`` counts the whole GPUs and each ``nvidia.com/mig-<profile>`` the MIG instances of that
  profile, on the remaining GPUs; ``single``: every GPU is split the same way and the instances are counted
  as ``nvidia.com/gpu``.
- A time-sliced shared resource (``nvidia.com/gpu.shared`` by default) in allocatable makes the node's
  non-MIG GPUs shared, each by ``allocatable / GPUs`` holders (the time-slicing replicas).

Kubernetes counts MIG instances per node, not per GPU, and the NVIDIA device plugin, not gpupool, picks the
physical device. So gpupool lays the counted instances onto the MIG GPUs in legal placements
(:mod:`..pool.mig`), gives every device a synthetic stable UUID (``k8s-<node>-gpu<i>``,
``k8s-<node>-<profile>-<n>``), and places by node and resource name only (:mod:`.resources`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from ..pool.devices import Gpu, GpuMode, MigInstance, Node
from ..pool.mig import Geometry, Placement, fit, geometry, profile_memory_gb
from ..pool.products import PRODUCTS, UnknownProduct, canonical_product, normalize_product

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
LEASE_LABEL = "gpupool.io/lease"  # on every pod gpupool creates for a lease: its own usage, counted by leases
BACKEND_LABEL = "gpupool.io/backend"

PRODUCT = "nvidia.com/gpu.product"
MEMORY = "nvidia.com/gpu.memory"
COUNT = "nvidia.com/gpu.count"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
REPLICAS = "nvidia.com/gpu.replicas"
STRATEGIES = ("none", "single", "mixed")

# Taints GPU nodes carry on purpose and gpupool's pods tolerate; any other NoSchedule/NoExecute taint keeps
# new work off the node.
TOLERATED_TAINTS = frozenset({GPU_RESOURCE})
_BAD_MIG_STATES = {
    "failed": "its MIG reconfiguration failed (nvidia.com/mig.config.state=failed)",
    "pending": "its MIG reconfiguration is pending (nvidia.com/mig.config.state=pending)",
    "rebooting": "it is rebooting to apply a MIG configuration (nvidia.com/mig.config.state=rebooting)",
}
_SEARCH_LIMIT = 20_000  # layout attempts before giving up on a node's MIG counts (real counts need a few)


class NodeLabelError(ValueError):
    """A node whose labels or allocatable resources gpupool cannot read; the message names the node and field."""


@dataclass(frozen=True)
class KubeNode:
    """A Kubernetes node as gpupool sees it: the domain node, how its GPUs are exposed, and whether new work
    may go there (``problem`` says why not, in words; None when it may)."""

    node: Node
    mig_strategy: str
    problem: str | None


# ---- nodes -------------------------------------------------------------------------------------------------


def parse_node(obj: Mapping[str, Any], *, shared_resource: str = SHARED_RESOURCE) -> KubeNode:
    """The domain node for a Node object; :class:`NodeLabelError` when its GPU labels contradict each other.

    The domain node is always built HEALTHY: health changes while the service runs, so it is applied through
    the lease manager's health marks (``problem``), never baked into the pool's fixed node list.
    """
    metadata = _mapping(obj.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise NodeLabelError(f"a Node without metadata.name: {str(obj)[:200]}")
    labels = {str(k): str(v) for k, v in _mapping(metadata.get("labels")).items()}
    status = _mapping(obj.get("status"))
    allocatable = {str(k): str(v) for k, v in _mapping(status.get("allocatable")).items()}
    where = f"node {name}"
    strategy = labels.get(MIG_STRATEGY, "none") or "none"
    if strategy not in STRATEGIES:
        raise NodeLabelError(
            f"{where}: {MIG_STRATEGY} must be one of {', '.join(STRATEGIES)}, got {strategy!r}"
        )
    node = Node(
        name=name,
        cpu_milli=cpu_milli(allocatable.get("cpu", "0"), f"{where}: status.allocatable.cpu"),
        memory_mib=memory_mib(allocatable.get("memory", "0"), f"{where}: status.allocatable.memory"),
        gpus=_gpus(name, labels, allocatable, strategy, shared_resource),
        labels=labels | {BACKEND_LABEL: "kubernetes"},
    )
    return KubeNode(node, strategy, node_problem(obj))


def node_problem(obj: Mapping[str, Any]) -> str | None:
    """Why no new work may go to this node now (NotReady, cordoned, tainted, MIG being reconfigured), as one
    sentence; None when it may."""
    reasons: list[str] = []
    conditions = [c for c in _list(_mapping(obj.get("status")).get("conditions")) if isinstance(c, dict)]
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        reasons.append("it reports no Ready condition")
    elif ready.get("status") != "True":
        said = ": ".join(str(ready[k]) for k in ("reason", "message") if ready.get(k))
        state = (
            "NotReady" if ready.get("status") == "False" else "in an unknown state (its kubelet is silent)"
        )
        reasons.append(f"it is {state}" + (f" ({said})" if said else ""))
    spec = _mapping(obj.get("spec"))
    if spec.get("unschedulable"):
        reasons.append("it is cordoned (spec.unschedulable)")
    for taint in _list(spec.get("taints")):
        if not isinstance(taint, dict) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        key = str(taint.get("key", ""))
        if key in TOLERATED_TAINTS or (
            key == "node.kubernetes.io/unschedulable" and spec.get("unschedulable")
        ):
            continue
        value = f"={taint['value']}" if taint.get("value") else ""
        reasons.append(f"it has the taint {key}{value}:{taint['effect']}")
    labels = _mapping(_mapping(obj.get("metadata")).get("labels"))
    state = str(labels.get(MIG_CONFIG_STATE, ""))
    if state in _BAD_MIG_STATES:
        reasons.append(_BAD_MIG_STATES[state])
    return "; ".join(reasons) or None


def _gpus(
    name: str, labels: dict[str, str], allocatable: dict[str, str], strategy: str, shared_resource: str
) -> tuple[Gpu, ...]:
    where = f"node {name}"
    raw_product = labels.get(PRODUCT)
    mig_counts = {
        key[len(MIG_RESOURCE_PREFIX) :]: _count(value, f"{where}: status.allocatable.{key}")
        for key, value in allocatable.items()
        if key.startswith(MIG_RESOURCE_PREFIX)
    }
    mig_counts = {profile: n for profile, n in mig_counts.items() if n > 0 and strategy == "mixed"}
    whole_alloc = _count(allocatable.get(GPU_RESOURCE, "0"), f"{where}: status.allocatable.{GPU_RESOURCE}")
    shared_alloc = _count(
        allocatable.get(shared_resource, "0"), f"{where}: status.allocatable.{shared_resource}"
    )
    if raw_product is None:
        if whole_alloc or mig_counts or shared_alloc:
            raise NodeLabelError(
                f"{where}: allocatable GPU resources but no {PRODUCT} label; is GPU Feature Discovery running?"
            )
        return ()
    single_profile = None
    if strategy == "single" and "-MIG-" in raw_product.upper():
        single_profile = re.split(r"-MIG-", raw_product, flags=re.IGNORECASE)[1].lower()
    try:
        product = normalize_product(raw_product)
    except UnknownProduct:
        product = canonical_product(raw_product)  # a site's own model: whole GPUs still work
    physical = _count(labels.get(COUNT, "0"), f"{where}: label {COUNT}")
    capability = _version(labels, "nvidia.com/gpu.compute", ("major", "minor"))
    driver = _version(labels, "nvidia.com/cuda.driver", ("major", "minor", "rev")) or _version(
        labels, "nvidia.com/cuda.driver-version", ("major", "minor", "revision")
    )

    def gpu(index: int, mode: GpuMode, instances: Sequence[Placement] = (), shares: int | None = None) -> Gpu:
        uuid = f"k8s-{name}-gpu{index}"
        # The label is the physical GPU's memory, except under the single strategy (a slice's memory).
        labelled = 0 if single_profile else _count(labels.get(MEMORY, "0"), f"{where}: label {MEMORY}")
        memory = labelled or (PRODUCTS[product].memory_mib if product in PRODUCTS else 0)
        return Gpu(
            uuid=uuid,
            index=index,
            product=product,
            memory_mib=memory,
            compute_capability=capability,
            driver_version=driver,
            mode=mode,
            mig_instances=tuple(
                MigInstance("", p.profile, p.start, profile_memory_gb(p.profile) * 1024, uuid)
                for p in instances
            ),
            max_shares=shares,
        )

    if single_profile is not None:
        geo = _geometry(where, product)
        per_gpu = _per_gpu(geo, single_profile, where)
        devices = whole_alloc or physical
        layout = fit(geo, [single_profile] * per_gpu)
        assert layout is not None  # _per_gpu found that many fit
        gpus = [gpu(i, GpuMode.MIG, layout) for i in range(math.ceil(devices / per_gpu))]
        return _name_instances(name, gpus, {single_profile: devices})
    layouts: list[tuple[Placement, ...]] = []
    if mig_counts:
        geo = _geometry(where, product)
        config = labels.get(MIG_CONFIG, "")
        every_gpu = config.startswith("all-") and config != "all-disabled"
        shared_gpus = (
            shared_alloc // _replicas(labels, shared_alloc, physical - whole_alloc) if shared_alloc else 0
        )
        mig_gpus = physical if every_gpu else physical - whole_alloc - shared_gpus
        found = lay_out(geo, mig_counts, max(mig_gpus, 1))
        if found is None:
            counts = ", ".join(f"{n} × {p}" for p, n in sorted(mig_counts.items()))
            raise NodeLabelError(
                f"{where}: allocatable MIG instances ({counts}) do not fit {max(mig_gpus, 1)} {product} GPU(s) "
                f"({COUNT}={physical}, allocatable {GPU_RESOURCE}={whole_alloc})"
            )
        layouts = [layout for layout in found if layout]
    non_mig = max(physical - len(layouts), 0) if physical else whole_alloc
    replicas = _replicas(labels, shared_alloc, non_mig) if shared_alloc else None
    gpus = [gpu(i, GpuMode.SHARED if replicas else GpuMode.WHOLE, shares=replicas) for i in range(non_mig)]
    gpus += [gpu(non_mig + i, GpuMode.MIG, layout) for i, layout in enumerate(layouts)]
    return _name_instances(name, gpus, mig_counts)


def _name_instances(node: str, gpus: list[Gpu], counts: Mapping[str, int]) -> tuple[Gpu, ...]:
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


def _geometry(where: str, product: str) -> Geometry:
    try:
        return geometry(product)
    except ValueError as error:
        raise NodeLabelError(f"{where}: MIG resources on a GPU without MIG geometry: {error}") from None


def _per_gpu(geo: Geometry, profile: str, where: str) -> int:
    """How many instances of ``profile`` one GPU holds under the single strategy (every GPU split alike)."""
    try:
        geo.profile(profile)
    except ValueError as error:
        raise NodeLabelError(f"{where}: label {PRODUCT}: {error}") from None
    count = 1
    while fit(geo, [profile] * (count + 1)) is not None:
        count += 1
    return count


def _replicas(labels: Mapping[str, str], shared_alloc: int, gpus: int) -> int:
    """Holders per shared GPU: the ``nvidia.com/gpu.replicas`` label, else allocatable over the GPUs."""
    raw = labels.get(REPLICAS, "")
    if raw.isdigit() and int(raw) >= 2:
        return int(raw)
    return max(2, shared_alloc // max(gpus, 1))


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


def _version(labels: Mapping[str, str], prefix: str, parts: tuple[str, ...]) -> str:
    """``9.0`` from ``…compute.major``/``…minor``; ``550.54.15`` from the driver's three labels; "" if absent."""
    values = [labels.get(f"{prefix}.{part}", "") for part in parts]
    return ".".join(v for v in values if v) if values[0] else ""


# ---- pods --------------------------------------------------------------------------------------------------


def is_gpu_resource(resource: str, shared_resource: str = SHARED_RESOURCE) -> bool:
    return resource in (GPU_RESOURCE, shared_resource) or resource.startswith(MIG_RESOURCE_PREFIX)


def pod_gpu_requests(pod: Mapping[str, Any], shared_resource: str = SHARED_RESOURCE) -> dict[str, int]:
    """The GPU resources a pod holds: per resource, the larger of its containers' sum and any init
    container's (init containers run one at a time, before the others). Limits count where requests are
    unset: extended resources must have requests equal to limits."""
    spec = _mapping(pod.get("spec"))
    total: Counter[str] = Counter()
    for container in _list(spec.get("containers")):
        total.update(_container_gpus(container, shared_resource))
    for container in _list(spec.get("initContainers")):
        for resource, count in _container_gpus(container, shared_resource).items():
            total[resource] = max(total[resource], count)
    return {resource: count for resource, count in total.items() if count > 0}


def _container_gpus(container: object, shared_resource: str) -> dict[str, int]:
    resources = _mapping(_mapping(container).get("resources"))
    found: dict[str, int] = {}
    for section in ("limits", "requests"):
        for resource, value in _mapping(resources.get(section)).items():
            if is_gpu_resource(str(resource), shared_resource):
                found[str(resource)] = max(found.get(str(resource), 0), _count(str(value), str(resource)))
    return found


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is bound to a node and not finished: what the kubelet still counts against the node."""
    node = _mapping(pod.get("spec")).get("nodeName")
    phase = _mapping(pod.get("status")).get("phase")
    return bool(node) and phase not in ("Succeeded", "Failed")


def external_usage(
    pods: Iterable[Mapping[str, Any]], shared_resource: str = SHARED_RESOURCE
) -> dict[str, dict[str, int]]:
    """Node -> GPU resource -> how many units pods other than gpupool's own hold there. gpupool's own pods
    (labelled ``gpupool.io/lease``) are left out: their leases already count them."""
    usage: dict[str, Counter[str]] = {}
    for pod in pods:
        labels = _mapping(_mapping(pod.get("metadata")).get("labels"))
        if LEASE_LABEL in labels or not holds_resources(pod):
            continue
        requests = pod_gpu_requests(pod, shared_resource)
        if requests:
            usage.setdefault(str(pod["spec"]["nodeName"]), Counter()).update(requests)
    return {node: dict(sorted(counts.items())) for node, counts in usage.items()}


# ---- quantities --------------------------------------------------------------------------------------------

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1), "m": Decimal("0.001"),
    **{s: Decimal(10) ** (3 * (n + 1)) for n, s in enumerate("kMGTPE")},
    **{f"{s}i": Decimal(2) ** (10 * (n + 1)) for n, s in enumerate("KMGTPE")},
}  # fmt: skip
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]*)")


def quantity(raw: str, what: str) -> Decimal:
    """A Kubernetes quantity (``500m``, ``2063554Mi``, ``1e3``) as a number; errors name ``what``."""
    match = _QUANTITY.fullmatch(raw.strip())
    if match is None or match.group(2) not in _SUFFIXES:
        raise NodeLabelError(f"{what}: expected a Kubernetes quantity such as 8, 500m or 64Gi, got {raw!r}")
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation:
        raise NodeLabelError(f"{what}: expected a Kubernetes quantity, got {raw!r}") from None


def cpu_milli(raw: str, what: str) -> int:
    return int(quantity(raw, what) * 1000)


def memory_mib(raw: str, what: str) -> int:
    return int(quantity(raw, what) / 2**20)


def _count(raw: str, what: str) -> int:
    value = quantity(raw, what)
    if value < 0 or value != value.to_integral_value():
        raise NodeLabelError(f"{what}: expected a whole number of devices, got {raw!r}")
    return int(value)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


__all__ = [
    "GPU_RESOURCE",
    "LEASE_LABEL",
    "MIG_RESOURCE_PREFIX",
    "SHARED_RESOURCE",
    "KubeNode",
    "NodeLabelError",
    "external_usage",
    "holds_resources",
    "lay_out",
    "node_problem",
    "parse_node",
    "pod_gpu_requests",
]
