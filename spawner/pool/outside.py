"""Which free devices of a node stand for the work gpupool did not place: the backend counts whole GPUs, MIG
instances and GPU shares held by other workloads, not which devices, so free ones of each kind are held in
their stead, whatever their health."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .devices import FULL_MILLI, GpuMode
from .node_state import NodeState, Option, gpu_kind_matches
from .requests import GpuShare, MigSlice, Request, WholeGpus

if TYPE_CHECKING:
    from .state import OutsideUse

Hold = Callable[[Request, Option], object]


def hold_outside_use(ns: NodeState, use: OutsideUse, hold: Hold) -> list[str]:
    """Hold ``use`` on the node's free devices, one device per ``hold`` call; what did not fit, in words."""
    return [
        *_hold_whole_gpus(ns, use.whole_gpus, hold),
        *_hold_mig_instances(ns, use.mig, hold),
        *_hold_shares(ns, use.shares, hold),
    ]


def _hold_whole_gpus(ns: NodeState, count: int, hold: Hold) -> list[str]:
    whole = WholeGpus(1)
    free = [
        p
        for p, gpu in enumerate(ns.gpus)
        if gpu_kind_matches(gpu, whole) and ns.gpu_busy_reason(p, whole, ignore_health=True) is None
    ]
    for position in free[:count]:
        hold(Request(0, 0, whole), (position,))
    return [f"{count - len(free)} whole GPU(s)"] if count > len(free) else []


def _hold_mig_instances(ns: NodeState, counts: Mapping[str, int], hold: Hold) -> list[str]:
    """Free instances of each profile (``"*"``: of any profile)."""
    missing = []
    for profile, count in sorted(counts.items()):
        instances = [
            (p, i, m.profile)
            for p, gpu in enumerate(ns.gpus)
            for i, m in enumerate(gpu.mig_instances)
            if i in ns.mig_free[p] and profile in ("*", m.profile)
        ]
        for position, index, name in instances[:count]:
            hold(Request(0, 0, MigSlice(profile=name)), (position, index))
        if count > len(instances):
            missing.append(f"{count - len(instances)} MIG {profile} instance(s)")
    return missing


def _hold_shares(ns: NodeState, count: int, hold: Hold) -> list[str]:
    """One share at a time of a shared GPU with room, the size a full GPU's holders would each have."""
    shares = [
        (GpuShare(max(1, FULL_MILLI // (gpu.max_shares or 10))), position)
        for position, gpu in enumerate(ns.gpus)
        if gpu.mode is GpuMode.SHARED
    ]
    for held in range(count):
        spot = next(
            ((share, p) for share, p in shares if not ns.gpu_busy_reason(p, share, ignore_health=True)),
            None,
        )
        if spot is None:
            return [f"{count - held} GPU share(s)"]
        hold(Request(0, 0, spot[0]), (spot[1],))
    return []
