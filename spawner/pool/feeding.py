"""Fragmentation that also counts GPUs a node's CPU and memory can no longer feed.

FGD's fragment asks, per typical task shape, whether a node could host *one* more such task. A node can pass
that test and still leave GPUs idle for good: 40 cores beside five free GPUs feed only three tasks that want
12 cores each, and a node whose memory is gone feeds none, however many cores it has left. This meter adds
those unfed GPUs to FGD's fragment, at a lower weight, counting only what a fresh node of the same kind could
have fed: a 96-core, 8-GPU node never feeds eight 18-core tasks, and filling it evenly is no damage.

Measured on the Alibaba trace (``benchmarks/results/placement.md``), placing by the change in this measure
allocates more than FGD at 130% of capacity arrived on every workload, most on the CPU-heavy and
model-constrained ones; it refuses some rare very large tasks earlier (README).
"""

from __future__ import annotations

from collections.abc import Sequence

from .fragmentation import GpuView, TaskShape, serves_kind

UNFED_WEIGHT = 0.5
"""How much an unfed free GPU counts against a node, relative to a GPU too full for the task (FGD's 1).

An unfed GPU is not lost for good (a CPU-only task may end, a task wanting few cores may still use it), so
it counts half. At 1.0 the measure over-reacts on the multi-GPU workloads; at 0.5 it beat FGD on all of them.
"""

_PLENTY = 1 << 30


class FeedingMeter:
    """Expected fragmented GPU milli of a node, counting GPUs its CPU and memory cannot feed; memoised."""

    def __init__(self, shapes: Sequence[TaskShape], unfed_weight: float = UNFED_WEIGHT) -> None:
        self.shapes = tuple(shapes)
        self.unfed_weight = unfed_weight
        self._table = [
            (s.cpu_milli, s.memory_mib, s.gpu_milli, s.gpu_count, s.products, s.weight) for s in self.shapes
        ]
        # Many shapes differ only in the GPU models they accept (a hundred-odd on the model-constrained
        # workloads), so what CPU and memory feed is worked out once per distinct (CPU, memory) need.
        self._needs = sorted({(s.cpu_milli, s.memory_mib) for s in self.shapes})
        self._need_of = [self._needs.index((s.cpu_milli, s.memory_mib)) for s in self.shapes]
        self._memo: dict[tuple[object, ...], float] = {}
        self._fed_memo: dict[tuple[int, int, int], tuple[int, ...]] = {}

    def fragment(
        self,
        capacity: tuple[int, int],
        cpu_free: int,
        memory_free: int,
        gpus: Sequence[GpuView],
    ) -> float:
        """Expected fragment of a node of ``capacity`` (CPU milli, memory MiB) with this much still free."""
        key = (capacity, self._fed(cpu_free, memory_free, len(gpus)), tuple(sorted(gpus)))
        cached = self._memo.get(key)
        if cached is None:
            fresh = self._fed(*capacity, limit=_PLENTY)
            cached = self._memo[key] = self._compute(key[1], fresh, key[2])
            if len(self._memo) > 500_000:
                self._memo.clear()
        return cached

    def _fed(self, cpu_free: int, memory_free: int, limit: int) -> tuple[int, ...]:
        """Per shape, how many tasks the CPU and memory feed, capped at ``limit`` (the GPUs: more never help)."""
        key = (cpu_free, memory_free, limit)
        fed = self._fed_memo.get(key)
        if fed is None:
            per_need = [min(_tasks(cpu_free, memory_free, cpu, memory), limit) for cpu, memory in self._needs]
            fed = self._fed_memo[key] = tuple(per_need[need] for need in self._need_of)
            if len(self._fed_memo) > 500_000:
                self._fed_memo.clear()
        return fed

    def _compute(self, fed: Sequence[int], fresh: Sequence[int], gpus: Sequence[GpuView]) -> float:
        total = sum(free for _, free, _ in gpus)
        models = {product for product, _, _ in gpus}
        none_serve: _GpuFit = (0, float(total), [])  # for the shapes wanting models this node lacks
        fits: dict[tuple[int, frozenset[str]], _GpuFit] = {}  # shapes asking the same of a GPU share one
        expected = 0.0
        for (_, _, gpu_milli, gpu_count, products, weight), tasks, fresh_tasks in zip(
            self._table, fed, fresh, strict=True
        ):
            if gpu_count == 0 or tasks == 0:
                expected += weight * total
                continue
            fit = fits.get((gpu_milli, products))
            if fit is None and products and products.isdisjoint(models):
                fit = none_serve
            elif fit is None:
                fit = fits[(gpu_milli, products)] = _gpu_fit(gpus, gpu_milli, products)
            right_kind, fragment, usable = fit
            if len(usable) < gpu_count:
                expected += weight * total
                continue
            never_fed = max(0, right_kind - fresh_tasks * gpu_count)
            unfed = len(usable) - tasks * gpu_count - never_fed
            if unfed > 0:
                usable.sort()  # in place: the shapes sharing this fit read it sorted too
                fragment += self.unfed_weight * sum(usable[:unfed])
            expected += weight * fragment
        return expected


_GpuFit = tuple[int, float, list[int]]
"""How a node's GPUs meet one per-GPU need: how many are of a model and mode that could serve it, the free milli
on those that cannot serve it now, and the free milli of each usable one."""


def _gpu_fit(gpus: Sequence[GpuView], gpu_milli: int, products: frozenset[str]) -> _GpuFit:
    usable: list[int] = []
    fragment = 0.0
    right_kind = 0
    for product, free, shareable in gpus:
        if serves_kind(product, shareable, gpu_milli, products):
            right_kind += 1
            if free >= gpu_milli:
                usable.append(free)
                continue
        fragment += free
    return right_kind, fragment, usable


def _tasks(cpu_free: int, memory_free: int, cpu: int, memory: int) -> int:
    """How many tasks wanting ``cpu`` and ``memory`` fit in what is free (GPUs aside)."""
    by_cpu = cpu_free // cpu if cpu else _PLENTY
    by_memory = memory_free // memory if memory else _PLENTY
    return min(by_cpu, by_memory)
