"""What NVIDIA's GPU Feature Discovery and device plugin publish on a node (label and extended-resource
names), and how gpupool reads their values: Kubernetes quantities and loosely shaped API objects, with errors
that name the bad field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARED_RESOURCE = "nvidia.com/gpu.shared"

PRODUCT = "nvidia.com/gpu.product"
MEMORY = "nvidia.com/gpu.memory"
COUNT = "nvidia.com/gpu.count"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
REPLICAS = "nvidia.com/gpu.replicas"
SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"  # time-slicing or mps, set by GFD on shared GPUs
SHARED_SUFFIX = (
    "-SHARED"  # on gpu.product when shared GPUs keep the name nvidia.com/gpu (renameByDefault: false)
)
STRATEGIES = ("none", "single", "mixed")


def mig_resource(profile: str) -> str:
    """The device plugin's resource for a MIG profile: a resource name cannot hold ``+``, so ``1g.10gb+me``
    is served as ``nvidia.com/mig-1g.10gb.me`` (and ``+gfx`` as ``.gfx``)."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def mig_profile(resource: str) -> str | None:
    """The MIG profile of a ``nvidia.com/mig-…`` resource (``1g.10gb.me`` -> ``1g.10gb+me``); None for others."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    name = resource[len(MIG_RESOURCE_PREFIX) :]
    size, dot, attributes = name.partition("gb.")
    return f"{size}gb+{attributes.replace('.', '+')}" if dot else name


class NodeLabelError(ValueError):
    """A node whose labels or allocatable resources gpupool cannot read; the message names the node and field."""


def label_version(labels: Mapping[str, str], prefix: str, parts: tuple[str, ...]) -> str:
    """``9.0`` from ``…compute.major``/``…minor``; ``550.54.15`` from the driver's three labels; "" if absent."""
    values = [labels.get(f"{prefix}.{part}", "") for part in parts]
    return ".".join(v for v in values if v) if values[0] else ""


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


def device_count(raw: str, what: str) -> int:
    """A whole, non-negative number of devices."""
    value = quantity(raw, what)
    if value < 0 or value != value.to_integral_value():
        raise NodeLabelError(f"{what}: expected a whole number of devices, got {raw!r}")
    return int(value)


def as_mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
