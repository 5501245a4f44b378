"""The pool's invariants on one node: every counter recomputed from the node's allocations alone, so tests
can check the pool after any sequence of operations."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .devices import FULL_MILLI, GpuMode
from .mig import GEOMETRIES, Placement, layout_problem
from .node_state import NodeState, mig_free_milli

if TYPE_CHECKING:
    from .state import Allocation, Grant


def node_problems(ns: NodeState, allocations: list[Allocation]) -> list[str]:
    """What is wrong on one node: the counters must equal what its allocations add up to."""
    node = ns.node
    problems = []
    if set(ns.holders) != {a.owner for a in allocations}:
        problems.append(
            f"{node.name}: holders {sorted(ns.holders)} but allocations {sorted(a.owner for a in allocations)}"
        )
    cpu = sum(a.request.cpu_milli for a in allocations)
    memory = sum(a.request.memory_mib for a in allocations)
    if cpu > node.cpu_milli or cpu != node.cpu_milli - ns.cpu_free:
        problems.append(f"{node.name}: {cpu} CPU milli held of {node.cpu_milli}, {ns.cpu_free} recorded free")
    if memory > node.memory_mib or memory != node.memory_mib - ns.mem_free:
        problems.append(f"{node.name}: {memory} MiB held of {node.memory_mib}, {ns.mem_free} recorded free")
    grants = [(a.owner, g) for a in allocations for g in a.grants]
    for position in range(len(node.gpus)):
        problems += _gpu_problems(ns, position, grants)
    return problems


def _gpu_problems(ns: NodeState, position: int, grants: list[tuple[str, Grant]]) -> list[str]:
    """What is wrong on one GPU: one kind of holder, no more handed out than it has, counters that agree."""
    gpu = ns.node.gpus[position]
    problems = []
    mine = [(owner, g) for owner, g in grants if g.gpu_uuid == gpu.uuid]
    whole = [owner for owner, g in mine if g.kind == "gpu"]
    shares = [g for _, g in mine if g.kind == "share"]
    slices = [g.uuid for _, g in mine if g.kind == "mig"]
    where = f"{ns.node.name} {gpu.label}"
    if len(whole) > 1 or (whole and (shares or slices)):
        problems.append(f"{where}: held whole by {whole} and also shared or sliced")
    if (shares and gpu.mode is not GpuMode.SHARED) or (slices and gpu.mode is not GpuMode.MIG):
        problems.append(f"{where}: a {gpu.mode.value} GPU is shared or sliced")
    if whole and gpu.shares_only:
        problems.append(f"{where}: held whole, though it is only ever handed out in shares")
    milli = FULL_MILLI * len(whole) + sum(g.milli for g in shares)
    if milli > FULL_MILLI:
        problems.append(f"{where}: {milli}/1000 milli handed out")
    if gpu.max_shares is not None and len(shares) > gpu.max_shares:
        problems.append(f"{where}: {len(shares)} holders, at most {gpu.max_shares} allowed")
    if sum(g.memory_mib for g in shares) > gpu.memory_mib:
        problems.append(f"{where}: shares hold more memory than the GPU has")
    if len(set(slices)) != len(slices):
        problems.append(f"{where}: a MIG instance is held twice")
    free_instances = {i for i, m in enumerate(gpu.mig_instances) if m.uuid not in slices}
    if gpu.mode is GpuMode.MIG:
        expected_free = mig_free_milli(gpu, free_instances)
        layout = [Placement(m.start, m.profile) for m in gpu.mig_instances]
        problem = layout_problem(GEOMETRIES[gpu.product], layout)
        if problem:
            problems.append(f"{where}: {problem}")
    else:
        expected_free = FULL_MILLI - milli
    counters = (ns.free[position], ns.share_count[position], ns.mig_free[position])
    if counters != (expected_free, len(shares), free_instances):
        problems.append(f"{where}: counters {counters} disagree with the allocations")
    if ns.share_mem_free[position] != gpu.memory_mib - sum(g.memory_mib for g in shares):
        problems.append(f"{where}: {ns.share_mem_free[position]} MiB recorded free for shares")
    return problems
