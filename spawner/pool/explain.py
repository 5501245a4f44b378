"""Turning "no node fits" into a sentence a researcher can act on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from .devices import GpuMode, Health, Node
from .node_state import NodeState, gpu_kind_matches, instance_matches
from .products import mib_to_marketed_gb
from .requests import GpuNeed, GpuShare, MigSlice, Request, WholeGpus
from .software import ANY_SOFTWARE


def explain_refusal(nodes: Sequence[NodeState], request: Request) -> tuple[str, bool]:
    """Why no node can serve ``request`` now, and whether it could never be served by this pool at all."""
    if not any(_empty_and_healthy(ns.node).options(request) for ns in nodes):
        return _never_fits(nodes, request), True
    need = request.gpu
    if need is None:
        return f"no healthy node has {_cpu_memory(request)} free right now", False
    # Every device of the right kind, by why it cannot be used now.
    reasons: Counter[str] = Counter()
    short = f"free but on nodes without {_cpu_memory(request)} left"
    for ns in nodes:
        node_short = short if request.cpu_milli > ns.cpu_free or request.memory_mib > ns.mem_free else None
        for position, gpu in enumerate(ns.gpus):
            if not gpu_kind_matches(gpu, need):
                continue
            if isinstance(need, MigSlice):
                for index, instance in enumerate(gpu.mig_instances):
                    if instance_matches(instance, need):
                        busy = None if index in ns.mig_free[position] else "in use"
                        reasons[_reason(ns, position, busy, node_short)] += 1
            else:
                reasons[_reason(ns, position, ns.gpu_busy_reason(position, need), node_short)] += 1
    total = sum(reasons.values())
    parts = [f"{reasons.pop('in use', 0)} of {total} in use"]
    if "free" in reasons:  # free devices that only a busier node holds: not enough on one node together
        parts.append(f"{reasons.pop('free')} free but not enough on one node")
    parts += [f"{count} {why}" for why, count in sorted(reasons.items())]
    what = _device_noun(request)
    if isinstance(need, WholeGpus) and need.count > 1:
        return f"no node has {need.count} free {what} together now ({', '.join(parts)})", False
    return f"no {what} is free now ({', '.join(parts)})", False


def _reason(ns: NodeState, position: int, busy: str | None, node_short: str | None) -> str:
    if not ns.healthy:
        return f"on {ns.health.value} nodes"
    if not ns.gpu_ok[position]:
        return ns.gpu_health[position].value
    if busy is not None:
        return busy
    return node_short or "free"


def _device_noun(request: Request) -> str:
    need = request.gpu
    products = " or ".join(sorted(need.products)) if need is not None and need.products else ""
    if isinstance(need, MigSlice):
        name = f"{need.profile} slice" if need.profile else f"MIG slice of at least {need.min_memory_gb} GB"
        return f"{name} on {products}" if products else name
    if isinstance(need, GpuShare):
        memory = f" and {need.memory_mib / 1024:g} GiB" if need.memory_mib else ""
        return f"shared {products or 'GPU'} with {need.milli / 10:g}%{memory} left"
    if isinstance(need, WholeGpus) and need.min_memory_mib:
        return f"{products or 'GPU'} with at least {mib_to_marketed_gb(need.min_memory_mib):g} GB"
    return products or "GPU"


def _never_fits(nodes: Sequence[NodeState], request: Request) -> str:
    if not nodes:
        return "the pool has no nodes"
    if not any(
        request.cpu_milli <= ns.node.cpu_milli and request.memory_mib <= ns.node.memory_mib for ns in nodes
    ):
        return _too_big(nodes, request)
    need = request.gpu
    if need is not None and need.software:
        short = _software_shortfall(nodes, request, need)
        if short:
            return short
    if isinstance(need, WholeGpus):
        most = max((len(_empty_and_healthy(ns.node).whole_gpu_candidates(need)) for ns in nodes), default=0)
        if most:
            return f"this pool has at most {most} {_device_noun(request)} on one node; {need.count} were asked for"
        whole = sorted({g.product for ns in nodes for g in ns.gpus if g.mode is not GpuMode.MIG})
        in_mig = sorted({g.product for ns in nodes for g in ns.gpus if g.mode is GpuMode.MIG} - set(whole))
        mig_note = f"; its {', '.join(in_mig)} are in MIG mode, slices only" if in_mig else ""
        return (
            f"this pool has no {_device_noun(request)} to give whole; it has {', '.join(whole) or 'no whole GPUs'}"
            + mig_note
        )
    if isinstance(need, MigSlice):
        profiles = sorted({m.profile for ns in nodes for g in ns.gpus for m in g.mig_instances})
        return f"this pool has no {_device_noun(request)}; its MIG slices are {', '.join(profiles) or 'none'}"
    if isinstance(need, GpuShare) and need.memory_mib:
        shared = [
            g.memory_mib
            for ns in nodes
            for g in ns.gpus
            if g.mode is GpuMode.SHARED and (not need.products or g.product in need.products)
        ]
        largest = max(shared, default=0)
        if shared and need.memory_mib > largest:
            return (
                f"a share with {need.memory_mib / 1024:g} GiB is more than any "
                f"{' or '.join(sorted(need.products)) or 'GPU'} here has ({largest / 1024:g} GiB at most)"
            )
    return f"this pool has no {_device_noun(request)} on a node with {_cpu_memory(request)}"


def _too_big(nodes: Sequence[NodeState], request: Request) -> str:
    """Which of CPU and memory no node has: ``no node in this pool has 1024 GiB of memory (at most 512)``."""
    cpus = max(ns.node.cpu_milli for ns in nodes)
    memory = max(ns.node.memory_mib for ns in nodes)
    if request.cpu_milli <= cpus and request.memory_mib <= memory:  # each fits somewhere, never together
        return f"no node in this pool has {_cpu_memory(request)}"
    if request.cpu_milli > cpus:
        return f"no node in this pool has {request.cpu_milli / 1000:g} CPUs (at most {cpus / 1000:g})"
    return f"no node in this pool has {request.memory_mib / 1024:g} GiB of memory (at most {memory / 1024:g})"


def _software_shortfall(nodes: Sequence[NodeState], request: Request, need: GpuNeed) -> str | None:
    """When only the CUDA version or compute capability stands in the way: each node's reason, e.g. ``needs
    CUDA 12.4; the A100-40GB's driver 535.104.05 supports up to 12.2 (on a100-01)``."""
    any_need = replace(need, software=ANY_SOFTWARE)
    any_software = replace(request, gpu=any_need)
    said: dict[str, list[str]] = {}
    for ns in nodes:
        if _empty_and_healthy(ns.node).options(any_software):
            for gpu in ns.gpus:
                why = need.software.refusal(gpu) if gpu_kind_matches(gpu, any_need) else None
                if why is not None and ns.node.name not in said.setdefault(why, []):
                    said[why].append(ns.node.name)
    return "; ".join(f"{why} (on {', '.join(names)})" for why, names in said.items()) or None


def _cpu_memory(request: Request) -> str:
    return f"{request.cpu_milli / 1000:g} CPUs and {request.memory_mib / 1024:g} GiB of memory"


def _empty_and_healthy(node: Node) -> NodeState:
    # What the node could do if nothing held it and nothing were broken.
    ideal = NodeState(node, 0)
    ideal.set_health(Health.HEALTHY, dict.fromkeys(range(len(node.gpus)), Health.HEALTHY))
    return ideal
