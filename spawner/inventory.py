"""The pool as an admin reads it: per node, GPU, MIG slice and share, what exists and what is free."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from .pool.devices import FULL_MILLI, GpuMode, Health, decisive, pool_is_simulated
from .pool.gpu_equivalents import shares_worth
from .pool.state import PoolState


def describe_pool(
    state: PoolState, backend: str, source: str, shown: Callable[[str], str] = str
) -> dict[str, Any]:
    """A JSON-ready inventory of ``state``; ``backend`` ("simulated", "nvml" or "kubernetes") is always shown,
    and ``simulated`` says whether the pool, and each node, is made up. ``shown`` turns each holder (a lease
    id) into what the reader may see of it."""
    nodes = []
    holders_by_device: dict[str, list[str]] = {}
    for allocation in state.allocations.values():
        for grant in allocation.grants:
            holders_by_device.setdefault(grant.uuid, []).append(shown(allocation.owner))
    for ns in state.nodes:
        gpus = []
        for position, gpu in enumerate(ns.gpus):
            gpus.append(
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "product": gpu.product,
                    "memory_mib": gpu.memory_mib,
                    "compute_capability": gpu.compute_capability,
                    "driver_version": gpu.driver_version,
                    "nvlink_group": gpu.nvlink_group,
                    "mode": gpu.mode.value,
                    "max_shares": gpu.max_shares,
                    "health": ns.gpu_health[position].value,
                    "out": _out(ns.health, ns.gpu_health[position]),
                    "free_milli": ns.free[position] if gpu.mode is not GpuMode.MIG else None,
                    "holders": holders_by_device.get(gpu.uuid, []),
                    "mig": [
                        {
                            "uuid": instance.uuid,
                            "profile": instance.profile,
                            "start": instance.start,
                            "memory_mib": instance.memory_mib,
                            "free": index in ns.mig_free[position],
                            "holders": holders_by_device.get(instance.uuid, []),
                        }
                        for index, instance in enumerate(gpu.mig_instances)
                    ],
                }
            )
        nodes.append(
            {
                "name": ns.node.name,
                "simulated": ns.node.simulated,
                "health": ns.health.value,
                "labels": dict(ns.node.labels),
                "cpu_milli": ns.node.cpu_milli,
                "cpu_free_milli": ns.cpu_free,
                "memory_mib": ns.node.memory_mib,
                "memory_free_mib": ns.mem_free,
                "gpus": gpus,
            }
        )
    simulated = pool_is_simulated(ns.node for ns in state.nodes)
    return {
        "backend": backend,
        "simulated": simulated,
        "source": source,
        "summary": _summary(nodes),
        "nodes": nodes,
    }


def _summary(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    gpus = [g for n in nodes for g in n["gpus"]]
    healthy = {n["name"] for n in nodes if n["health"] == "healthy"}
    usable = [g for n in nodes if n["name"] in healthy for g in n["gpus"] if g["health"] == "healthy"]
    mig_free: Counter[str] = Counter(m["profile"] for g in usable for m in g["mig"] if m["free"])
    return {
        "nodes": len(nodes),
        "gpus": len(gpus),
        "whole_gpus_free": sum(
            1 for g in usable if g["mode"] == "whole" and g["free_milli"] == FULL_MILLI and not g["holders"]
        ),
        "mig_slices": sum(len(g["mig"]) for g in gpus),
        "mig_slices_free": dict(sorted(mig_free.items())),
        "shared_gpus": sum(1 for g in gpus if g["mode"] == "shared"),
        "shared_milli_free": sum(g["free_milli"] for g in usable if g["mode"] == "shared"),
        "unhealthy": sorted(
            [n["name"] for n in nodes if n["name"] not in healthy]
            + [f"{n['name']}/gpu{g['index']}" for n in nodes for g in n["gpus"] if g["health"] != "healthy"]
        ),
    }


def render_pool(description: dict[str, Any], holders: Mapping[str, str] | None = None) -> str:
    """The inventory as text for a terminal; ``holders`` names a device's leases (``alice's server``) where
    the caller may know whose they are, else their ids are shown."""
    named = holders or {}

    def held_by(ids: list[str]) -> str:
        return "held by " + ", ".join(named.get(i, i) for i in ids)

    summary = description["summary"]
    kind = description["backend"]
    if description.get("simulated") and kind != "simulated":  # gpupool kube up's nodes
        kind += ", simulated: not real GPUs"
    lines = [f"Pool from {description['source']} ({kind})"]
    mig = ", ".join(f"{p} ×{n}" for p, n in summary["mig_slices_free"].items()) or "none"
    lines.append(
        f"{_count(summary['nodes'], 'node')}, {_count(summary['gpus'], 'GPU')}. Free now: "
        f"{_count(summary['whole_gpus_free'], 'whole GPU')}; MIG slices {mig}; "
        f"{shares_worth(summary['shared_milli_free'])} on "
        f"{_count(summary['shared_gpus'], 'shared GPU')}"
    )
    if summary["unhealthy"]:
        lines.append(f"Out of the pool (unhealthy or drained): {', '.join(summary['unhealthy'])}")
    for node in description["nodes"]:
        lines.append("")
        made_up = "  simulated" if node.get("simulated") else ""
        lines.append(
            f"{node['name']}  [{node['health']}]{made_up}  CPU "
            f"{node['cpu_free_milli'] / 1000:g}/{node['cpu_milli'] / 1000:g} "
            f"free  memory {node['memory_free_mib'] / 1024:g}/{node['memory_mib'] / 1024:g} GiB free"
        )
        for gpu in node["gpus"]:
            out = gpu.get("out")
            lines.append("  " + _gpu_line(gpu, out, held_by))
            for instance in gpu["mig"]:
                state = held_by(instance["holders"]) if not instance["free"] else out or "free"
                lines.append(
                    f"      {instance['profile']:<12} @{instance['start']}  {state}  {instance['uuid']}"
                )
        if not node["gpus"]:
            lines.append("  (no GPUs)")
    return "\n".join(lines)


def _out(node: Health, gpu: Health) -> str | None:
    """What keeps new work off a GPU, its own mark or its node's (a failed or drained node's GPUs take nothing
    new either); None when it takes work."""
    health = decisive((node, gpu))
    return None if health is Health.HEALTHY else health.value


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _gpu_line(gpu: dict[str, Any], out: str | None, held_by: Callable[[list[str]], str]) -> str:
    """One GPU's line; ``out``: the health that keeps new work off it (its own or its node's), if any."""
    link = f"  NVLink {gpu['nvlink_group']}" if gpu["nvlink_group"] is not None else ""
    head = f"GPU {gpu['index']}  {gpu['product']:<14} {gpu['memory_mib'] / 1024:>5.0f} GiB  {gpu['mode']:<6}"
    if out is not None:
        state = out + (f"; {held_by(gpu['holders'])}" if gpu["holders"] else "")
    elif gpu["mode"] == "mig":
        free = sum(1 for m in gpu["mig"] if m["free"])
        state = f"{free}/{len(gpu['mig'])} MIG slices free"
    elif gpu["mode"] == "shared":
        limit = f", up to {gpu['max_shares']} holders" if gpu["max_shares"] else ""
        state = f"{gpu['free_milli'] / 10:g}% free{limit}"
        state += f"; {held_by(gpu['holders'])}" if gpu["holders"] else ""
    else:
        state = "free" if gpu["free_milli"] == FULL_MILLI else held_by(gpu["holders"])
    return f"{head}  {state}{link}  {gpu['uuid']}"
