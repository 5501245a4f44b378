"""Choosing where the pool comes from: a pool file, this host's GPUs through NVML, or the demo pool."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from ..pool.devices import Node, pool_is_simulated
from .nvml import NvmlUnavailable, discover_node
from .simulated import DEMO_POOL, load_pool_file


@dataclass(frozen=True)
class DiscoveredPool:
    nodes: tuple[Node, ...]
    backend: str  # "simulated", "nvml" or "kubernetes"
    source: str
    note: str = ""  # said once to the admin, e.g. why the demo pool is used

    @property
    def simulated(self) -> bool:
        return pool_is_simulated(self.nodes)

    @property
    def summary(self) -> str:
        """Where the pool came from and its size, "simulated" said out loud where it is."""
        gpus = sum(len(node.gpus) for node in self.nodes)
        kind = self.backend
        if self.simulated:  # a pool file's, or the simulated nodes of gpupool kube up
            kind = "simulated, not real GPUs" if kind == "simulated" else f"{kind}, simulated: not real GPUs"
        return f"pool from {self.source} ({kind}): {len(self.nodes)} nodes, {gpus} GPUs"


class NoRealGpus(RuntimeError):
    """NVML found no driver or no GPUs, and the admin did not ask for a simulated pool."""


def discover_pool(
    pool_file: str | None = None, *, simulated_fallback: bool = True, nvml: ModuleType | None = None
) -> DiscoveredPool:
    """The pool file when given; else this host's GPUs through NVML (``nvml``: pynvml, imported if None).
    With no NVIDIA driver or no GPUs: the simulated demo pool when ``simulated_fallback``, else
    :class:`NoRealGpus` naming NVML's error, so a production hub never serves made-up GPUs."""
    if pool_file is not None:
        return DiscoveredPool(load_pool_file(pool_file), "simulated", pool_file)
    try:
        node = discover_node(nvml=nvml)
        problem = "" if node.gpus else "NVML found no GPUs on this host"
    except NvmlUnavailable as error:
        problem = str(error).rstrip(".")
    if not problem:
        return DiscoveredPool((node,), "nvml", "NVML on this host")
    if not simulated_fallback:
        raise NoRealGpus(
            f"{problem}. No real GPUs, so the service stops rather than serve made-up ones; to run on a "
            "simulated pool on purpose, set GPUPOOL_POOL to a pool file (hub_config/pools/demo.yaml) or "
            "GPUPOOL_SIMULATED_FALLBACK=1"
        )
    note = f"{problem}; showing the simulated demo pool instead."
    return DiscoveredPool(load_pool_file(DEMO_POOL), "simulated", str(DEMO_POOL), note)
