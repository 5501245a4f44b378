"""The most GPU capacity any placement of the arrived tasks could allocate: an upper bound, by LP (HiGHS).

The protocol's figure (the share of GPU capacity allocated once 130% has arrived) means little next to
100%: part of the rest no placement could reach. This bounds the best packing of the arrived tasks into the
cluster, order and the protocol's place-what-fits rule aside, so a policy reads against what was reachable.

Tasks of one shape (CPU, memory, GPUs, milli, allowed products) and nodes of one kind (CPU, memory, GPUs,
products) are counted together: 126 task kinds and 15 node kinds on the default workload, so a bound takes
1–4 s on the full trace. Relaxations, each tighter than the one before and each obeyed by every placement:

- ``liquid``: per node kind, the tasks' CPU, memory and GPU milli fit the kind's totals (GPUs as a liquid);
- ``big-shares``: whole GPUs plus shares above 500 milli fit the kind's GPU count (no two share a GPU);
- ``share-patterns``: each shared GPU holds shares summing to at most 1000 milli, as an arc-flow network
  per node kind (Valério de Carvalho, 1999): the Gilmore–Gomory bin-packing LP, without its columns;
- ``per-node``: the Lagrangian bound at the LP's task prices, each node's best configuration (CPU, memory,
  whole GPUs and the packing of shares on that one node) found by a small MIP; taken if it is lower.

SciPy (HiGHS) is imported only when a bound is asked for: ``pip install 'jupyterhub-gpupool[bench]'``.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..pool.devices import FULL_MILLI, GpuMode, Node
from ..pool.requests import GpuShare, MigSlice, WholeGpus
from .placement import inflate_workload
from .trace import TracePod

RELAXATIONS = ("liquid", "big-shares", "share-patterns", "per-node")
PRICING_SECONDS = 10.0  # per node kind; a MIP stopped early still gives a valid (looser) bound


class BoundUnavailable(ValueError):
    """The bound cannot be computed here: no solver installed, or a cluster it does not model."""


class SolverStopped(BoundUnavailable):
    """HiGHS reached its time limit before it solved an LP."""


@dataclass(frozen=True)
class BoundResult:
    """An upper bound on allocated GPU capacity; percentages are of the cluster's GPU capacity."""

    percent: float  # rounded up, so it never reads below a placement it bounds
    gpus: float  # the same bound in GPUs (thousands of milli), rounded up
    capacity_gpus: int
    demand_percent: float  # GPU demand of the arrived tasks
    relaxation: str
    seconds: float
    tasks: int  # arrived tasks that ask for GPUs
    task_kinds: int
    node_kinds: int

    def as_dict(self) -> dict[str, object]:
        return {
            "percent": self.percent,
            "gpus": self.gpus,
            "capacity_gpus": self.capacity_gpus,
            "demand_percent": self.demand_percent,
            "relaxation": self.relaxation,
            "seconds": self.seconds,
            "tasks": self.tasks,
            "task_kinds": self.task_kinds,
            "node_kinds": self.node_kinds,
        }


@dataclass(frozen=True)
class _TaskKind:
    cpu: int
    memory: int
    gpus: int  # whole GPUs; 0 for a share of one
    milli: int  # per GPU: FULL_MILLI for whole GPUs, else the share
    products: frozenset[str]  # empty allows any

    @property
    def value(self) -> int:
        return self.gpus * FULL_MILLI or self.milli


@dataclass(frozen=True)
class _NodeKind:
    cpu: int
    memory: int
    gpus: int
    products: frozenset[str]

    def hosts(self, task: _TaskKind) -> bool:
        """Whether one task of this kind fits an empty node of this kind."""
        return (
            task.cpu <= self.cpu
            and task.memory <= self.memory
            and max(task.gpus, 1) <= self.gpus
            and (not task.products or bool(task.products & self.products))
        )

    def per_node(self, task: _TaskKind) -> int:
        """The most tasks of a kind one node could hold, by each of its resources alone."""
        gpus = self.gpus // task.gpus if task.gpus else self.gpus * (FULL_MILLI // task.milli)
        return min(
            gpus,
            self.cpu // task.cpu if task.cpu else gpus,
            self.memory // task.memory if task.memory else gpus,
        )


def arrived_tasks(nodes: list[Node], pods: list[TracePod], seed: int, inflate: float = 1.3) -> list[TracePod]:
    """The tasks one run of the protocol sees for ``seed``: the same first draws as ``run_placement``."""
    capacity = sum(len(n.gpus) for n in nodes) * FULL_MILLI
    return inflate_workload(pods, capacity, inflate, random.Random(seed))


def placement_bound(
    nodes: list[Node],
    arrived: Iterable[TracePod],
    relaxation: str = "per-node",
    holding: Iterable[TracePod] = (),
) -> BoundResult:
    """Bound the GPU milli any placement of ``arrived`` on ``nodes`` could allocate, as a percent of capacity.

    CPU-only tasks allocate no GPU and a placement may leave any task out, so they are dropped; a task no
    node kind could hold contributes nothing. ``holding`` (tasks among ``arrived``) bounds only the placements
    that hold at least those tasks: what a run could still have reached with the shares it placed, say. It
    takes the ``share-patterns`` relaxation, whose task prices the per-node step does not account for.
    """
    if relaxation not in RELAXATIONS:
        raise ValueError(f"relaxation must be one of {', '.join(RELAXATIONS)}, got {relaxation!r}")
    began = time.perf_counter()
    demand = _task_kinds(arrived)
    held = _task_kinds(holding)
    if held:
        relaxation = "share-patterns"
        if any(n > demand[t] for t, n in held.items()):
            raise ValueError("holding must be tasks that arrived")
    kinds = _node_kinds(nodes)
    capacity = sum(len(n.gpus) for n in nodes) * FULL_MILLI
    if not capacity:
        raise BoundUnavailable("no node has a GPU: the bound is a share of GPU capacity")
    wanted = sum(t.value * n for t, n in demand.items())
    best = min(float(capacity), float(wanted))
    if demand and kinds:
        value, prices = _aggregate_lp(demand, kinds, relaxation, held)
        if relaxation == "per-node":
            value = min(value, _lagrangian(demand, kinds, prices))
        best = min(best, value)
    return BoundResult(
        percent=math.ceil(best / capacity * 10_000 - 1e-6) / 100,
        gpus=math.ceil(best / 10 - 1e-6) / 100,
        capacity_gpus=capacity // FULL_MILLI,
        demand_percent=round(wanted / capacity * 100, 2),
        relaxation=relaxation,
        seconds=round(time.perf_counter() - began, 2),
        tasks=sum(demand.values()),
        task_kinds=len(demand),
        node_kinds=len(kinds),
    )


def _task_kinds(arrived: Iterable[TracePod]) -> Counter[_TaskKind]:
    return Counter(kind for kind in map(_task_kind, arrived) if kind is not None and kind.value)


def _task_kind(pod: TracePod) -> _TaskKind | None:
    """A pod's kind; CPU-only pods are the kind with no GPUs and no milli. None for what is not modelled."""
    request, need = pod.request, pod.request.gpu
    if isinstance(need, MigSlice):
        raise BoundUnavailable(
            "the bound models whole and time-shared GPUs; a MIG slice task is not modelled"
        )
    if isinstance(need, WholeGpus):
        return _TaskKind(request.cpu_milli, request.memory_mib, need.count, FULL_MILLI, need.products)
    if isinstance(need, GpuShare):
        return _TaskKind(request.cpu_milli, request.memory_mib, 0, need.milli, need.products)
    return _TaskKind(request.cpu_milli, request.memory_mib, 0, 0, frozenset()) if need is None else None


def _node_kinds(nodes: list[Node]) -> Counter[_NodeKind]:
    """Nodes with GPUs, by kind. Modes, share limits and health are left out: more room, still a bound."""
    if any(g.mode is GpuMode.MIG for n in nodes for g in n.gpus):
        raise BoundUnavailable(
            "the bound models whole and time-shared GPUs; MIG-partitioned GPUs are not modelled"
        )
    return Counter(_NodeKind(n.cpu_milli, n.memory_mib, len(n.gpus), n.products) for n in nodes if n.gpus)


class _Model:
    """A maximisation with ``≤`` rows addressed by name, built column by column, solved by HiGHS."""

    def __init__(self) -> None:
        self.limits: dict[Hashable, float] = {}
        self.values: list[float] = []
        self.uppers: list[float] = []
        self.entries: list[tuple[Hashable, int, float]] = []

    def column(self, value: float, coefficients: dict[Hashable, float], upper: float = math.inf) -> int:
        column = len(self.values)
        self.values.append(value)
        self.uppers.append(upper)
        self.entries.extend((row, column, a) for row, a in coefficients.items() if a)
        return column

    def _matrix(self) -> tuple[Any, list[Hashable], Any, Any]:
        np, sparse = _solver("numpy"), _solver("scipy.sparse")
        names = list(self.limits)
        index = {name: i for i, name in enumerate(names)}
        rows, columns, data = zip(*self.entries, strict=True) if self.entries else ((), (), ())
        at = (np.array([index[r] for r in rows], np.int32), np.array(columns, np.int32))
        # 32-bit indices: SciPy 1.11 and 1.12's milp refuse 64-bit ones
        matrix = sparse.coo_array((np.array(data, float), at), shape=(len(names), len(self.values))).tocsr()
        return matrix, names, np.array([self.limits[n] for n in names]), -np.array(self.values)

    def solve_lp(self) -> tuple[float, dict[Hashable, float]]:
        """The LP optimum and each row's price (its dual, ≥ 0)."""
        if not self.values:  # no node could hold any task: nothing can be allocated
            return 0.0, dict.fromkeys(self.limits, 0.0)
        names, result = self._linprog()
        if result.status != 0:
            raise BoundUnavailable(f"HiGHS could not solve the bound's LP: {result.message}")
        return -float(result.fun), {
            n: max(0.0, -float(d)) for n, d in zip(names, result.ineqlin.marginals, strict=True)
        }

    def maximum(self, seconds: float | None = None) -> float | None:
        """The LP optimum, or None where no point meets every row; ``seconds`` limits each HiGHS run."""
        if not self.values:
            return 0.0 if all(limit >= 0 for limit in self.limits.values()) else None
        # interior point first: with it seed 45's work-conserving bound takes 8 minutes, where simplex sat 44 in
        # one LP (another it solves in 16 s against 42); simplex without presolve decides what it leaves
        for method, presolve in (("highs-ipm", True), ("highs", False)):
            _, result = self._linprog(presolve, seconds, method)
            if result.status in (0, 2):
                break
        if result.status == 2:
            return None
        if result.status == 1:
            raise SolverStopped(f"HiGHS did not solve the bound's LP within {seconds:g} s")
        if result.status != 0:
            raise BoundUnavailable(f"HiGHS could not solve the bound's LP: {result.message}")
        return -float(result.fun)

    def _linprog(
        self, presolve: bool = True, seconds: float | None = None, method: str = "highs"
    ) -> tuple[list[Hashable], Any]:
        matrix, names, limits, costs = self._matrix()
        options: dict[str, object] = {"presolve": presolve}
        if seconds is not None:
            options["time_limit"] = seconds
        result = _solver("scipy.optimize").linprog(
            costs,
            A_ub=matrix,
            b_ub=limits,
            bounds=list(zip([0.0] * len(costs), self.uppers, strict=True)),
            method=method,
            options=options,
        )
        return names, result

    def mip_ceiling(self) -> float:
        """An upper bound on the integer optimum: HiGHS's dual bound, so a MIP stopped early still counts."""
        optimize = _solver("scipy.optimize")
        matrix, _, limits, costs = self._matrix()
        result = optimize.milp(
            costs,
            constraints=optimize.LinearConstraint(matrix, -math.inf, limits),
            integrality=[1] * len(costs),
            bounds=optimize.Bounds(0, self.uppers),
            options={"time_limit": PRICING_SECONDS},
        )
        bound = getattr(result, "mip_dual_bound", None)
        return math.inf if bound is None or math.isnan(bound) else -float(bound)


def _solver(module: str) -> Any:
    from importlib import import_module

    try:
        return import_module(module)
    except ImportError:
        raise BoundUnavailable(
            "the bound needs SciPy (its HiGHS solver): pip install 'jupyterhub-gpupool[bench]'"
        ) from None


def _aggregate_lp(
    demand: Counter[_TaskKind],
    kinds: Counter[_NodeKind],
    relaxation: str,
    held: Counter[_TaskKind] | None = None,
) -> tuple[float, dict[_TaskKind, float]]:
    """The cluster LP over task kinds × node kinds; also each task kind's price (its demand row's dual).

    ``held``: task kinds of which at least so many must be placed.
    """
    model = _Model()
    for task, count in demand.items():
        model.limits[task] = count
    for kind, count in kinds.items():
        model.limits.update({(kind, "cpu"): count * kind.cpu, (kind, "memory"): count * kind.memory})
        _add_node_kind(model, kind, count, {t: (float(t.value), None) for t in demand}, relaxation)
    if held:
        # -placed ≤ -held, on every column that places a held kind (the columns its demand row counts)
        model.limits.update({(task, "held"): -count for task, count in held.items()})
        placing = [((row, "held"), column, -a) for row, column, a in model.entries if row in held]
        if len({row for row, _, _ in placing}) < len(held):
            raise BoundUnavailable("a task to hold fits no node of the cluster")
        model.entries.extend(placing)
    value, prices = model.solve_lp()
    return value, {task: prices[task] for task in demand}


@dataclass
class _Columns:
    """A node kind's columns: one placing each task kind it hosts, and its share network's arcs."""

    at: Hashable  # the key of the kind's rows: the kind, or (stage, kind[, part])
    placing: dict[_TaskKind, int] = field(default_factory=dict)
    arcs: list[tuple[int, int, int]] = field(default_factory=list)  # (column, from milli, share milli)


def _add_node_kind(
    model: _Model,
    kind: _NodeKind,
    count: int,
    tasks: dict[_TaskKind, tuple[float, float | None]],
    relaxation: str,
    stage: str | None = None,
    part: str | None = None,
) -> _Columns:
    """Columns for the tasks a node kind could hold (value, and a cap instead of a demand row if given).

    ``stage`` names a second copy of the cluster in one model: its rows are keyed ``(stage, …)``; ``part``
    names a share of the kind's nodes with rows of their own.
    """
    patterns = relaxation in ("share-patterns", "per-node")
    at: Hashable = kind if stage is None else (stage, kind) if part is None else (stage, kind, part)
    model.limits[(at, "gpus")] = count * kind.gpus
    if not patterns:
        model.limits[(at, "milli")] = count * kind.gpus * FULL_MILLI
    sizes, columns = set(), _Columns(at)
    for task, (value, cap) in tasks.items():
        if not kind.hosts(task):
            continue
        use: dict[Hashable, float] = {(at, "cpu"): task.cpu, (at, "memory"): task.memory}
        if cap is None:
            use[task if stage is None else (stage, task)] = 1
        if task.gpus or (not patterns and relaxation != "liquid" and task.milli > FULL_MILLI // 2):
            use[(at, "gpus")] = max(task.gpus, 1)
        if patterns and task.milli and not task.gpus:
            use[(at, "share", task.milli)] = 1
            sizes.add(task.milli)
        elif not patterns:
            use[(at, "milli")] = task.value
        columns.placing[task] = model.column(value, use, math.inf if cap is None else cap)
    if sizes:
        columns.arcs = _add_share_network(model, at, sorted(sizes))
    return columns


def _add_share_network(model: _Model, kind: Hashable, sizes: list[int]) -> list[tuple[int, int, int]]:
    """Arc flow of shared GPUs: a unit of flow is one GPU, an arc from ``i`` to ``i + s`` milli one share of ``s``.

    A GPU's path from 0 adds shares until it stops at most at 1000 milli, so every flow splits into GPUs each
    holding shares that fit it, and the flow leaving 0 is the count of shared GPUs.
    """
    reached, frontier = {0}, [0]
    while frontier:
        frontier = [i + s for i in frontier for s in sizes if i + s <= FULL_MILLI and i + s not in reached]
        reached.update(frontier)
    for size in sizes:
        model.limits[(kind, "share", size)] = 0
    arcs = []
    for start in reached:
        if start:
            model.limits[(kind, "flow", start)] = 0  # leaves start ≤ arrives at start
        for size in (s for s in sizes if start + s <= FULL_MILLI):
            end = start + size
            use: dict[Hashable, float] = {(kind, "share", size): -1}
            use[(kind, "gpus") if start == 0 else (kind, "flow", start)] = 1
            if end + sizes[0] <= FULL_MILLI:
                use[(kind, "flow", end)] = -1
            arcs.append((model.column(0.0, use), start, size))
    return arcs


def _lagrangian(
    demand: Counter[_TaskKind], kinds: Counter[_NodeKind], prices: dict[_TaskKind, float]
) -> float:
    """Σ price × demand + Σ nodes × (best one-node configuration at value − price): a bound for any prices ≥ 0.

    Each node kind's best configuration is a MIP on one node (whole GPUs, share packing, CPU and memory), so
    this is at most the LP's figure at the LP's own prices, and lower where a node's integrality bites.
    """
    total = sum(prices[t] * n for t, n in demand.items())
    for kind, count in kinds.items():
        gains = {
            t: (t.value - prices[t], float(min(demand[t], kind.per_node(t))))
            for t in demand
            if kind.hosts(t) and t.value - prices[t] > 1e-9
        }
        if not gains:
            continue
        model = _Model()
        model.limits.update({(kind, "cpu"): kind.cpu, (kind, "memory"): kind.memory})
        _add_node_kind(model, kind, 1, {t: (gain, cap) for t, (gain, cap) in gains.items()}, "per-node")
        total += count * max(0.0, model.mip_ceiling())
    return total
