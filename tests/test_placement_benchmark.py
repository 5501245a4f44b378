"""The FGD paper's protocol on a committed sample of the Alibaba trace, through the real CLI."""

from __future__ import annotations

import argparse
import importlib
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from builders import gpu, node

from gpupool.spawner.arg_types import seed_list
from gpupool.spawner.bench.bound import arrived_tasks, placement_bound
from gpupool.spawner.bench.placement import inflate_workload, run_placement, scale_cluster, start_protocol
from gpupool.spawner.bench.trace import TraceError, load_nodes, load_pods
from gpupool.spawner.cli import main
from gpupool.spawner.pool import policies
from gpupool.spawner.pool.devices import GpuMode
from gpupool.spawner.pool.fragmentation import typical_shapes
from gpupool.spawner.pool.policies import POLICIES, FragmentAware, policy_by_name
from gpupool.spawner.pool.requests import GpuShare, Request
from gpupool.spawner.pool.state import Allocation, PoolState

SAMPLE = Path(__file__).parent / "data" / "trace"
NODES = SAMPLE / "nodes_sample.csv"
PODS = SAMPLE / "pods_sample.csv"
ON_SAMPLE = ["bench", "placement", "--nodes", str(NODES), "--pods", str(PODS)]


def test_cli_json_holds_the_protocol_figures(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        *ON_SAMPLE,
        "--policy",
        "fgd",
        "--seed",
        "42",
    ]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["alloc_pct"]) == {"90", "100", "110", "120", "130"}
    # A small sample can leave a checkpoint without events (the protocol then leaves it blank).
    assert result["alloc_pct"]["130"] is not None
    assert all(value is None or 0 < value <= 100 for value in result["alloc_pct"].values())
    assert result["placed"] + result["failed"] == result["pods"]
    assert result["failed"] > 0, "at 130% of capacity some tasks must fail"
    assert 0 <= result["frag_pct_130"] < 100
    assert 0 < result["p50_us"] <= result["p99_us"]


def test_the_cli_text_says_each_point_as_a_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ON_SAMPLE, "--policy", "fgd", "--seed", "42"]) == 0
    points = [line for line in capsys.readouterr().out.splitlines() if "of GPU capacity arrived" in line]
    assert len(points) == 5
    for line in points:  # "…: 93.1% allocated", or "…: not reached: …", never "not reached … allocated"
        assert re.fullmatch(
            r"  \d+% of GPU capacity arrived: (\d+(\.\d+)?% allocated|not reached: .+)", line
        ), line
        assert not ("not reached" in line and line.endswith("allocated")), line


def test_same_seed_same_result_and_seeds_differ() -> None:
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    first = run_placement(nodes, pods, "random", 42)
    again = run_placement(nodes, pods, "random", 42)
    other = run_placement(nodes, pods, "random", 43)
    assert first.alloc_pct == again.alloc_pct
    assert first.curve != other.curve


def test_inflation_stops_just_before_the_target() -> None:
    import random

    pods = load_pods(PODS)
    capacity = sum(len(n.gpus) for n in load_nodes(NODES)) * 1000
    arrival = inflate_workload(pods, capacity, 1.3, random.Random(1))
    demand = sum(p.gpu_milli_total for p in arrival)
    assert sorted(p.name for p in arrival[: len(pods)]) == sorted(p.name for p in pods)
    # The protocol's stop test adds one GPU's share of a draw, so an 8-GPU task may overshoot by 7 GPUs.
    assert 1.3 * capacity - 8000 < demand <= 1.3 * capacity + 7000


def test_fragmentation_aware_policies_beat_random_on_the_sample() -> None:
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    seeds = range(42, 46)

    def mean(policy: str) -> float:
        return sum(run_placement(nodes, pods, policy, s).alloc_pct["130"] or 0 for s in seeds) / len(seeds)

    assert mean("fgd") > mean("random")
    assert mean("gpupool") > mean("random")


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_runs_the_protocol(policy: str) -> None:
    run = run_placement(load_nodes(NODES), load_pods(PODS), policy, 42)
    assert run.placed + run.failed == run.pods and run.failed > 0
    allocated = [run.curve[x] for x in sorted(run.curve) if run.curve[x] is not None]
    assert allocated == sorted(allocated), "allocation never drops: nothing departs"
    assert 80 < allocated[-1] <= 100


def test_console_script_prints_a_readable_summary() -> None:
    script = Path(sys.executable).parent / "gpupool"
    out = subprocess.run(
        [
            str(script),
            *ON_SAMPLE,
            "--policy",
            "best-fit",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "policy best-fit, seed 42" in out
    assert "130% of GPU capacity arrived" in out


def test_a_broken_trace_file_names_file_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "pods.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,4000,1024,one,1000\n")
    with pytest.raises(TraceError, match=r"pods.csv, line 2: num_gpu must be an integer, got 'one'"):
        load_pods(bad)
    missing = tmp_path / "nodes.csv"
    missing.write_text("sn,cpu_milli\n")
    with pytest.raises(TraceError, match="missing column"):
        load_nodes(missing)


def test_empty_or_gpu_less_trace_files_are_refused(tmp_path: Path) -> None:
    no_pods = tmp_path / "pods.csv"
    no_pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
    with pytest.raises(TraceError, match="no tasks in the file"):
        load_pods(no_pods)
    cpu_only = tmp_path / "nodes.csv"
    cpu_only.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,0,\n")
    with pytest.raises(TraceError, match="no node has a GPU"):
        load_nodes(cpu_only)
    negative = tmp_path / "negative.csv"
    negative.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,4000,1024,-1,1000\n")
    with pytest.raises(TraceError, match=r"line 2: num_gpu must be 0 or more, got -1"):
        load_pods(negative)


def test_scale_replicates_the_cluster_and_its_workload(capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    bigger_nodes, bigger_pods = scale_cluster(nodes, pods, 3)
    assert len(bigger_nodes) == 3 * len(nodes) and len({n.name for n in bigger_nodes}) == 3 * len(nodes)
    assert len(bigger_pods) == 3 * len(pods)
    assert main([*ON_SAMPLE, "--policy", "gpupool", "--scale", "3", "--json"]) == 0
    scaled = json.loads(capsys.readouterr().out)
    assert scaled["nodes"] == 3 * len(nodes) and scaled["scale"] == 3
    assert scaled["pods"] > 2.5 * run_placement(nodes, pods, "gpupool", 42).pods
    assert scaled["peak_rss_mib"] > 0 and scaled["seconds"] > 0
    with pytest.raises(SystemExit):
        main([*ON_SAMPLE, "--scale", "0"])
    assert "--scale: must be a whole number of at least 1" in capsys.readouterr().err


def test_learn_runs_the_policy_as_the_service_does_from_no_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    given, _, shapes = start_protocol(nodes, pods, "gpupool", 42)
    assert isinstance(given.policy, FragmentAware) and given.policy.meter.shapes == shapes
    learning, arrival, _ = start_protocol(nodes, pods, "gpupool", 42, learn=True)
    assert isinstance(learning.policy, FragmentAware) and learning.policy.meter.shapes == ()
    for number, pod in enumerate(arrival):
        learning.place(pod.request, f"pod-{number}")
    assert learning.policy.meter.shapes, "it learned the mix from what it placed"
    assert main([*ON_SAMPLE, "--learn", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["placed"] > 0


class _EveryNode:
    """Mixin: offer the policy every candidate node, as the pool did before it grouped nodes by state."""

    sees_every_node = True


@pytest.mark.parametrize("policy", ["first-fit", "spread", "best-fit", "fgd", "gpupool"])
def test_grouping_nodes_by_state_decides_exactly_as_looking_at_every_node(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shortcuts (one node per state, one share option per kind of GPU) never change a decision."""
    # Three copies of the sample: many nodes share a state, which is where the pool offers one of them.
    nodes, pods = scale_cluster(load_nodes(NODES), load_pods(PODS), 3)
    ordered = sorted(nodes, key=lambda n: n.name)
    ranks = random.Random(5).sample(range(len(ordered)), len(ordered))
    every_node_class = type(f"Every{policy}", (_EveryNode, POLICIES[policy]), {})
    shapes = typical_shapes(p.request for p in pods)
    decisions = []
    for chosen in (policy_by_name(policy), every_node_class()):
        if decisions:  # the reference run: every node, every option scored
            monkeypatch.setattr(policies, "_distinct_shares", lambda node, request, options: options)
        if isinstance(chosen, FragmentAware):
            chosen.set_workload(shapes)
        state = PoolState(ordered, chosen, ranks=ranks, explain_refusals=False)
        outcomes = [state.place(p.request, f"pod-{i}") for i, p in enumerate(pods * 2)]
        decisions.append([(o.node, o.grants) if isinstance(o, Allocation) else None for o in outcomes])
    assert decisions[0] == decisions[1]
    assert sum(d is None for d in decisions[0]) > 0, "the sample, twice over, must overflow the pool"


def test_a_trace_asking_more_than_the_target_is_thinned_and_the_bound_of_nothing_is_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import random

    pods = load_pods(PODS)
    capacity = sum(len(n.gpus) for n in load_nodes(NODES)) * 1000
    arrival = inflate_workload(pods, capacity, 0.5, random.Random(1))
    demand = sum(p.gpu_milli_total for p in arrival)
    assert 0.5 * capacity - 8000 < demand <= 0.5 * capacity
    assert len(arrival) < len(pods)
    # A node no task fits: every GPU task is refused, and no placement could allocate anything.
    tiny = tmp_path / "nodes.csv"
    tiny.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1024,1,G2\n")
    assert main(["bench", "placement", "--nodes", str(tiny), "--pods", str(PODS), "--bound"]) == 0
    assert "could allocate more than 0.0% of GPU capacity" in capsys.readouterr().out
    negative = tmp_path / "negative.csv"
    negative.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,-5,1024,1,G2\n")
    with pytest.raises(TraceError, match=r"line 2: cpu_milli must be 0 or more, got -5"):
        load_nodes(negative)


def test_the_share_refusal_benchmark_refuses_only_shares_that_would_open_a_fresh_gpu() -> None:
    """``benchmarks/share_refusal.py`` puts a figure on what refusing shares buys in the protocol; its
    refusal must be exactly that, and without it the run must be the default policy's own."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    try:
        share_refusal = importlib.import_module("share_refusal")
    finally:
        sys.path.pop(0)
    shared = node("a", [gpu("a", i, mode=GpuMode.SHARED) for i in range(2)])
    state = PoolState([shared])
    big = Request(1000, 1024, GpuShare(810))
    assert share_refusal.opens_a_fresh_gpu(state, big)
    state.place(Request(1000, 1024, GpuShare(150)), "small")
    assert not share_refusal.opens_a_fresh_gpu(state, big)  # beside the 150 it strands nothing new
    state.place(Request(1000, 1024, GpuShare(810)), "beside")
    state.place(Request(1000, 1024, GpuShare(900)), "fills the other")
    assert not share_refusal.opens_a_fresh_gpu(state, big)  # fits nowhere: nothing to refuse

    nodes, pods = load_nodes(NODES), load_pods(PODS)
    placing = share_refusal.run(nodes, pods, 42, None)
    assert (placing.placed, placing.refused) == (run_placement(nodes, pods, "gpupool", 42).placed, 0)
    refusing = share_refusal.run(nodes, pods, 42, 1)
    assert refusing.refused > 0 and refusing.placed < placing.placed


@pytest.mark.parametrize("policy", ["gpupool", "fgd", "first-fit"])
def test_a_run_stays_under_the_bound_holding_its_own_shares(policy: str) -> None:
    """The share-refusal table bounds each run by what any placement holding its shares could allocate; that
    bound must sit between the run itself and the bound over every placement."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    try:
        share_refusal = importlib.import_module("share_refusal")
    finally:
        sys.path.pop(0)
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    outcome = share_refusal.run(nodes, pods, 42, None, policy)
    unheld = placement_bound(nodes, arrived_tasks(nodes, pods, 42)).percent
    assert outcome.allocated <= outcome.bound_holding_shares <= unheld


@pytest.mark.parametrize(
    ("given", "seeds"),
    [("42", [42]), ("42,43", [42, 43]), ("42-44", [42, 43, 44]), ("45,50-51", [45, 50, 51])],
)
def test_seeds_are_read_as_lists_and_ranges(given: str, seeds: list[int]) -> None:
    assert seed_list(given) == seeds


@pytest.mark.parametrize("given", ["x", "44-42", "42,", ""])
def test_a_bad_seed_list_says_what_was_expected(given: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="42-44"):
        seed_list(given)


def test_the_work_conserving_benchmark_adds_seeds_to_those_bounded_before(tmp_path: Path) -> None:
    """Bounding a seed takes minutes, so a rerun of some seeds keeps the rest, and the table shows them all."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    try:
        benchmark = importlib.import_module("work_conserving_bound")
    finally:
        sys.path.pop(0)
    store = tmp_path / "work_conserving_bound.jsonl"

    def row(seed: int, percent: float) -> dict[str, object]:
        return {"seed": seed, "percent": percent, "gpupool": 95.0, "fgd": 94.0, "any placement": 99.0}

    benchmark.kept_with(store, "default", [row(42, 96.9), row(43, 96.8)])
    benchmark.kept_with(store, "gpushare40", [row(42, 97.5)])
    rows = benchmark.kept_with(store, "default", [row(43, 96.7), row(45, 96.6)])
    assert [(r["seed"], r["percent"]) for r in rows] == [(42, 96.9), (43, 96.7), (45, 96.6)]
    assert len(store.read_text().splitlines()) == 4  # gpushare40's row kept beside them
