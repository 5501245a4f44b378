"""The simulated backend: a pool of nodes and GPUs declared in a YAML file.

A first-class backend for machines without GPUs, demos, tests and benchmarks. Every node it builds carries
the labels ``gpupool.io/backend: simulated`` and ``gpupool.io/simulated: "true"`` (what every "simulated" label
goes by, :func:`..pool.devices.pool_is_simulated`) so nothing it makes can pass for hardware. UUIDs are derived
from names (uuid5), so a restart on the same file gives the same devices and leases stay valid.

Schema (see ``hub_config/pools/demo.yaml`` for a full example)::

    nodes:                      # required: a non-empty list of at most 10,000; no other top-level fields
      - name: dgx-h100-01       # required, unique: lowercase DNS labels (a-z, 0-9, '-'), may be joined by '.'
        cpu: 112                # required: cores, int or float (0.5 is 500 milli-CPU)
        memory: 2048GiB         # required: "NNNGiB", "NNNMiB", "NTiB" or an integer of MiB
        labels: {rack: r1}      # optional: string keys, scalar values (stored as strings)
        health: healthy         # optional: healthy | unhealthy | drained
        gpus:                   # optional: leave out for a CPU-only node; one product a node
          product: H100-80GB    # required: any spelling products.normalize_product accepts; stored canonical
          count: 8              # required: 1 to 64; GPU memory comes from the product
          nvlink: true          # optional: true (all in NVLink group 0) or index lists, one per group
          compute_capability: "9.0"    # optional: the product's; a known product's own, if given
          driver_version: "550.54.15"  # optional: quote it, or YAML may read it as a number
          cuda_version: "12.4"         # optional: the CUDA the driver supports (default and most: driver's)
        mig:                    # optional: GPU index -> "profile@start" list; no @start: mig.fit places it
          6: [3g.40gb@0, 3g.40gb@4]
        shared:                 # optional: GPU index or "all" -> most holders at once (2-1000); index beats all
          all: 4
        unhealthy: [3]          # optional: GPU indices marked unhealthy

A GPU is MIG, shared or whole, never both MIG and shared. Every problem raises :class:`PoolFileError` naming
the file, the node (by name, or by its position counted from 1 when the name is missing) and the GPU index,
and the loader returns every node or none.
"""

from __future__ import annotations

import math
import re
import uuid
from importlib.resources import files
from pathlib import Path
from typing import Any, NoReturn

from ..files.yaml_fields import check_fields, kind, load_yaml, parse_memory_mib, read_text, required_field
from ..pool.devices import BACKEND_LABEL, FULL_MILLI, SIMULATED_LABEL, Gpu, GpuMode, Health, MigInstance, Node
from ..pool.mig import Placement, fit, geometry, layout_problem, profile_memory_gb, why_not_fit
from ..pool.products import PRODUCTS, UnknownProduct, normalize_product
from ..pool.software import cuda_of_driver, version

DEMO_POOL: Path = Path(str(files("gpupool.hub_config").joinpath("pools", "demo.yaml")))

_TOP_FIELDS = ("nodes",)
MAX_NODES = 10_000  # a pool file is for a lab's machines; a cluster's nodes come from Kubernetes
MAX_GPUS_PER_NODE = 64  # the largest machines hold 16
_LARGEST = 10**12  # beyond any real node; keeps CPU and memory within the pool state's int64 arrays
_NODE_FIELDS = ("name", "cpu", "memory", "labels", "health", "gpus", "mig", "shared", "unhealthy")
_GPU_FIELDS = ("product", "count", "nvlink", "compute_capability", "driver_version", "cuda_version")
_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*")
_MIG_ENTRY = re.compile(r"\s*([^@\s]+)\s*(?:@\s*(\S+)\s*)?")
# Fixed namespace so the same node name and index give the same UUID on every machine and every run.
_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "simulated.gpupool.io")
_COMPUTE_CAPABILITY = {
    "A100-40GB": "8.0", "A100-80GB": "8.0", "A30-24GB": "8.0", "H100-80GB": "9.0", "H100-NVL-94GB": "9.0",
    "GH200-96GB": "9.0", "H200-141GB": "9.0", "B200-180GB": "10.0", "L4-24GB": "8.9", "L40S-48GB": "8.9",
    "A10-24GB": "8.6", "T4-16GB": "7.5", "V100-16GB": "7.0", "V100-32GB": "7.0",
}  # fmt: skip


class PoolFileError(ValueError):
    """A pool file that cannot be read or describes an impossible pool; the message says where and why."""


class _Where:
    """Where in the pool file a value sits, so every message starts the same way."""

    def __init__(self, source: str, node: str | None = None, gpu: int | None = None) -> None:
        self.source, self.node, self.gpu = source, node, gpu

    def at_gpu(self, index: int) -> _Where:
        return _Where(self.source, self.node, index)

    def fail(self, what: str) -> NoReturn:
        where = f"{self.source}: node {self.node}" if self.node else self.source
        where += f", gpu {self.gpu}" if self.gpu is not None else ""
        raise PoolFileError(f"{where}: {what}")


def load_pool_file(path: str | Path) -> tuple[Node, ...]:
    """Read a pool file into nodes; any problem, I/O and YAML included, raises :class:`PoolFileError`."""
    source = str(path)
    data = load_yaml(read_text(path, "pool file", PoolFileError), source, PoolFileError)
    return parse_pool(data, source)


def parse_pool(data: object, source: str) -> tuple[Node, ...]:
    """Build the nodes of an already-parsed pool document; ``source`` is what messages call the file."""
    top = _Where(source)
    if not isinstance(data, dict) or "nodes" not in data:
        top.fail(f"expected a mapping with a 'nodes' list at the top, got {kind(data)}")
    check_fields(top, data, _TOP_FIELDS, " at the top")
    raw_nodes = data["nodes"]
    if not isinstance(raw_nodes, list) or not raw_nodes:
        top.fail(f"'nodes' must be a non-empty list of nodes, got {kind(raw_nodes)}")
    if len(raw_nodes) > MAX_NODES:
        top.fail(f"'nodes' lists {len(raw_nodes)} nodes; a pool file holds at most {MAX_NODES}")
    nodes = tuple(_node(source, position, raw) for position, raw in enumerate(raw_nodes, start=1))
    positions: dict[str, list[int]] = {}
    for position, node in enumerate(nodes, start=1):
        positions.setdefault(node.name, []).append(position)
    for name, seen in positions.items():
        if len(seen) > 1:
            listed = " and ".join(str(p) for p in seen)
            _Where(source, name).fail(f"name is used by nodes {listed}; node names must be unique")
    return nodes


# ---- nodes -----------------------------------------------------------------------------------------------


def _node(source: str, position: int, raw: object) -> Node:
    where = _Where(source, str(position))
    if not isinstance(raw, dict):
        where.fail(f"expected a mapping with name, cpu and memory, got {kind(raw)}")
    name = raw.get("name")
    if isinstance(name, str) and _NAME.fullmatch(name):
        where = _Where(source, name)
    check_fields(where, raw, _NODE_FIELDS)
    if name is None:
        where.fail("missing required field 'name'")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        where.fail(f"name must be a lowercase DNS name such as gpu-a or gpu-a.example.org, got {name!r}")
    return Node(
        name=name,
        cpu_milli=_cpu_milli(where, required_field(where, raw, "cpu")),
        memory_mib=parse_memory_mib(where, required_field(where, raw, "memory"), "512GiB", _LARGEST),
        gpus=_gpus(where, raw),
        labels=_labels(where, raw.get("labels")),
        health=_health(where, raw.get("health", Health.HEALTHY.value)),
    )


def _cpu_milli(where: _Where, value: object) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value < _LARGEST
    ):
        where.fail(f"cpu must be a positive number of cores such as 32 or 0.5, got {value!r}")
    milli = round(value * 1000)
    if milli < 1:
        where.fail(f"cpu must be at least 0.001 cores, got {value!r}")
    return milli


def _labels(where: _Where, value: object) -> dict[str, str]:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        where.fail(f"labels must be a mapping such as {{rack: r1}}, got {kind(value)}")
    labels: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            where.fail(f"label names must be non-empty strings, got {key!r}")
        if key in (BACKEND_LABEL, SIMULATED_LABEL):
            where.fail(f"label {key} is set by the simulated backend; leave it out")
        if isinstance(item, bool):
            labels[key] = "true" if item else "false"
        elif isinstance(item, str | int | float):
            labels[key] = str(item)
        else:
            where.fail(f"label {key!r} must have a string or number value, got {kind(item)}")
    labels |= {BACKEND_LABEL: "simulated", SIMULATED_LABEL: "true"}
    return labels


def _health(where: _Where, value: object) -> Health:
    allowed = [h.value for h in Health]
    if value not in allowed:
        where.fail(f"health must be one of {', '.join(allowed)}, got {value!r}")
    return Health(value)


# ---- GPUs ------------------------------------------------------------------------------------------------


def _gpus(where: _Where, raw: dict[Any, Any]) -> tuple[Gpu, ...]:
    spec = raw.get("gpus")
    if spec is None:
        for field in ("mig", "shared", "unhealthy"):
            if raw.get(field) is not None:
                where.fail(f"{field} needs gpus, and this node declares none")
        return ()
    if not isinstance(spec, dict):
        where.fail(f"gpus must be a mapping with product and count, got {kind(spec)}")
    check_fields(where, spec, _GPU_FIELDS, " in gpus")
    product = _product(where, required_field(where, spec, "product", "gpus.product"))
    count = required_field(where, spec, "count", "gpus.count")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GPUS_PER_NODE:
        where.fail(f"gpus.count must be a whole number from 1 to {MAX_GPUS_PER_NODE}, got {count!r}")
    groups = _nvlink(where, spec.get("nvlink"), count)
    capability, driver, cuda = _software(where, spec, product)
    mig = _mig(where, raw.get("mig"), product, count)
    shared = _shared(where, raw.get("shared"), count, set(mig))
    unhealthy = set(_indices(where, raw.get("unhealthy"), count, "unhealthy"))
    for index in sorted(set(mig) & set(shared)):
        where.at_gpu(index).fail("a GPU cannot be both MIG and shared; drop it from mig or from shared")
    node_name = where.node or ""
    built = []
    for index in range(count):
        gpu_uuid = _gpu_uuid(node_name, index)
        instances = tuple(_mig_instance(gpu_uuid, p) for p in mig.get(index, ()))
        mode = GpuMode.MIG if index in mig else GpuMode.SHARED if index in shared else GpuMode.WHOLE
        built.append(
            Gpu(
                uuid=gpu_uuid,
                index=index,
                product=product,
                memory_mib=PRODUCTS[product].memory_mib,
                compute_capability=capability or _COMPUTE_CAPABILITY.get(product, ""),
                driver_version=driver,
                cuda_version=cuda,
                nvlink_group=groups.get(index),
                mode=mode,
                mig_instances=instances,
                max_shares=shared.get(index),
                health=Health.UNHEALTHY if index in unhealthy else Health.HEALTHY,
            )
        )
    return tuple(built)


def _product(where: _Where, value: object) -> str:
    if not isinstance(value, str):
        where.fail(f"gpus.product must be a product name such as H100-80GB, got {value!r}")
    try:
        return normalize_product(value)
    except UnknownProduct as error:
        where.fail(f"gpus.product: {error}")


def _version(where: _Where, value: object, field: str, pattern: str, example: str) -> str:
    """A version string; a YAML number passes only where reading it as one loses nothing (``9.0``)."""
    if value is None:
        return ""
    lossless = int if field == "driver_version" else int | float  # 535.10 would read as 535.1
    text = str(value) if isinstance(value, lossless) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not re.fullmatch(pattern, text):
        where.fail(f"gpus.{field} must be a quoted version such as {example!r}, got {value!r}")
    return text


def _nvlink(where: _Where, value: object, count: int) -> dict[int, int]:
    """GPU index -> NVLink group."""
    if value is None or value is False:
        return {}
    if value is True:
        return dict.fromkeys(range(count), 0)
    if not isinstance(value, list) or not all(isinstance(group, list) for group in value):
        where.fail(f"gpus.nvlink must be true, false or index lists such as [[0, 1], [2, 3]], got {value!r}")
    groups: dict[int, int] = {}
    for number, group in enumerate(value):
        for index in _indices(where, group, count, "gpus.nvlink"):
            if index in groups:
                where.at_gpu(index).fail(f"gpus.nvlink puts this GPU in groups {groups[index]} and {number}")
            groups[index] = number
    return groups


def _software(where: _Where, spec: dict[Any, Any], product: str) -> tuple[str, str, str]:
    """``compute_capability``, ``driver_version`` and ``cuda_version``, each optional; a capability the product
    does not have, or a CUDA newer than the driver runs, is refused (placement would trust either)."""
    capability = _version(where, spec.get("compute_capability"), "compute_capability", r"\d+\.\d+", "9.0")
    driver = _version(where, spec.get("driver_version"), "driver_version", r"\d+(\.\d+)*", "550.54.15")
    cuda = _version(where, spec.get("cuda_version"), "cuda_version", r"\d+\.\d+", "12.4")
    known = _COMPUTE_CAPABILITY.get(product)
    if capability and known and capability != known:
        where.fail(
            f"gpus.compute_capability: a {product} has {known}, not {capability} (leave it out for {known})"
        )
    most = cuda_of_driver(driver) if driver else None
    if cuda and most and (version(cuda) or ()) > most:
        where.fail(f"gpus.cuda_version: driver {driver} runs CUDA up to {most[0]}.{most[1]}, not {cuda}")
    return capability, driver, cuda


def _mig(where: _Where, value: object, product: str, count: int) -> dict[int, tuple[Placement, ...]]:
    """GPU index -> its MIG instances, each with a start slot, sorted by start."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        where.fail(f"mig must map GPU indices to instances such as {{6: [3g.40gb@0]}}, got {value!r}")
    layouts: dict[int, tuple[Placement, ...]] = {}
    for key, entries in value.items():
        index = _index(where, key, count, "mig")
        at = where.at_gpu(index)
        try:
            geo = geometry(product)
        except ValueError as error:
            at.fail(str(error))
        if not isinstance(entries, list) or not entries:
            at.fail(
                f"mig needs a non-empty list of instances such as [3g.40gb@0, 3g.40gb@4], got {entries!r}"
            )
        fixed: list[Placement] = []
        loose: list[str] = []
        for entry in entries:
            match = _MIG_ENTRY.fullmatch(entry) if isinstance(entry, str) else None
            if match is None or (match.group(2) is not None and not match.group(2).isdigit()):
                at.fail(f"MIG instances are written 'profile@start' such as 3g.40gb@4, got {entry!r}")
            try:
                geo.profile(match.group(1))
            except ValueError as error:
                at.fail(str(error))
            if match.group(2) is None:
                loose.append(match.group(1))
            else:
                fixed.append(Placement(int(match.group(2)), match.group(1)))
        problem = layout_problem(geo, fixed)
        if problem:
            at.fail(problem)
        placed = fit(geo, loose, fixed) if loose else ()
        if placed is None:
            why = why_not_fit(geo, [p.profile for p in fixed] + loose)
            beside = f" next to {', '.join(str(p) for p in fixed)}" if fixed else ""
            at.fail(f"cannot place {', '.join(loose)}{beside} on one {geo.product}: {why}")
        layouts[index] = tuple(sorted((*fixed, *placed)))
    return layouts


def _shared(where: _Where, value: object, count: int, mig: set[int]) -> dict[int, int]:
    """GPU index -> most holders at once; ``all`` means every GPU outside a MIG layout."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        where.fail(f"shared must map GPU indices or 'all' to holder counts such as {{all: 4}}, got {value!r}")
    shares: dict[int, int] = {}
    explicit: dict[int, int] = {}
    for key, holders in value.items():
        if isinstance(holders, bool) or not isinstance(holders, int) or not 2 <= holders <= FULL_MILLI:
            gpu = "" if key == "all" else f" for gpu {key}"
            where.fail(
                f"shared{gpu} must be a whole number of holders from 2 to {FULL_MILLI} (a thousandth of the "
                f"GPU each), got {holders!r}"
            )
        if key == "all":  # every GPU not in a MIG layout
            shares.update(dict.fromkeys((i for i in range(count) if i not in mig), holders))
        else:
            explicit[_index(where, key, count, "shared")] = holders
    return shares | explicit


def _indices(where: _Where, value: object, count: int, field: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list):
        where.fail(f"{field} must be a list of GPU indices such as [0, 3], got {value!r}")
    indices = [_index(where, item, count, field) for item in value]
    if twice := sorted({i for i in indices if indices.count(i) > 1}):
        where.fail(f"{field}: gpu {twice[0]} is listed twice; name each GPU once")
    return indices


def _index(where: _Where, value: object, count: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        where.fail(f"{field}: GPU indices are whole numbers from 0, got {value!r}")
    if not 0 <= value < count:
        where.fail(f"{field}: gpu {value} is out of range; the node has {count}, indices 0-{count - 1}")
    return value


def _gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/{index}')}"


def _mig_instance(gpu_uuid: str, at: Placement) -> MigInstance:
    mig_uuid = f"MIG-{uuid.uuid5(_NAMESPACE, f'{gpu_uuid}/{at.profile}/{at.start}')}"
    return MigInstance(mig_uuid, at.profile, at.start, profile_memory_gb(at.profile) * 1024, gpu_uuid)
