"""The placement protocol with MIG nodes (`gpupool bench mig`) on the committed sample of the Alibaba trace."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from builders import gpu, node

from gpupool.spawner.bench.mig_bench import (
    MigRun,
    MigSetup,
    alternatives,
    mig_cluster,
    place_either,
    run_mig_placement,
)
from gpupool.spawner.bench.placement import run_placement
from gpupool.spawner.bench.trace import TracePod, load_nodes, load_pods
from gpupool.spawner.cli import main
from gpupool.spawner.pool import mig
from gpupool.spawner.pool.devices import GpuMode
from gpupool.spawner.pool.mig_layouts import covering_profile, layout_names, named_layout
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import PoolState

SAMPLE = Path(__file__).parent / "data" / "trace"
NODES, PODS = SAMPLE / "nodes_sample.csv", SAMPLE / "pods_sample.csv"
ON_SAMPLE = ["bench", "mig", "--nodes", str(NODES), "--pods", str(PODS)]
A100 = mig.geometry("A100-80GB")


COLUMNS = (
    "| policy | seeds | alloc @100 | alloc @130 | alloc @130 without MIG | asked by placed @130 | tasks on MIG | "
    "MIG GPUs held | stranded slices @130 | stranded compute @130 |"
)
COUNTS = (6, 8)  # tasks on MIG, stranded slices: the cells after policy and seeds that are counts


def _rows(out: str) -> dict[str, list[str]]:
    return {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if line.startswith("| ") and not line.startswith("| policy")
        for cells in [[c.strip() for c in line.split("|")[1:-1]]]
    }


def test_the_cli_prints_allocation_and_stranded_slices_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ON_SAMPLE, "--mig-share", "0.3", "--mig-layout", "all-balanced", "--seeds", "42-43"]) == 0
    out = capsys.readouterr().out
    heading, legend = out.splitlines()[:2]
    assert "A100-80GB GPUs by seed, all-balanced; --mig-share 0.3); mean over seeds 42–43" in heading
    assert "Percent of the cluster's GPU capacity: alloc @100, @130" in legend
    assert (
        "Percent of the MIG GPUs' capacity: MIG GPUs held" in legend
        and "Counts: tasks on MIG, stranded" in legend
    )
    assert "stranded compute (the stranded slices' compute share)" in legend
    assert COLUMNS in out
    rows = _rows(out)
    for policy in ("gpupool", "fgd", "best-fit", "first-fit"):
        cells = rows[policy]
        assert cells[0] == "42,43", cells
        for at, cell in enumerate(cells[1:], start=2):  # means over two seeds: counts with one decimal
            assert re.fullmatch(r"\d+\.\d" if at in COUNTS else r"\d+\.\d\d", cell), (policy, at, cell)


def test_the_table_is_the_json_runs_and_counts_are_whole_for_one_seed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [*ON_SAMPLE, "--policy", "gpupool", "--mig-layout", "all-4g"]
    assert main(argv) == 0
    cells = _rows(capsys.readouterr().out)["gpupool"]
    assert main([*argv, "--json"]) == 0
    (run,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert cells[1:] == [
        f"{run['alloc_pct']['100']:.2f}",
        f"{run['alloc_pct']['130']:.2f}",
        f"{run['alloc_without_mig_pct']['130']:.2f}",
        f"{run['asked_by_placed_pct']:.2f}",
        str(run["tasks_on_mig"]),
        f"{run['mig_gpus_held_pct']:.2f}",
        str(run["stranded_slices"]),
        f"{run['stranded_compute_pct']:.2f}",
    ]
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    assert run["alloc_without_mig_pct"] == run_placement(nodes, pods, "gpupool", 42).alloc_pct


def test_without_mig_nodes_it_is_the_placement_benchmark_exactly() -> None:
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    for policy in ("gpupool", "first-fit", "random"):
        plain = run_placement(nodes, pods, policy, 42)
        none = run_mig_placement(nodes, pods, policy, 42, MigSetup(0.0))
        assert none.alloc_pct == plain.alloc_pct and none.failed == plain.failed and none.mig_gpus == 0


def test_mig_nodes_are_the_share_the_seed_picks_in_the_named_layout() -> None:
    nodes = load_nodes(NODES)
    setup = MigSetup(0.3, "all-balanced")
    cluster = mig_cluster(nodes, setup, 42)
    made = [n for n in cluster if n.gpus and n.gpus[0].mode is GpuMode.MIG]
    assert len(made) == round(0.3 * sum(1 for n in nodes if n.gpus))
    before = {n.name: n for n in nodes}
    for n in made:
        assert len(n.gpus) == len(before[n.name].gpus) and n.cpu_milli == before[n.name].cpu_milli
        for g in n.gpus:
            layout = [mig.Placement(m.start, m.profile) for m in g.mig_instances]
            assert g.product == "A100-80GB" and mig.layout_problem(A100, layout) is None
            assert sorted(m.profile for m in g.mig_instances) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert {n.name for n in made} == {
        n.name for n in mig_cluster(nodes, setup, 42) if n.gpus[0].mode is GpuMode.MIG
    }
    other = {n.name for n in mig_cluster(nodes, setup, 43) if n.gpus and n.gpus[0].mode is GpuMode.MIG}
    assert other != {n.name for n in made}


def test_a_task_may_take_the_smallest_covering_mig_profile_or_what_it_asked() -> None:
    covering = [covering_profile(A100, m) for m in (142, 143, 286, 428, 460, 1000)]
    assert [p.name if p else None for p in covering] == [
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ]
    a30 = mig.geometry("A30-24GB")
    assert [p.name if p else None for p in (covering_profile(a30, 250), covering_profile(a30, 251))] == [
        "1g.6gb",
        "2g.12gb",
    ]
    assert covering_profile(A100, 100, memory_mib=90 * 1024) is None  # more memory than the GPU has
    offered = frozenset(p.profile for p in named_layout(A100, "all-balanced"))
    share = Request(6000, 12288, GpuShare(250))
    assert alternatives(share, A100, offered) == (
        Request(6000, 12288, MigSlice("2g.20gb", products=frozenset({"A100-80GB"}))),
        share,
    )
    big = Request(6000, 12288, GpuShare(460))  # needs a 4g: all-balanced has none
    named = Request(6000, 12288, GpuShare(250, products=frozenset({"T4-16GB"})))
    whole, pair = Request(12000, 16384, WholeGpus(1)), Request(12000, 16384, WholeGpus(2))
    assert [len(alternatives(r, A100, offered)) for r in (big, named, whole, pair)] == [1, 1, 1, 1]
    seven = frozenset(p.profile for p in named_layout(A100, "all-7g"))
    assert alternatives(whole, A100, seven)[0].gpu == MigSlice("7g.80gb", products=frozenset({"A100-80GB"}))


def test_the_policy_places_each_task_on_the_alternative_it_scores_best() -> None:
    mig_node = node("mig-a", [gpu("mig-a", 0, "A100-80GB", layout=["1g.10gb@0", "2g.20gb@2"])])
    shared = node("shared-b", [gpu("shared-b", 0, "L4-24GB", mode=GpuMode.SHARED)])
    share = Request(1000, 1024, GpuShare(100))
    ways = alternatives(share, A100, frozenset({"1g.10gb", "2g.20gb"}))
    for ranks, expected in (([0, 1], "mig-a"), ([1, 0], "shared-b")):  # first-fit: the lower rank wins
        state = PoolState([mig_node, shared], "first-fit", ranks=ranks)
        placed = place_either(state, ways, "t1", random.Random(1))
        assert placed is not None and placed.node == expected
    full = PoolState([mig_node], "first-fit")
    assert place_either(full, ways, "a", random.Random(1)) is not None
    assert place_either(full, ways, "b", random.Random(1)) is None  # the one 1g is taken; no share anywhere


def test_json_runs_count_stranded_slices_among_the_mig_instances(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*ON_SAMPLE, "--policy", "fgd", "--mig-layout", "all-3g", "--json"]
    assert main(argv) == 0
    (run,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert run["mig_gpus"] > 0 and 0 <= run["stranded_slices"] <= 2 * run["mig_gpus"]  # all-3g: two per GPU
    assert run["placed"] + run["failed"] == run["pods"] and run["tasks_on_mig"] <= run["placed"]
    assert run["asked_by_placed_pct"] <= run["alloc_pct"]["130"] + 1  # a task never holds less than it asked


def _one_mig_node(milli: int, layout: str) -> MigRun:
    """Two GPUs made A100-80GB in ``layout``, and tasks of ``milli`` each, until 130% has arrived."""
    nodes = [node("n0", [gpu("n0", 0, "T4-16GB"), gpu("n0", 1, "T4-16GB")])]
    pods = [TracePod(f"p{i}", Request(1000, 1024, GpuShare(milli))) for i in range(3)]
    return run_mig_placement(nodes, pods, "first-fit", 42, MigSetup(1.0, layout))


def _last_alloc(run: MigRun) -> float:
    """The allocation when the last task arrived (two GPUs: arrival moves in steps too coarse for @130)."""
    return [v for v in run.curve.values() if v is not None][-1]


def test_compute_no_instance_covers_is_neither_held_allocated_nor_stranded() -> None:
    four = _one_mig_node(460, "all-4g")  # one 4g.40gb per GPU: 3 of 7 compute slices in no instance
    assert (four.mig_gpus, four.tasks_on_mig, four.stranded_slices) == (2, 2, 0)
    assert four.mig_gpus_held_pct == _last_alloc(four) == round(100 * 4 / 7, 2)  # not 100
    assert four.stranded_compute_pct == 0.0
    unused = _one_mig_node(100, "all-4g")  # a 1g task: no 4g serves it, nothing is held
    assert (unused.tasks_on_mig, unused.mig_gpus_held_pct, _last_alloc(unused)) == (0, 0.0, 0.0)
    assert unused.stranded_slices == 2 and unused.stranded_compute_pct == round(100 * 4 / 7, 2)  # not 100
    ones = _one_mig_node(100, "all-1g.20gb")  # four 1g.20gb: 3 of 7 slices in no instance
    assert (ones.mig_gpus_held_pct, ones.stranded_slices, ones.stranded_compute_pct) == (
        0.0,
        8,
        round(400 / 7, 2),
    )


def test_a_bad_layout_or_policy_is_one_line_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*ON_SAMPLE, "--mig-layout", "all-5g"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "no MIG layout 'all-5g'" in err and "all-balanced, all-1g" in err
    with pytest.raises(SystemExit):
        main([*ON_SAMPLE, "--policy", "fastest"])
    assert "--policy: unknown fastest" in capsys.readouterr().err


def test_every_stock_layout_name_is_a_legal_layout_with_the_mig_managers_counts() -> None:
    for geo in mig.GEOMETRIES.values():
        for name in layout_names(geo):
            assert mig.layout_problem(geo, named_layout(geo, name)) is None, (geo.product, name)

    def counts(product: str, name: str) -> list[str]:
        return sorted(p.profile for p in named_layout(mig.geometry(product), name))

    assert counts("A30-24GB", "all-balanced") == ["1g.6gb", "1g.6gb", "2g.12gb"]
    assert counts("H100-80GB", "all-1g") == counts("H100-80GB", "all-1g.10gb") == ["1g.10gb"] * 7
    assert (
        counts("H100-80GB", "all-1g.20gb") == ["1g.20gb"] * 4
        and counts("H100-80GB", "all-2g") == ["2g.20gb"] * 3
    )
    assert counts("H200-141GB", "all-3g") == ["3g.71gb"] * 2 and counts("A100-40GB", "all-7g") == ["7g.40gb"]
    assert counts("H100-80GB", "all-1g.10gb.me") == ["1g.10gb+me"]
