"""Choosing where the pool comes from: a pool file, this host's GPUs through NVML, or the demo pool."""

from __future__ import annotations

from dataclasses import dataclass

from ..pool.devices import Node
from .nvml import NvmlUnavailable, discover_node
from .simulated import DEMO_POOL, load_pool_file


@dataclass(frozen=True)
class DiscoveredPool:
    nodes: tuple[Node, ...]
    backend: str  # "simulated" or "nvml"
    source: str
    note: str = ""  # said once to the admin, e.g. why the demo pool is used


def discover_pool(pool_file: str | None = None) -> DiscoveredPool:
    """The pool file when given; else this host's GPUs; else, with no NVIDIA driver, the simulated demo pool."""
    if pool_file is not None:
        return DiscoveredPool(load_pool_file(pool_file), "simulated", pool_file)
    try:
        node = discover_node()
    except NvmlUnavailable as error:
        note = f"{error}; showing the simulated demo pool instead."
        return DiscoveredPool(load_pool_file(DEMO_POOL), "simulated", str(DEMO_POOL), note)
    if not node.gpus:
        note = "NVML found no GPUs on this host. Showing the simulated demo pool instead."
        return DiscoveredPool(load_pool_file(DEMO_POOL), "simulated", str(DEMO_POOL), note)
    return DiscoveredPool((node,), "nvml", "NVML on this host")
