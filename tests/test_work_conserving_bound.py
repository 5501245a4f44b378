"""The bound for runs that place every task that fits: checked against every such run of small arrivals."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.spawner.bench.bound import BoundUnavailable, arrived_tasks, placement_bound
from gpupool.spawner.bench.placement import run_placement
from gpupool.spawner.bench.trace import TracePod, load_nodes, load_pods
from gpupool.spawner.bench.work_conserving import work_conserving_bound
from gpupool.spawner.pool.devices import FULL_MILLI, Gpu, GpuMode, Node
from gpupool.spawner.pool.policies import POLICIES
from gpupool.spawner.pool.requests import GpuShare, Request, WholeGpus

SAMPLE = Path(__file__).parent / "data" / "trace"

Task = tuple[int, int, int]  # CPU milli, whole GPUs, share milli (0 for whole GPUs and CPU-only tasks)


def _node(name: str, gpus: int, cpu: int, max_shares: int | None = None) -> Node:
    devices = tuple(
        Gpu(f"{name}-{i}", i, "T4-16GB", 0, mode=GpuMode.SHARED, max_shares=max_shares) for i in range(gpus)
    )
    return Node(name, cpu, 65_536, devices)


def _pod(number: int, task: Task) -> TracePod:
    cpu, whole, milli = task
    need = WholeGpus(whole) if whole else GpuShare(milli) if milli else None
    return TracePod(f"t{number}", Request(cpu, 1024, need))


def best_work_conserving_run(nodes: list[Node], tasks: list[Task]) -> int:
    """The most GPU milli any run allocates that places each task, in order, wherever it fits if it fits."""
    start = tuple((n.cpu_milli, tuple(FULL_MILLI for _ in n.gpus)) for n in nodes)

    @functools.cache
    def best(i: int, state: tuple[tuple[int, tuple[int, ...]], ...]) -> int:
        if i == len(tasks):
            return 0
        cpu, whole, milli = tasks[i]
        outcomes = []
        for at, (cpu_free, gpus) in enumerate(state):
            if cpu_free < cpu:
                continue
            choices = []
            if whole and sum(g == FULL_MILLI for g in gpus) >= whole:
                left, taken = list(gpus), 0
                for k, g in enumerate(left):
                    if g == FULL_MILLI and taken < whole:
                        left[k], taken = 0, taken + 1
                choices.append((tuple(left), whole * FULL_MILLI))
            elif milli:
                for level in {g for g in gpus if g >= milli}:
                    left = list(gpus)
                    left[left.index(level)] -= milli
                    choices.append((tuple(left), milli))
            elif not whole:
                choices.append((gpus, 0))
            for left, worth in choices:
                after = list(state)
                after[at] = (cpu_free - cpu, tuple(sorted(left)))
                outcomes.append(worth + best(i + 1, tuple(after)))
        return max(outcomes) if outcomes else best(i + 1, state)

    return best(0, start)


def test_large_shares_that_arrive_first_keep_whole_gpus_out() -> None:
    nodes = [_node("a", 2, 8000)]
    tasks: list[Task] = [(1000, 0, 810), (1000, 0, 810), (1000, 1, 0), (1000, 1, 0)]
    pods = [_pod(i, t) for i, t in enumerate(tasks)]
    # any placement may leave the shares out and run both whole GPUs; a scheduler that places what fits cannot
    assert placement_bound(nodes, pods).percent == 100
    assert best_work_conserving_run(nodes, tasks) == 1620
    assert work_conserving_bound(nodes, pods, common=1).percent == 81


def test_a_node_without_cpu_left_has_no_room() -> None:
    # the CPU-only task may take the CPU the share needs; the bound must allow that run, not only the other
    nodes = [_node("a", 1, 4000)]
    tasks: list[Task] = [(3000, 0, 0), (2000, 0, 300), (1000, 1, 0)]
    bound = work_conserving_bound(nodes, [_pod(i, t) for i, t in enumerate(tasks)], common=1)
    assert bound.percent * 10 >= best_work_conserving_run(nodes, tasks) == 1000


TASKS = st.one_of(
    st.tuples(st.sampled_from([1000, 3000]), st.just(0), st.sampled_from([190, 300, 470, 810])),
    st.tuples(st.sampled_from([1000, 3000]), st.sampled_from([1, 2]), st.just(0)),
    st.tuples(st.sampled_from([2000, 5000]), st.just(0), st.just(0)),
)


@settings(max_examples=40, deadline=None)
@given(
    gpus=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    cpu=st.sampled_from([4000, 8000]),
    tasks=st.lists(TASKS, min_size=2, max_size=8).filter(lambda ts: any(t[2] for t in ts)),
)
def test_no_run_that_places_what_fits_allocates_more(gpus: list[int], cpu: int, tasks: list[Task]) -> None:
    nodes = [_node(f"n{i}", count, cpu) for i, count in enumerate(gpus)]
    pods = [_pod(i, t) for i, t in enumerate(tasks)]
    bound = work_conserving_bound(nodes, pods, common=1)
    reached = best_work_conserving_run(nodes, tasks)
    capacity = sum(gpus) * FULL_MILLI
    assert reached <= bound.percent / 100 * capacity + 1e-6
    assert bound.percent <= placement_bound(nodes, pods, "share-patterns").percent


@pytest.mark.parametrize("seed", [42])
def test_every_policy_stays_under_it_on_the_sample(seed: int) -> None:
    nodes = load_nodes(SAMPLE / "nodes_sample.csv")
    pods = load_pods(SAMPLE / "pods_sample.csv")
    arrived = arrived_tasks(nodes, pods, seed)
    bound = work_conserving_bound(nodes, arrived, common=20, seconds=20)
    assert bound.percent <= placement_bound(nodes, arrived, "share-patterns").percent
    for policy in sorted(POLICIES):
        run = run_placement(nodes, pods, policy, seed)
        assert max(v for v in run.curve.values() if v is not None) <= bound.percent, policy


def test_gpus_with_a_cap_on_shares_are_refused() -> None:
    nodes = [_node("a", 2, 8000, max_shares=2)]
    pods = [_pod(0, (1000, 0, 300)), _pod(1, (1000, 0, 300))]
    with pytest.raises(BoundUnavailable, match="a's T4-16GB #0"):
        work_conserving_bound(nodes, pods, common=1)


def test_an_lp_stopped_by_its_time_limit_loosens_the_bound_and_says_so() -> None:
    nodes = [_node("a", 2, 8000)]
    tasks: list[Task] = [(1000, 0, 810), (1000, 0, 810), (1000, 1, 0), (1000, 1, 0)]
    pods = [_pod(i, t) for i, t in enumerate(tasks)]
    solved = work_conserving_bound(nodes, pods, common=1)
    stopped = work_conserving_bound(nodes, pods, common=1, lp_seconds=1e-9)
    assert (solved.stopped, solved.percent) == (0, 81)
    # counted at the end state alone, which any placement of the arrivals bounds: looser, never lower
    assert stopped.stopped == stopped.intervals > 0
    assert stopped.percent == placement_bound(nodes, pods, "share-patterns").percent == 100


def test_a_cluster_without_gpus_is_refused_with_the_reason() -> None:
    nodes = [Node("cpu-only", 8000, 65_536, ())]
    with pytest.raises(BoundUnavailable, match="no node has a GPU"):
        work_conserving_bound(nodes, [_pod(0, (1000, 0, 300))], common=1)
