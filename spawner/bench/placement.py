"""The FGD paper's placement experiment (USENIX ATC '23), run on gpupool's own pool and policies.

Protocol (see the README): inflate the workload to ``inflate`` × the cluster's GPU capacity by resampling
tasks, place them one at a time with no departures, and after each attempt record how much GPU capacity has
arrived, how much is allocated and how much is fragmented.
"""

from __future__ import annotations

import random
import resource
import statistics
import time
from dataclasses import dataclass, field, replace

from ..pool.devices import FULL_MILLI, Node
from ..pool.fragmentation import FragmentMeter, TaskShape, gpu_views, typical_shapes
from ..pool.node_state import NodeState
from ..pool.policies import FragmentAware, RandomFit, policy_by_name
from ..pool.state import Allocation, PoolState
from .trace import TracePod

CHECKPOINTS = (90, 100, 110, 120, 130)


@dataclass
class PlacementRun:
    """The outcome of one run; percentages are of the cluster's GPU capacity."""

    policy: str
    seed: int
    pods: int
    placed: int
    failed: int
    alloc_pct: dict[str, float | None]
    frag_pct_130: float | None
    p50_us: float
    p99_us: float
    curve: dict[int, float | None] = field(repr=False)
    scale: int = 1
    nodes: int = 0
    seconds: float = 0.0
    peak_rss_mib: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "seed": self.seed,
            "pods": self.pods,
            "placed": self.placed,
            "failed": self.failed,
            "alloc_pct": self.alloc_pct,
            "frag_pct_130": self.frag_pct_130,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "scale": self.scale,
            "nodes": self.nodes,
            "seconds": self.seconds,
            "peak_rss_mib": self.peak_rss_mib,
        }


def scale_cluster(nodes: list[Node], pods: list[TracePod], times: int) -> tuple[list[Node], list[TracePod]]:
    """The cluster and its workload ``times`` over: copies named ``NAME~k``, so per-node ratios stay the same."""
    if times < 1:
        raise ValueError(f"scale must be a whole number of at least 1, got {times}")
    if times == 1:
        return nodes, pods
    return (
        [n if k == 0 else replace(n, name=f"{n.name}~{k}") for k in range(times) for n in nodes],
        [p if k == 0 else TracePod(f"{p.name}~{k}", p.request) for k in range(times) for p in pods],
    )


def inflate_workload(
    pods: list[TracePod], capacity_milli: int, inflate: float, rng: random.Random
) -> list[TracePod]:
    """The trace shuffled, then extra tasks resampled from it until demand would pass ``inflate`` × capacity
    (or, for a trace already asking more, tasks dropped at random until it no longer does).

    Like the paper's simulator, the stop test adds one GPU's share of the next draw rather than its total,
    and a draw that would pass the target ends the resampling.
    """
    by_name = sorted(pods, key=lambda p: p.name)
    arrival = list(by_name)
    rng.shuffle(arrival)
    target = inflate * capacity_milli
    demand = sum(p.gpu_milli_total for p in by_name)
    if demand > target:  # the simulator's tune-down: tasks leave at random until the demand is the target's
        while demand > target:
            demand -= arrival.pop(rng.randrange(len(arrival))).gpu_milli_total
        return arrival
    extra = 0
    while True:
        clone = by_name[rng.randrange(len(by_name))]
        if demand + clone.gpu_milli_per_gpu > target:
            break
        demand += clone.gpu_milli_total
        arrival.append(TracePod(f"{clone.name}-x{extra}", clone.request))
        extra += 1
    return arrival


def start_protocol(
    nodes: list[Node],
    pods: list[TracePod],
    policy: str,
    seed: int,
    inflate: float = 1.3,
    placed_on: list[Node] | None = None,
    learn: bool = False,
) -> tuple[PoolState, list[TracePod], tuple[TaskShape, ...]]:
    """The pool, the arrival and the workload's typical shapes of one run, drawn from ``seed`` in the paper's
    order (arrival, node ranks, the random policy's own seed). ``placed_on`` is the cluster placed onto when it
    is a variant of ``nodes`` (the MIG benchmark's); capacity, and so the arrival, come from ``nodes``.
    ``learn``: a fragmentation-aware policy learns the shapes from the tasks it places, as in the service,
    instead of being given the trace's (as the paper gives FGD)."""
    rng = random.Random(seed)
    capacity = sum(len(n.gpus) for n in nodes) * FULL_MILLI
    arrival = inflate_workload(pods, capacity, inflate, rng)
    ordered = sorted(nodes if placed_on is None else placed_on, key=lambda n: n.name)
    ranks = rng.sample(range(len(ordered)), len(ordered))
    shapes = typical_shapes(p.request for p in sorted(pods, key=lambda p: p.name))
    chosen = RandomFit(seed=rng.randrange(2**32)) if policy == "random" else policy_by_name(policy)
    if isinstance(chosen, FragmentAware) and not learn:
        chosen.set_workload(shapes)
    return PoolState(ordered, chosen, ranks=ranks, explain_refusals=False), arrival, shapes


def run_placement(
    nodes: list[Node],
    pods: list[TracePod],
    policy: str,
    seed: int,
    inflate: float = 1.3,
    scale: int = 1,
    learn: bool = False,
) -> PlacementRun:
    """Run the protocol once and summarise it; ``scale`` replicates the cluster and its workload first;
    ``learn`` as for :func:`start_protocol`."""
    began = time.perf_counter()
    nodes, pods = scale_cluster(nodes, pods, scale)
    capacity = sum(len(n.gpus) for n in nodes) * FULL_MILLI
    state, arrival, shapes = start_protocol(nodes, pods, policy, seed, inflate, learn=learn)

    meter = FragmentMeter(shapes)
    node_fragment = [_fragment(meter, ns) for ns in state.nodes]
    index = {ns.node.name: i for i, ns in enumerate(state.nodes)}
    fragment_total = sum(node_fragment)

    arrived = used = failed = 0
    allocated: dict[int, list[float]] = {}  # by arrived percentage
    fragmented: dict[int, list[float]] = {}
    latencies = []
    for number, pod in enumerate(arrival):
        started = time.perf_counter_ns()
        outcome = state.place(pod.request, f"pod-{number}")
        latencies.append(time.perf_counter_ns() - started)
        arrived += pod.gpu_milli_total
        if isinstance(outcome, Allocation):
            used += pod.gpu_milli_total
            i = index[outcome.node]
            new = _fragment(meter, state.nodes[i])
            fragment_total += new - node_fragment[i]
            node_fragment[i] = new
        else:
            failed += 1
        arrived_pct = round(arrived / capacity * 100)
        allocated.setdefault(arrived_pct, []).append(round(used / capacity * 100, 2))
        fragmented.setdefault(arrived_pct, []).append(fragment_total / capacity * 100)

    curve = {x: mean_near(allocated, x) for x in range(0, round(inflate * 100) + 1)}
    frag = mean_near(fragmented, round(inflate * 100))
    latencies.sort()
    return PlacementRun(
        policy=policy,
        seed=seed,
        pods=len(arrival),
        placed=len(arrival) - failed,
        failed=failed,
        alloc_pct={str(x): curve.get(x) for x in CHECKPOINTS},
        frag_pct_130=None if frag is None else round(frag, 2),
        p50_us=round(latencies[len(latencies) // 2] / 1000, 1),
        p99_us=round(latencies[int(len(latencies) * 0.99)] / 1000, 1),
        curve=curve,
        scale=scale,
        nodes=len(nodes),
        seconds=round(time.perf_counter() - began, 2),
        peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    )


def _fragment(meter: FragmentMeter, ns: NodeState) -> float:
    return meter.fragment(ns.cpu_free, gpu_views(ns))


def mean_near(samples: dict[int, list[float]], x: int) -> float | None:
    """Mean of the events whose arrived percentage rounds to ``x`` (or within one of it, if none do)."""
    values = samples.get(x) or [v for near in (x - 1, x, x + 1) for v in samples.get(near, [])]
    return round(statistics.fmean(values), 2) if values else None
