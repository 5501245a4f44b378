"""The FGD paper's placement protocol with MIG nodes: how policies fare when part of the cluster is MIG.

The Alibaba trace's GPUs (G2, G3, P100, T4, V100, A10) cannot be split into MIG instances, so MIG nodes stand
in: ``share`` of the GPU nodes, picked by the seed, have their GPUs replaced by as many GPUs of a MIG-capable
product (A100-80GB by default), each in one stock layout of the GPU Operator's MIG Manager (``all-balanced``,
``all-1g``, ``all-7g``…, see :mod:`..pool.mig_layouts`); their CPU and memory stay. Everything else is the
protocol of :mod:`.placement`: the same arrival, node ranks and typical shapes for the seed, so a share of 0
gives its figures exactly.

A task that asks for part of one GPU may run on a MIG node in the smallest profile covering its compute (and
memory, where it says one) or on a share of a GPU elsewhere; a one-GPU task may run on a 7g instance (the
whole GPU, when the layout has one) or on a whole GPU elsewhere. The pool's requests hold one GPU need each,
so the benchmark asks the policy about each alternative and takes the one its own score prefers (ties: the
lower node rank, as the policy itself breaks them); ``random`` picks among all fitting nodes alike. Tasks
that name trace GPU models, and multi-GPU tasks, keep to those GPUs.

Allocation counts a MIG instance a placed task holds by its compute share (a 3g is 3/7 of a GPU, the
GPU-equivalent); compute no instance covers (the 3/7 of a GPU an ``all-4g`` layout leaves) is never counted as
held. Stranded slices are the MIG instances still free at the end, once ``inflate`` × capacity has arrived,
when far more is asked than the cluster holds. :func:`run_with_baseline` adds the same seed without MIG nodes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from ..pool.devices import FULL_MILLI, Gpu, GpuMode, MigInstance, Node
from ..pool.mig import Geometry, Placement, geometry, profile_compute_slices, profile_memory_gb
from ..pool.mig_layouts import covering_profile, named_layout
from ..pool.node_state import NodeState, Option
from ..pool.policies import ScoringPolicy
from ..pool.products import PRODUCTS
from ..pool.requests import GpuShare, MigSlice, Request, WholeGpus
from ..pool.state import Allocation, PoolState
from .placement import CHECKPOINTS, mean_near, start_protocol
from .trace import TracePod

DEFAULT_MIG_PRODUCT = "A100-80GB"


@dataclass(frozen=True)
class MigSetup:
    """Which nodes are MIG nodes, and how their GPUs are split."""

    share: float  # of the GPU nodes, 0 to 1
    layout: str = "all-balanced"
    product: str = DEFAULT_MIG_PRODUCT

    def __post_init__(self) -> None:
        if not 0 <= self.share <= 1:
            raise ValueError(f"the share of MIG nodes must be between 0 and 1, got {self.share:g}")
        geo = geometry(self.product)  # NotMigCapable names the MIG-capable products
        named_layout(geo, self.layout)  # UnknownLayout names the stock layouts
        object.__setattr__(self, "product", geo.product)


@dataclass
class MigRun:
    """One run. Each figure is a column of ``gpupool bench mig``'s table (:mod:`.mig_table`), named alike:
    percentages are of the whole cluster's GPU capacity, except ``mig_gpus_held_pct`` (of the MIG GPUs'); the
    end is when ``inflate`` × capacity has arrived."""

    policy: str
    seed: int
    mig_share: float
    layout: str
    product: str
    inflate: float
    mig_nodes: int
    mig_gpus: int
    pods: int
    placed: int
    failed: int
    alloc_pct: dict[str, float | None]  # "alloc @100", "alloc @130"
    asked_by_placed_pct: float  # "asked by placed @end": below the allocation by what MIG rounds up
    tasks_on_mig: int  # "tasks on MIG": placed on a MIG instance
    mig_gpus_held_pct: float  # "MIG GPUs held": the compute of the instances placed tasks hold
    stranded_slices: int  # "stranded slices @end": MIG instances free at the end
    stranded_compute_pct: float  # "stranded compute @end": their compute
    seconds: float
    alloc_without_mig_pct: dict[str, float | None] | None = None  # "alloc @130 without MIG": --mig-share 0
    curve: dict[int, float | None] = field(repr=False, default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in vars(self).items() if k != "curve"}


def mig_cluster(nodes: Sequence[Node], setup: MigSetup, seed: int) -> list[Node]:
    """``nodes`` with ``round(share × GPU nodes)`` of the GPU nodes, picked by ``seed``, made MIG nodes."""
    geo = geometry(setup.product)
    layout = named_layout(geo, setup.layout)
    with_gpus = sorted(n.name for n in nodes if n.gpus)
    chosen = set(random.Random(f"gpupool-mig-{seed}").sample(with_gpus, round(setup.share * len(with_gpus))))
    return [_as_mig_node(n, geo, layout) if n.name in chosen else n for n in nodes]


def _as_mig_node(node: Node, geo: Geometry, layout: tuple[Placement, ...]) -> Node:
    memory = PRODUCTS[geo.product].memory_mib
    gpus = tuple(
        Gpu(
            uuid=gpu.uuid,
            index=gpu.index,
            product=geo.product,
            memory_mib=memory,
            mode=GpuMode.MIG,
            mig_instances=tuple(
                MigInstance(
                    f"MIG-{gpu.uuid}-{p.start}",
                    p.profile,
                    p.start,
                    profile_memory_gb(p.profile) * 1024,
                    gpu.uuid,
                )
                for p in layout
            ),
        )
        for gpu in node.gpus
    )
    return replace(node, gpus=gpus)


def alternatives(request: Request, geo: Geometry, offered: frozenset[str]) -> tuple[Request, ...]:
    """The ways ``request`` may be served: a MIG instance (``offered`` profiles only) first, then as asked."""
    need = request.gpu
    if need is None or need.products:
        return (request,)
    if isinstance(need, GpuShare):
        milli, memory = need.milli, need.memory_mib
    elif isinstance(need, WholeGpus) and need.count == 1:
        milli, memory = FULL_MILLI, need.min_memory_mib
    else:
        return (request,)
    profile = covering_profile(geo, milli, memory)
    if profile is None or profile.name not in offered:
        return (request,)
    mig = replace(request, gpu=MigSlice(profile=profile.name, products=frozenset({geo.product})))
    return (mig, request)


def place_either(
    state: PoolState, requests: Sequence[Request], owner: str, rng: random.Random
) -> Allocation | None:
    """Place the alternative the pool's policy scores best (see the module's docstring); None if none fits."""
    fitting = [(r, c) for r in requests if (c := state.candidates(r))]
    if not fitting:
        return None
    policy = state.policy
    if len(fitting) == 1:
        request = fitting[0][0]
    elif isinstance(policy, ScoringPolicy):
        request = max(fitting, key=lambda rc: _best_score(policy, *rc))[0]
    else:  # uniform over every fitting node, as `random` is
        request = _uniform_pick(fitting, rng)
    outcome = state.place(request, owner)
    assert isinstance(outcome, Allocation), "a request with candidates must be placed"
    return outcome


def _uniform_pick(fitting: Sequence[tuple[Request, Sequence[object]]], rng: random.Random) -> Request:
    """An alternative drawn in proportion to its fitting nodes: one node drawn uniformly among all of them."""
    pick = rng.randrange(sum(len(candidates) for _, candidates in fitting))
    for request, candidates in fitting:
        if pick < len(candidates):
            return request
        pick -= len(candidates)
    raise AssertionError("the draw is below the number of fitting nodes")


def _best_score(
    policy: ScoringPolicy, request: Request, candidates: list[tuple[NodeState, list[Option]]]
) -> tuple[object, ...]:
    node, _ = policy.select(request, candidates)
    options = next(o for ns, o in candidates if ns is node)
    score, _ = policy.score(node, request, options)
    return (score, -node.rank)


def run_mig_placement(
    nodes: list[Node], pods: list[TracePod], policy: str, seed: int, setup: MigSetup, inflate: float = 1.3
) -> MigRun:
    """The protocol of :func:`.placement.run_placement` on a cluster with MIG nodes."""
    began = time.perf_counter()
    capacity = sum(len(n.gpus) for n in nodes) * FULL_MILLI
    # Drawn from the seed in run_placement's order, so that a run without MIG nodes is that run.
    state, arrival, _ = start_protocol(
        nodes, pods, policy, seed, inflate, placed_on=mig_cluster(nodes, setup, seed)
    )
    geo = geometry(setup.product)
    offered = frozenset(p.profile for p in named_layout(geo, setup.layout))
    ways: dict[Request, tuple[Request, ...]] = {}
    pick_rng = random.Random(f"gpupool-mig-pick-{seed}")

    arrived = served = 0
    used = 0.0
    failed = on_mig = 0
    samples: dict[int, list[float]] = {}
    for number, pod in enumerate(arrival):
        requests = ways.get(pod.request)
        if requests is None:
            requests = ways[pod.request] = alternatives(pod.request, geo, offered)
        allocation = place_either(state, requests, f"pod-{number}", pick_rng)
        arrived += pod.gpu_milli_total
        if allocation is None:
            failed += 1
        else:
            used += _held_milli(allocation, geo)
            served += pod.gpu_milli_total
            on_mig += isinstance(allocation.request.gpu, MigSlice)
        samples.setdefault(round(arrived / capacity * 100), []).append(round(used / capacity * 100, 2))

    standing = _mig_standing(state, geo)
    curve = {x: mean_near(samples, x) for x in range(round(inflate * 100) + 1)}
    return MigRun(
        policy=policy,
        seed=seed,
        mig_share=setup.share,
        layout=setup.layout,
        product=setup.product,
        inflate=inflate,
        mig_nodes=sum(1 for ns in state.nodes if ns.gpus and ns.gpus[0].mode is GpuMode.MIG),
        mig_gpus=standing.gpus,
        pods=len(arrival),
        placed=len(arrival) - failed,
        failed=failed,
        alloc_pct={str(x): curve.get(x) for x in CHECKPOINTS},
        asked_by_placed_pct=round(served / capacity * 100, 2),
        tasks_on_mig=on_mig,
        mig_gpus_held_pct=round(100 * standing.held_milli / (standing.gpus * FULL_MILLI), 2)
        if standing.gpus
        else 0.0,
        stranded_slices=standing.free,
        stranded_compute_pct=round(standing.free_milli / capacity * 100, 2),
        seconds=round(time.perf_counter() - began, 2),
        curve=curve,
    )


def run_with_baseline(
    nodes: list[Node], pods: list[TracePod], policy: str, seed: int, setup: MigSetup, inflate: float = 1.3
) -> MigRun:
    """:func:`run_mig_placement`, with ``alloc_without_mig_pct`` from the same seed and policy without MIG
    nodes (the placement benchmark's run; a share of 0 is its own)."""
    run = run_mig_placement(nodes, pods, policy, seed, setup, inflate)
    plain = (
        run
        if setup.share == 0
        else run_mig_placement(nodes, pods, policy, seed, replace(setup, share=0.0), inflate)
    )
    run.alloc_without_mig_pct = dict(plain.alloc_pct)
    return run


def _held_milli(allocation: Allocation, geo: Geometry) -> float:
    """Thousandths of a GPU held: a MIG instance by its exact compute share (a 1g of an A100 is 1000/7)."""
    need = allocation.request.gpu
    if isinstance(need, MigSlice) and need.profile is not None:
        return _instance_milli(need.profile, geo)
    return float(sum(g.milli for g in allocation.grants))


class MigStanding(NamedTuple):
    """The MIG GPUs at the end: how many, the compute their taken and free instances hold (in milli, by
    compute share), and how many instances are free. Compute no instance covers is in neither."""

    gpus: int
    held_milli: float
    free_milli: float
    free: int


def _mig_standing(state: PoolState, geo: Geometry) -> MigStanding:
    gpus = free = 0
    held_milli = free_milli = 0.0
    for ns in state.nodes:
        for position, gpu in enumerate(ns.gpus):
            if gpu.mode is not GpuMode.MIG:
                continue
            gpus += 1
            for index, instance in enumerate(gpu.mig_instances):
                milli = _instance_milli(instance.profile, geo)
                if index in ns.mig_free[position]:
                    free += 1
                    free_milli += milli
                else:
                    held_milli += milli
    return MigStanding(gpus, held_milli, free_milli, free)


def _instance_milli(profile: str, geo: Geometry) -> float:
    """A MIG instance's compute share of its GPU in thousandths: a 1g of an A100 is 1000/7."""
    return FULL_MILLI * profile_compute_slices(profile) / geo.compute_slices
