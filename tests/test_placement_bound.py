"""The optimality bound of the placement benchmark, on the committed sample of the Alibaba trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.spawner.bench.bound import RELAXATIONS, BoundUnavailable, arrived_tasks, placement_bound
from gpupool.spawner.bench.placement import run_placement
from gpupool.spawner.bench.trace import TracePod, load_nodes, load_pods
from gpupool.spawner.cli import main
from gpupool.spawner.pool.devices import Gpu, GpuMode, Node
from gpupool.spawner.pool.policies import POLICIES
from gpupool.spawner.pool.products import canonical_product
from gpupool.spawner.pool.requests import GpuShare, Request, WholeGpus

SAMPLE = Path(__file__).parent / "data" / "trace"
NODES = SAMPLE / "nodes_sample.csv"
PODS = SAMPLE / "pods_sample.csv"


def _node(name: str, gpus: int, cpu: int = 64_000, memory: int = 262_144, product: str = "T4") -> Node:
    return Node(
        name,
        cpu,
        memory,
        tuple(Gpu(f"{name}-{i}", i, canonical_product(product), 0, mode=GpuMode.SHARED) for i in range(gpus)),
    )


@pytest.mark.parametrize("seed", [42, 43])
def test_no_policy_allocates_more_than_the_bound(seed: int) -> None:
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    arrived = arrived_tasks(nodes, pods, seed)
    bound = placement_bound(nodes, arrived)
    for policy in sorted(POLICIES):
        run = run_placement(nodes, pods, policy, seed)
        assert run.pods == len(arrived), "the bound must see the run's own arrival"
        reached = max(v for v in run.curve.values() if v is not None)
        assert reached <= bound.percent, policy
    assert bound.percent <= 100
    assert bound.percent <= bound.demand_percent


def test_each_relaxation_is_at_least_as_tight_as_the_one_before() -> None:
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    arrived = arrived_tasks(nodes, pods, 42)
    figures = [placement_bound(nodes, arrived, r).percent for r in RELAXATIONS]
    assert figures == sorted(figures, reverse=True)
    # on the sample, packing shares into whole GPUs costs something that liquid GPUs hide
    assert figures[-1] < figures[0] == 100


def test_the_bound_drops_when_nodes_are_removed() -> None:
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    arrived = arrived_tasks(nodes, pods, 42)
    whole = placement_bound(nodes, arrived)
    half = placement_bound(nodes[: len(nodes) // 2], arrived)
    assert half.gpus < whole.gpus
    assert half.capacity_gpus < whole.capacity_gpus


def test_a_task_no_node_can_hold_contributes_nothing() -> None:
    nodes = [_node("a", 4), _node("b", 4)]
    eight = TracePod("eight", Request(8000, 1024, WholeGpus(8)))
    one = TracePod("one", Request(8000, 1024, WholeGpus(1)))
    bound = placement_bound(nodes, [eight, eight, one])
    assert bound.gpus == 1 and bound.percent == 12.5
    assert bound.demand_percent == 212.5, "demand still counts what arrived"


def test_shares_above_half_a_gpu_never_share_one() -> None:
    nodes = [_node("a", 2)]
    big = TracePod("big", Request(1000, 1024, GpuShare(600)))
    assert placement_bound(nodes, [big] * 4).gpus == 1.2
    assert placement_bound(nodes, [big] * 4, "liquid").gpus == 2


def test_holding_large_shares_lowers_the_bound_to_what_is_left_beside_them() -> None:
    """A run that has placed 810-milli shares can still reach only what fits beside them: the bound holding
    them says so, and fills their leftovers with shares that arrived but were not placed."""
    nodes = [_node("a", 2)]
    large = [TracePod(f"large-{i}", Request(1000, 1024, GpuShare(810))) for i in range(2)]
    whole = [TracePod(f"whole-{i}", Request(1000, 1024, WholeGpus(1))) for i in range(2)]
    arrived = large + whole
    assert placement_bound(nodes, arrived).gpus == 2
    assert placement_bound(nodes, arrived, holding=large[:1]).gpus == 1.81
    assert placement_bound(nodes, arrived, holding=large).gpus == 1.62
    small = TracePod("small", Request(1000, 1024, GpuShare(190)))
    assert placement_bound(nodes, [*arrived, small], holding=large[:1]).gpus == 2


def test_holding_what_did_not_arrive_or_fits_nowhere_is_refused() -> None:
    nodes = [_node("a", 2, cpu=4000)]
    share = TracePod("share", Request(1000, 1024, GpuShare(500)))
    with pytest.raises(ValueError, match="holding must be tasks that arrived"):
        placement_bound(nodes, [share], holding=[share, share])
    hungry = TracePod("hungry", Request(8000, 1024, GpuShare(500)))
    with pytest.raises(BoundUnavailable, match="fits no node"):
        placement_bound(nodes, [share, hungry], holding=[hungry])


def test_cpu_and_models_bind_as_on_a_node() -> None:
    nodes = [_node("a", 4, cpu=16_000), _node("b", 4, product="V100")]
    hungry = TracePod("hungry", Request(8000, 1024, WholeGpus(1, frozenset({"T4"}))))
    bound = placement_bound(nodes, [hungry] * 8)
    assert bound.gpus == 2, "only node a has T4s, and its CPU feeds two"


def test_mig_partitioned_gpus_are_refused_in_words() -> None:
    mig = Node("m", 64_000, 262_144, (Gpu("m-0", 0, "A100-80GB", 0, mode=GpuMode.MIG),))
    with pytest.raises(BoundUnavailable, match="MIG"):
        placement_bound([mig], [TracePod("one", Request(1000, 1024, WholeGpus(1)))])


def test_the_cli_says_the_bound_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "placement", "--nodes", str(NODES), "--pods", str(PODS), "--policy", "fgd", "--bound"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "no placement of the 336 GPU tasks that arrived could allocate more than 99.97% of GPU capacity"
        in out
    )
    assert "239 GPUs" in out
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bound"]["percent"] == 99.97
    assert result["bound"]["relaxation"] == "per-node"
    assert result["alloc_pct"]["130"] <= result["bound"]["percent"]
