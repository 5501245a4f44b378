"""Placement policies: given the nodes that could serve a request, choose one node and its devices.

Every policy sits behind :class:`PlacementPolicy` and is chosen by name (:func:`policy_by_name`).
Scores are "higher is better"; equal scores go to the node with the lower rank, so runs repeat exactly.

- ``first-fit``  the first node (by rank) with enough free devices: counting only, the naive baseline.
- ``spread``     Kubernetes' default: the node with the most CPU and memory left (LeastAllocated).
- ``best-fit``   the node that would have the least CPU and GPU left: packs tightly.
- ``random``     a uniformly random node and GPU among those that fit.
- ``fgd``        Fragmentation Gradient Descent (Weng et al., ATC '23): least growth in expected fragment.
- ``gpupool``    our default: FGD's gradient over a fragment that also counts GPUs left without CPU or
                 memory to feed them and charges for models that model-constrained tasks need; a share goes
                 to the GPU whose leftover can still be filled.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, ClassVar

from .devices import FULL_MILLI, GpuMode
from .feeding import FeedingMeter
from .fragmentation import (
    FragmentMeter,
    Tally,
    TaskShape,
    gpu_views,
    same_mix,
    shapes_of,
    tally,
    typical_shapes,
)
from .mig import profile_memory_gb
from .model_pressure import PRESSURE_WEIGHT, model_pressure
from .node_state import NodeState, Option
from .requests import GpuShare, MigSlice, Request

if TYPE_CHECKING:
    from .state import PoolState

Candidates = Sequence[tuple[NodeState, list[Option]]]
Score = tuple[float, ...]
"""Higher is better, compared element by element: later elements break ties of earlier ones."""


class UnknownPolicy(ValueError):
    """A policy name that is not registered."""


class PlacementPolicy(ABC):
    """Chooses where a request goes among the nodes that could serve it."""

    name: ClassVar[str]
    sees_every_node: ClassVar[bool] = False
    """False: nodes in equal states are offered once, by their lowest-ranked node (see PoolState)."""

    def prepare(self, state: PoolState) -> None:  # noqa: B027 - optional hook
        """Called when a pool is built or renumbers its nodes' states, before any :meth:`select`."""

    @abstractmethod
    def select(self, request: Request, candidates: Candidates) -> tuple[NodeState, Option]:
        """The node and devices to use; ``candidates`` is never empty."""


class ScoringPolicy(PlacementPolicy):
    """A policy that scores each candidate node and takes the best (ties: lowest rank)."""

    def __init__(self) -> None:
        # request key -> node key -> (score, option); see memo_keys
        self._memo: dict[object, dict[object, tuple[Score, Option]]] = {}
        self._memo_size = 0

    def forget_scores(self) -> None:
        self._memo.clear()
        self._memo_size = 0

    def prepare(self, state: PoolState) -> None:
        # State ids belong to one pool and are renumbered when it starts its caches afresh.
        self.forget_scores()

    def select(self, request: Request, candidates: Candidates) -> tuple[NodeState, Option]:
        best: tuple[Score, int, NodeState, Option] | None = None
        if self._memo_size > 1_000_000:
            self.forget_scores()
        request_key, node_key = self.memo_keys(request)
        memo = self._memo.get(request_key)
        if memo is None:
            memo = self._memo[request_key] = {}
        for node_state, options in candidates:
            key = node_key(node_state)
            scored = memo.get(key)
            if scored is None:
                scored = memo[key] = self.score(node_state, request, options)
                self._memo_size += 1
            score, option = scored
            if best is None or score > best[0] or (score == best[0] and node_state.rank < best[1]):
                best = (score, node_state.rank, node_state, option)
        assert best is not None
        return best[2], best[3]

    def memo_keys(self, request: Request) -> tuple[object, Callable[[NodeState], object]]:
        """What a score depends on: a key for the request and a key function for nodes.

        Equal keys must mean equal scores and options. The default is the whole request and the node's whole
        state; a policy that ignores memory says so here and shares its scores among more nodes.
        """
        return request, _state_id

    @abstractmethod
    def score(self, node: NodeState, request: Request, options: list[Option]) -> tuple[Score, Option]:
        """How good ``node`` is for ``request`` (comparable across nodes) and which option to use there."""


# Key functions for the memo, read once per candidate node and decision: attrgetter runs in C.
_state_id: Callable[[NodeState], object] = attrgetter("state_id")
_cpu_and_devices: Callable[[NodeState], object] = attrgetter("cpu_free", "gpu_state_id")


class IgnoresMemory:
    """Mixin for scoring policies whose scores read CPU and devices but never memory."""

    def memo_keys(self, request: Request) -> tuple[object, Callable[[NodeState], object]]:
        return (request.cpu_milli, request.gpu), _cpu_and_devices


def tightest_option(node: NodeState, request: Request, options: list[Option]) -> Option:
    """The option that leaves the least stranded: the fullest shared GPU, the smallest fitting MIG slice."""
    if isinstance(request.gpu, MigSlice):
        return min(
            options,
            key=lambda o: (
                profile_memory_gb(node.gpus[o[0]].mig_instances[o[1]].profile),
                node.free[o[0]],
                o,
            ),
        )
    if isinstance(request.gpu, GpuShare):
        return min(options, key=lambda o: (node.free[o[0]], o))
    return options[0]


class FirstFit(IgnoresMemory, ScoringPolicy):
    name = "first-fit"

    def score(self, node: NodeState, request: Request, options: list[Option]) -> tuple[Score, Option]:
        return (0,), options[0]


class Spread(ScoringPolicy):
    """Kubernetes' LeastAllocated score over CPU and memory, as an integer 0-100."""

    name = "spread"

    def score(self, node: NodeState, request: Request, options: list[Option]) -> tuple[Score, Option]:
        cpu = (node.cpu_free - request.cpu_milli) * 100 // max(node.node.cpu_milli, 1)
        memory = (node.mem_free - request.memory_mib) * 100 // max(node.node.memory_mib, 1)
        option = max(options, key=lambda o: (node.free[o[0]] if o else 0, [-p for p in o]))
        return ((cpu + memory) // 2,), option


class BestFit(IgnoresMemory, ScoringPolicy):
    """The node with the least CPU and GPU left afterwards, each normalised by the pool's largest node."""

    name = "best-fit"

    def prepare(self, state: PoolState) -> None:
        super().prepare(state)
        self._cpu_scale = max((ns.node.cpu_milli for ns in state.nodes), default=1) or 1
        self._gpu_scale = max((len(ns.gpus) for ns in state.nodes), default=1) * FULL_MILLI or FULL_MILLI

    def score(self, node: NodeState, request: Request, options: list[Option]) -> tuple[Score, Option]:
        cpu_left = node.cpu_free - request.cpu_milli
        gpu_left = sum(node.free) - request.gpu_milli
        raw = 100 * (1 - 0.5 * cpu_left / self._cpu_scale - 0.5 * gpu_left / self._gpu_scale)
        return (math.floor(raw),), tightest_option(node, request, options)


class RandomFit(PlacementPolicy):
    """A uniformly random node among those that fit, then a uniformly random fitting device."""

    name = "random"
    sees_every_node = True  # uniform over nodes, not over states

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    def select(self, request: Request, candidates: Candidates) -> tuple[NodeState, Option]:
        node, options = (
            candidates[self._random.randrange(len(candidates))] if len(candidates) > 1 else candidates[0]
        )
        return node, options[self._random.randrange(len(options))]


class FragmentAware(ScoringPolicy):
    """Shared machinery of the fragmentation-aware policies: the workload's typical shapes and a meter.

    Given no workload, the policy learns it from the requests it places: the typical shapes, as the benchmark
    gives them, read again each time the count doubles and the mix has moved.
    """

    def __init__(self, workload: Sequence[Request] | None = None) -> None:
        super().__init__()
        self._fixed = workload is not None
        self._seen: Tally = {}
        self._seen_total = 0
        self._next_refresh = 1
        self.set_shapes(typical_shapes(workload) if workload else ())

    def set_workload(self, shapes: Sequence[TaskShape]) -> None:
        self.set_shapes(shapes)
        self._fixed = True

    def set_shapes(self, shapes: Sequence[TaskShape]) -> None:
        """Measure fragmentation against these task shapes from now on."""
        self.meter = FragmentMeter(shapes)
        self.forget_scores()

    def select(self, request: Request, candidates: Candidates) -> tuple[NodeState, Option]:
        if not self._fixed:
            self._learn(request)
        return super().select(request, candidates)

    def _learn(self, request: Request) -> None:
        tally([request], into=self._seen)
        self._seen_total += 1
        if self._seen_total >= self._next_refresh:
            self._next_refresh *= 2
            shapes = shapes_of(self._seen)
            if not same_mix(shapes, self.meter.shapes):
                self.set_shapes(shapes)

    def node_fragment(self, node: NodeState, cpu_free: int, memory_free: int, free: list[int]) -> float:
        """Expected fragment of ``node`` were this much CPU, memory and GPU (milli per position) free."""
        return self.meter.fragment(cpu_free, gpu_views(node, free))

    def forget_scores(self) -> None:
        super().forget_scores()
        self._fragment_now: dict[int, float] = {}  # state id -> the node's fragment in that state

    def fragment_now(self, node: NodeState) -> float:
        """The node's fragment as it stands: one per state, whatever the request (state ids are the pool's)."""
        found = self._fragment_now.get(node.state_id)
        if found is None:
            found = self._fragment_now[node.state_id] = self.node_fragment(
                node, node.cpu_free, node.mem_free, node.free
            )
        return found

    def fragment_change(
        self, node: NodeState, request: Request, option: Option, before: float | None = None
    ) -> float:
        """How much the node's expected fragment drops (positive) or grows (negative) if ``option`` is taken.

        ``before`` is the node's fragment now, when the caller has it already.
        """
        if before is None:
            before = self.fragment_now(node)
        after_free = list(node.free)
        need = request.gpu
        if isinstance(need, GpuShare):
            after_free[option[0]] -= need.milli
        elif need is not None and not isinstance(need, MigSlice):
            for position in option:
                after_free[position] -= FULL_MILLI
        after = self.node_fragment(
            node, node.cpu_free - request.cpu_milli, node.mem_free - request.memory_mib, after_free
        )
        return before - after

    def score(self, node: NodeState, request: Request, options: list[Option]) -> tuple[Score, Option]:
        if isinstance(request.gpu, MigSlice):
            option = tightest_option(node, request, options)
            return self.rate(node, request, option, self.fragment_change(node, request, option)), option
        before = self.fragment_now(node)
        return max(
            (
                (self.rate(node, request, o, self.fragment_change(node, request, o, before)), o)
                for o in _distinct_shares(node, request, options)
            ),
            key=lambda scored: scored[0],  # max keeps the first (lowest position) of equals
        )

    @abstractmethod
    def rate(self, node: NodeState, request: Request, option: Option, change: float) -> Score:
        """Turn the fragment change of one option into a comparable score."""


def _distinct_shares(node: NodeState, request: Request, options: list[Option]) -> list[Option]:
    """The options for a share, one per (product, free milli) of its GPU: the rest would score the same.

    Fragmentation sees a GPU as its product and free milli, so two such GPUs leave the node alike; the first
    (lowest position) of each is kept, the one a scan of every option would have chosen among equals.
    """
    if not isinstance(request.gpu, GpuShare) or len(options) < 2:
        return options
    seen: dict[tuple[str, int], Option] = {}
    for option in options:
        seen.setdefault((node.gpus[option[0]].product, node.free[option[0]]), option)
    return list(seen.values())


def fgd_gradient(change: float) -> int:
    """FGD's score of a fragment change Δ (milli): ⌊100·σ(Δ/1000)⌋, 50 for no change, coarse on purpose."""
    return math.floor(100 / (1 + math.exp(-change / FULL_MILLI)))


class Fgd(IgnoresMemory, FragmentAware):
    """FGD as published: ⌊100·σ(Δ/1000)⌋ of the fragment change Δ."""

    name = "fgd"

    def rate(self, node: NodeState, request: Request, option: Option, change: float) -> Score:
        return (fgd_gradient(change),)


class GpuPool(FragmentAware):
    """FGD's gradient, measured with GPUs the node's CPU and memory cannot feed; fillable leftovers for shares.

    Three changes to FGD, each measured on the Alibaba trace (README):

    - The fragment is :class:`~.feeding.FeedingMeter`'s: FGD's, plus half of each free GPU that the node's
      remaining CPU or memory cannot feed for a typical task. CPU-only and CPU-heavy tasks stop starving
      GPUs of the cores and memory that their tasks will need.
    - Using a GPU model that model-constrained tasks need (:mod:`.model_pressure`) costs fragment in
      proportion, so tasks that could run anywhere leave those models to the tasks that cannot.
    - Which GPU of the chosen node takes a share (FGD: the lowest index of the equally scored) goes to the
      GPU whose leftover typical shares can still fill.
    """

    name = "gpupool"

    def __init__(self, workload: Sequence[Request] | None = None) -> None:
        self._gpus_by_model: Counter[str] = Counter()
        super().__init__(workload)

    def prepare(self, state: PoolState) -> None:
        super().prepare(state)
        self._gpus_by_model = Counter(
            gpu.product for ns in state.nodes for gpu in ns.gpus if gpu.mode is not GpuMode.MIG
        )
        self.pressure = model_pressure(self.meter.shapes, self._gpus_by_model)

    def set_shapes(self, shapes: Sequence[TaskShape]) -> None:
        super().set_shapes(shapes)
        self.feeding = FeedingMeter(shapes)
        self.pressure = model_pressure(shapes, self._gpus_by_model)

    def fragment_change(
        self, node: NodeState, request: Request, option: Option, before: float | None = None
    ) -> float:
        change = super().fragment_change(node, request, option, before)
        need = request.gpu
        if not self.pressure or need is None or isinstance(need, MigSlice):
            return change
        milli = need.milli if isinstance(need, GpuShare) else FULL_MILLI
        used = sum(self.pressure.get(node.gpus[position].product, 0.0) for position in option)
        return change - PRESSURE_WEIGHT * milli * used

    def node_fragment(self, node: NodeState, cpu_free: int, memory_free: int, free: list[int]) -> float:
        capacity = (node.node.cpu_milli, node.node.memory_mib)
        return self.feeding.fragment(capacity, cpu_free, memory_free, gpu_views(node, free))

    def score(self, node: NodeState, request: Request, options: list[Option]) -> tuple[Score, Option]:
        score, option = super().score(node, request, options)
        if request.gpu is None:  # CPU-only work: of equal gradients, a node without GPUs (the trace has none)
            return (score[0], int(not node.gpus)), option
        return score[:1], option  # nodes compare by the gradient alone

    def rate(self, node: NodeState, request: Request, option: Option, change: float) -> Score:
        need = request.gpu
        leftover = (
            self.meter.unfillable(node.free[option[0]] - need.milli) if isinstance(need, GpuShare) else 0
        )
        return (fgd_gradient(change), -leftover)


POLICIES: dict[str, type[PlacementPolicy]] = {
    cls.name: cls for cls in (FirstFit, Spread, BestFit, RandomFit, Fgd, GpuPool)
}
DEFAULT_POLICY = GpuPool.name


def policy_by_name(name: str, **options: object) -> PlacementPolicy:
    """A new policy object for ``name``; raises :class:`UnknownPolicy` naming the valid ones."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise UnknownPolicy(
            f"unknown placement policy {name!r}; choose one of {', '.join(POLICIES)}"
        ) from None
    return cls(**options)
