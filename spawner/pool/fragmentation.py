"""GPU fragmentation as the FGD paper measures it (Weng et al., USENIX ATC '23).

A node's free GPU capacity is *fragmented for* a typical task when that task could not use it: the node
cannot host the task at all (then all its free GPU capacity counts), or the free capacity sits on GPUs too
full for the task (then those GPUs count). Weighting by how common each task shape is gives the node's
expected fragment; placing a task where it grows that the least keeps the pool usable.
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from .devices import FULL_MILLI, GpuMode
from .node_state import NodeState
from .requests import GpuShare, Request, WholeGpus

GpuView = tuple[str, int, bool]
"""What fragmentation sees of a GPU: product, free milli, and whether it may be shared."""


def gpu_views(node: NodeState, free: Sequence[int] | None = None) -> list[GpuView]:
    """The node's GPUs as fragmentation sees them (``free`` overrides the current free milli).

    MIG GPUs are left out: their instances are fixed, so no placement elsewhere changes what they can serve.
    """
    free = node.free if free is None else free
    return [
        (gpu.product, free[p], gpu.mode is GpuMode.SHARED)
        for p, gpu in enumerate(node.gpus)
        if gpu.mode is not GpuMode.MIG
    ]


Shape = tuple[int, int, int, frozenset[str]]
"""What :func:`shape_of` tells tasks apart by: CPU milli, GPU milli per GPU, GPU count, allowed products."""

Tally = dict[Shape, Counter[int]]
"""Tasks counted by shape, and within a shape by memory MiB."""

TYPICAL_COVERAGE = 0.95
"""The share of tasks the typical shapes cover, as in the paper's simulator.

The rarest shapes are left out on purpose. A policy learning every shape it had seen (1.0) allocated 0.11 less
over the 24 workloads of the trace (95.59 against 95.77 on default, seeds 42–51), and each shape is scored on
every node a decision looks at.
"""


def serves_kind(product: str, shareable: bool, gpu_milli: int, products: frozenset[str]) -> bool:
    """Whether a GPU of this product and mode could ever serve a task wanting ``gpu_milli`` of one GPU."""
    return (not products or product in products) and (shareable or gpu_milli == FULL_MILLI)


@dataclass(frozen=True)
class TaskShape:
    """A kind of task, by what it asks of one node, and how common it is.

    Shapes are told apart by CPU and GPUs only, as the FGD paper does; ``memory_mib`` is the median memory of
    the tasks of that shape, which FGD ignores and :mod:`.feeding` reads.
    """

    cpu_milli: int
    gpu_milli: int  # per GPU
    gpu_count: int
    products: frozenset[str]
    weight: float = 1.0
    memory_mib: int = 0


def shape_of(request: Request) -> Shape:
    need = request.gpu
    if isinstance(need, WholeGpus):
        return (request.cpu_milli, FULL_MILLI, need.count, need.products)
    if isinstance(need, GpuShare):
        return (request.cpu_milli, need.milli, 1, need.products)
    return (request.cpu_milli, 0, 0, frozenset())


def tally(requests: Iterable[Request], into: Tally | None = None) -> Tally:
    """Count ``requests`` by shape and memory (added to ``into`` when given)."""
    counts: Tally = {} if into is None else into
    for request in requests:
        counts.setdefault(shape_of(request), Counter())[request.memory_mib] += 1
    return counts


def typical_shapes(requests: Iterable[Request], coverage: float = TYPICAL_COVERAGE) -> tuple[TaskShape, ...]:
    """The most common task shapes that together make up ``coverage`` of ``requests``, with weights."""
    return shapes_of(tally(requests), coverage)


def shapes_of(counts: Tally, coverage: float = TYPICAL_COVERAGE) -> tuple[TaskShape, ...]:
    """The most common shapes of a tally that together make up ``coverage`` of its tasks, with weights.

    Shapes are taken most common first (ties: larger CPU, GPU share, GPU count, then products) until the
    running count reaches ``coverage``; the shape that crosses the line is kept, as the paper's simulator does.
    Each shape's memory is the median of its tasks'.
    """
    sized = [(shape, sum(memory.values())) for shape, memory in counts.items()]
    ordered = sorted(
        sized, key=lambda item: (item[1], *item[0][:3], ",".join(sorted(item[0][3]))), reverse=True
    )
    total = sum(count for _, count in sized)
    kept: list[tuple[Shape, int]] = []
    running = 0
    for shape, count in ordered:
        kept.append((shape, count))
        running += count
        if running >= coverage * total:
            break
    kept_total = sum(count for _, count in kept)
    return tuple(
        TaskShape(*shape, weight=count / kept_total, memory_mib=_median(counts[shape]))
        for shape, count in kept
    )


MIX_TOLERANCE = 0.1
"""How far a learned mix may move (the sum of its shapes' weight changes) before the policy re-reads it.

Re-reading empties the memoised fragments, so the decisions after it are slow. Once a mix has settled, each
doubling of the count moves its weights by a few percent and swaps a few of its rarest shapes: re-reading
that bought nothing. On the default workload the worst decision p99 of seeds 42–51 was 3.6 ms re-reading at
every doubling and 2.6 ms with this tolerance, at the same allocation (``benchmarks/learned_mix.py``). A mix of
a hundred-odd shapes moves more (0.16–0.22 a doubling on gpuspec33); 0.4 spared those reads too, but kept early
mixes that later counts would have corrected (−0.08 on default), so the tolerance stays low.
"""


def same_mix(new: Sequence[TaskShape], old: Sequence[TaskShape]) -> bool:
    """Whether ``new`` weighs the shapes as ``old`` does, to within :data:`MIX_TOLERANCE` in all."""
    weights: dict[TaskShape, float] = {}
    for sign, shapes in ((-1, old), (1, new)):
        for shape in shapes:
            unweighted = replace(shape, weight=1.0)
            weights[unweighted] = weights.get(unweighted, 0.0) + sign * shape.weight
    return sum(abs(change) for change in weights.values()) <= MIX_TOLERANCE


def _median(values: Counter[int]) -> int:
    # The median (rounded down) of values given as value -> how many times it occurs.
    return int(statistics.median(values.elements()))


class FragmentMeter:
    """Expected fragmented GPU milli of a node state, memoised: clusters repeat the same states a lot."""

    def __init__(self, shapes: Sequence[TaskShape]) -> None:
        self.shapes = tuple(shapes)
        self._cpu_steps = sorted({s.cpu_milli for s in self.shapes})
        # Per shape: how many CPU steps a node must reach for it, its GPU need, and its weight.
        self._table = [
            (bisect_right(self._cpu_steps, s.cpu_milli), s.gpu_milli, s.gpu_count, s.products, s.weight)
            for s in self.shapes
        ]
        self._memo: dict[tuple[int, tuple[GpuView, ...]], float] = {}
        self._unfillable = _unfillable_table(
            sorted({s.gpu_milli for s in self.shapes if 0 < s.gpu_milli < FULL_MILLI})
        )

    def unfillable(self, free_milli: int) -> int:
        """Milli of a GPU with ``free_milli`` free that no combination of typical shares can fill."""
        return self._unfillable[max(0, min(free_milli, FULL_MILLI))]

    def fragment(self, cpu_free: int, gpus: Sequence[GpuView]) -> float:
        """Expected fragment of a node with ``cpu_free`` CPU milli and these GPUs (see :func:`gpu_views`)."""
        key = (bisect_right(self._cpu_steps, cpu_free), tuple(sorted(gpus)))
        cached = self._memo.get(key)
        if cached is None:
            cached = self._memo[key] = self._compute(key[0], key[1])
            if len(self._memo) > 500_000:
                self._memo.clear()
        return cached

    def _compute(self, cpu_step: int, gpus: tuple[GpuView, ...]) -> float:
        total = sum(free for _, free, _ in gpus)
        expected = 0.0
        for needed_step, gpu_milli, gpu_count, products, weight in self._table:
            if gpu_count == 0 or cpu_step < needed_step:
                expected += weight * total
                continue
            usable = 0
            fragment = 0
            for product, free, shareable in gpus:
                if free >= gpu_milli and serves_kind(product, shareable, gpu_milli, products):
                    usable += 1
                else:
                    fragment += free
            expected += weight * (fragment if usable >= gpu_count else total)
        return expected


def _unfillable_table(share_sizes: list[int]) -> list[int]:
    # Unbounded knapsack over the typical share sizes: best[f] is the most of f that shares can fill.
    best = [0] * (FULL_MILLI + 1)
    for free in range(1, FULL_MILLI + 1):
        best[free] = max((size + best[free - size] for size in share_sizes if size <= free), default=0)
    table = [free - best[free] for free in range(FULL_MILLI + 1)]
    table[FULL_MILLI] = 0  # an untouched GPU also serves whole-GPU tasks
    return table
