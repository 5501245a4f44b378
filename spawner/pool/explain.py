"""Turning "no node fits" into a sentence a researcher can act on."""

from __future__ import annotations

from collections.abc import Sequence

from .devices import FULL_MILLI, GpuMode, Health, Node
from .mig import profile_memory_gb
from .node_state import NodeState
from .requests import GpuShare, MigSlice, Request, WholeGpus


def explain_refusal(nodes: Sequence[NodeState], request: Request) -> tuple[str, bool]:
    """Why no node can serve ``request`` now, and whether it could never be served by this pool at all."""
    if not any(_empty_and_healthy(ns.node).options(request) for ns in nodes):
        return _never_fits(nodes, request), True
    need = request.gpu
    if need is None:
        return (
            f"no healthy node has {_cpu_memory(request)} free right now",
            False,
        )
    matching = held = unhealthy = free_on_short_node = 0
    for ns in nodes:
        node_short = request.cpu_milli > ns.cpu_free or request.memory_mib > ns.mem_free
        for position, gpu in enumerate(ns.gpus):
            if need.products and gpu.product not in need.products:
                continue
            bad = not ns.healthy or not ns.gpu_ok[position]
            if isinstance(need, MigSlice):
                for index, instance in enumerate(gpu.mig_instances):
                    if need.profile is not None and instance.profile != need.profile:
                        continue
                    if (
                        need.min_memory_gb is not None
                        and profile_memory_gb(instance.profile) < need.min_memory_gb
                    ):
                        continue
                    matching += 1
                    if bad:
                        unhealthy += 1
                    elif index not in ns.mig_free[position]:
                        held += 1
                    elif node_short:
                        free_on_short_node += 1
                continue
            if gpu.mode is GpuMode.MIG or (isinstance(need, GpuShare) and gpu.mode is not GpuMode.SHARED):
                continue
            if isinstance(need, WholeGpus) and gpu.memory_mib < need.min_memory_mib:
                continue
            matching += 1
            wanted = need.milli if isinstance(need, GpuShare) else FULL_MILLI
            if bad:
                unhealthy += 1
            elif ns.free[position] < wanted or (isinstance(need, WholeGpus) and ns.share_count[position]):
                held += 1
            elif node_short:
                free_on_short_node += 1
    what = _device_noun(request)
    parts = [f"{held} of {matching} in use"]
    if unhealthy:
        parts.append(f"{unhealthy} on unhealthy or drained devices")
    if free_on_short_node:
        parts.append(f"{free_on_short_node} free but on nodes without {_cpu_memory(request)} left")
    if isinstance(need, WholeGpus) and need.count > 1:
        return f"no node has {need.count} free {what} together now ({', '.join(parts)})", False
    return f"no {what} is free now ({', '.join(parts)})", False


def _device_noun(request: Request) -> str:
    need = request.gpu
    products = " or ".join(sorted(need.products)) if need is not None and need.products else ""
    if isinstance(need, MigSlice):
        name = need.profile or f"MIG slice of at least {need.min_memory_gb} GB"
        return f"{name} slice on {products}" if products else f"{name} slice"
    if isinstance(need, GpuShare):
        return f"shared {products or 'GPU'} with {need.milli / 10:g}% left"
    return products or "GPU"


def _never_fits(nodes: Sequence[NodeState], request: Request) -> str:
    if not any(
        request.cpu_milli <= ns.node.cpu_milli and request.memory_mib <= ns.node.memory_mib for ns in nodes
    ):
        return f"no node in this pool has {_cpu_memory(request)}"
    need = request.gpu
    if isinstance(need, WholeGpus):
        most = max((len(_empty_and_healthy(ns.node).whole_gpu_candidates(need)) for ns in nodes), default=0)
        return (
            f"this pool has at most {most} {_device_noun(request)} on one node; {need.count} were asked for"
        )
    return f"this pool has no {_device_noun(request)} on a node with {_cpu_memory(request)}"


def _cpu_memory(request: Request) -> str:
    return f"{request.cpu_milli / 1000:g} CPUs and {request.memory_mib / 1024:g} GiB of memory"


def _empty_and_healthy(node: Node) -> NodeState:
    # What the node could do if nothing held it and nothing were broken.
    ideal = NodeState(node, 0)
    ideal.set_health(Health.HEALTHY, dict.fromkeys(range(len(node.gpus)), Health.HEALTHY))
    return ideal
