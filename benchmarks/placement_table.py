"""Every placement policy on every workload of the Alibaba GPU trace (v2023), by the FGD paper's protocol.

    python benchmarks/placement_table.py --trace PATH/TO/cluster-trace-gpu-v2023 --out benchmarks/results

Each run is one ``gpupool bench placement`` (same code, called in-process) and is appended to
``runs.jsonl`` as it finishes, so an interrupted table resumes where it stopped. The optimality bound
(``gpupool bench placement --bound``) of every (workload, seed) that ``gpupool`` ran goes to ``bounds.jsonl``
the same way. ``placement.md`` is the summary the README quotes: mean allocation at 100% and 130% of GPU
capacity arrived, per workload and policy, the bound and how much of FGD's distance to it ``gpupool``
closes, next to the paper's own figures where it published them; then each workload's decision latency.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from readme_table import write_between

from gpupool.spawner.arg_types import seed_list
from gpupool.spawner.bench.bound import arrived_tasks, placement_bound
from gpupool.spawner.bench.placement import run_placement
from gpupool.spawner.bench.trace import load_nodes, load_pods

POLICIES = ("random", "first-fit", "spread", "best-fit", "fgd", "gpupool")
README_START = "<!-- placement-table: written by benchmarks/placement_table.py -->"
README_END = "<!-- /placement-table -->"
PAPER_NAMES = {"random": "01-Random", "best-fit": "05-BestFit", "fgd": "06-FGD"}


def _run(trace: str, workload: str, policy: str, seed: int) -> dict[str, Any]:
    nodes = load_nodes(Path(trace) / "openb_node_list_gpu_node.csv")
    pods = load_pods(Path(trace) / f"{workload}.csv")
    return {"workload": workload, **run_placement(nodes, pods, policy, seed).as_dict()}


def _bound(trace: str, workload: str, seed: int) -> dict[str, Any]:
    nodes = load_nodes(Path(trace) / "openb_node_list_gpu_node.csv")
    pods = load_pods(Path(trace) / f"{workload}.csv")
    return {
        "workload": workload,
        "seed": seed,
        **placement_bound(nodes, arrived_tasks(nodes, pods, seed)).as_dict(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--trace", required=True, help="folder with openb_node_list_gpu_node.csv and pod lists"
    )
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--seeds", type=seed_list, default="42-44", help="e.g. 42-51")
    parser.add_argument(
        "--default-seeds", type=seed_list, default="42-51", help="seeds for the default workload"
    )
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--workloads", default="", help="comma-separated; default: every pod list in --trace")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--reference", default="", help="the paper's allocation_summary.csv, to print beside ours"
    )
    parser.add_argument("--readme", default="", help="also write the table into this README, between markers")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_file = out / "runs.jsonl"
    done = {(r["workload"], r["policy"], r["seed"]) for r in _read_runs(runs_file)}
    workloads = (
        args.workloads.split(",")
        if args.workloads
        else sorted(p.stem for p in Path(args.trace).glob("openb_pod_list_*.csv"))
    )
    jobs = [
        (workload, policy, seed)
        for workload in workloads
        for seed in (args.default_seeds if workload == "openb_pod_list_default" else args.seeds)
        for policy in args.policies.split(",")
        if (workload, policy, seed) not in done
    ]
    print(f"{len(done)} runs already in {runs_file}; {len(jobs)} to go")
    _run_all(
        [(_run, (args.trace, *job)) for job in jobs],
        runs_file,
        args.jobs,
        lambda r: f"{r['workload']} {r['policy']} seed {r['seed']}: {r['alloc_pct']['130']}% at 130%",
    )
    _add_bounds(args.trace, out / "bounds.jsonl", _read_runs(runs_file), args.jobs)
    table = summarise(_read_runs(runs_file), _reference(args.reference), _read_runs(out / "bounds.jsonl"))
    (out / "placement.md").write_text(table)
    print(f"wrote {out / 'placement.md'}")
    if args.readme:
        write_between(Path(args.readme), README_START, README_END, table)


def _add_bounds(trace: str, bounds_file: Path, runs: list[dict[str, Any]], jobs: int) -> None:
    """The bound of every (workload, seed) gpupool ran and ``bounds_file`` lacks: one LP each, a few seconds."""
    done = {(b["workload"], b["seed"]) for b in _read_runs(bounds_file)}
    wanted = sorted({(str(r["workload"]), int(r["seed"])) for r in runs if r["policy"] == "gpupool"})
    missing = [(w, s) for w, s in wanted if (w, s) not in done and (Path(trace) / f"{w}.csv").exists()]
    print(f"{len(done)} bounds already in {bounds_file}; {len(missing)} to go")
    _run_all(
        [(_bound, (trace, w, s)) for w, s in missing],
        bounds_file,
        jobs,
        lambda r: f"{r['workload']} seed {r['seed']}: bound {r['percent']}% ({r['seconds']} s)",
    )


def _run_all(
    calls: list[tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]],
    sink_path: Path,
    jobs: int,
    describe: Callable[[dict[str, Any]], str],
) -> None:
    """Each call in ``jobs`` processes, its result appended to ``sink_path`` as it finishes (so a stopped
    table resumes where it was) and described on the terminal."""
    with ProcessPoolExecutor(jobs) as pool, sink_path.open("a") as sink:
        futures = [pool.submit(function, *arguments) for function, arguments in calls]
        for number, future in enumerate(as_completed(futures), start=1):
            result = future.result()
            sink.write(json.dumps(result) + "\n")
            sink.flush()
            print(f"[{number}/{len(calls)}] {describe(result)}", flush=True)


def _read_runs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _reference(path: str) -> dict[tuple[str, str], dict[str, str]]:
    if not path:
        return {}
    with open(path, newline="") as handle:
        return {(row["workload"], row["policy"]): row for row in csv.DictReader(handle)}


def summarise(
    runs: list[dict[str, Any]],
    reference: dict[tuple[str, str], dict[str, str]],
    bounds: list[dict[str, Any]] | None = None,
) -> str:
    """Markdown: per workload, each policy's mean allocation at 100% / 130% arrived, the bound and the gap
    gpupool closes; then per-workload decision latency; then ours against the paper's on the default workload."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        grouped[(str(run["workload"]), str(run["policy"]))].append(run)
    bound_of = {(str(b["workload"]), int(b["seed"])): float(b["percent"]) for b in bounds or []}
    workloads = sorted({w for w, _ in grouped})
    policies = [p for p in POLICIES if any((w, p) in grouped for w in workloads)]
    lines = [
        "| workload | seeds | "
        + " | ".join(policies)
        + " | gpupool − fgd @130 | bound @130 | gap closed | paper FGD @130 |",
        "|---|---|" + "---|" * len(policies) + "---|---|---|---|",
    ]
    for workload in workloads:
        cells = []
        counts: set[int] = set()
        for policy in policies:
            results = grouped.get((workload, policy), [])
            counts.add(len(results))
            cells.append(f"{_mean(results, '100'):.2f} / {_mean(results, '130'):.2f}" if results else "")
        ours, fgd = grouped.get((workload, "gpupool"), []), grouped.get((workload, "fgd"), [])
        gain = f"{_mean(ours, '130') - _mean(fgd, '130'):+.2f}" if ours and fgd else ""
        seeds_bounded = [
            bound_of[(workload, int(r["seed"]))] for r in ours if (workload, r["seed"]) in bound_of
        ]
        bound = statistics.fmean(seeds_bounded) if ours and len(seeds_bounded) == len(ours) else None
        closed = ""
        if bound is not None and fgd and bound > _mean(fgd, "130"):
            closed = f"{(_mean(ours, '130') - _mean(fgd, '130')) / (bound - _mean(fgd, '130')) * 100:.0f}%"
        paper = reference.get((workload, PAPER_NAMES["fgd"]), {}).get("alloc_pct_at_130", "")
        seeds = "/".join(str(n) for n in sorted(counts - {0}))
        lines.append(
            f"| {workload.removeprefix('openb_pod_list_')} | {seeds} | "
            + " | ".join(cells)
            + f" | {gain} | {'' if bound is None else f'{bound:.2f}'} | {closed} | {paper} |"
        )
    if bound_of:
        lines += [
            "",
            "bound @130: the most any placement of the arrived tasks could allocate (an LP bound, mean over the "
            "gpupool seeds); gap closed: (gpupool − fgd) / (bound − fgd) at 130%.",
        ]
    lines += _latency(grouped, workloads, policies)
    lines += _against_paper(grouped, reference)
    return "\n".join(lines) + "\n"


def _latency(
    grouped: dict[tuple[str, str], list[dict[str, Any]]], workloads: list[str], policies: list[str]
) -> list[str]:
    """Per workload and policy, the worst seed's p50 / p99 per decision, and the worst p99 of all."""
    lines = ["", "Per-decision latency on the 1,213-node cluster, µs, p50 / p99 of the worst seed:", ""]
    lines += ["| workload | " + " | ".join(policies) + " |", "|---|" + "---|" * len(policies)]
    worst: dict[str, tuple[float, str]] = {}
    for workload in workloads:
        cells = []
        for policy in policies:
            chosen = grouped.get((workload, policy), [])
            if not chosen:
                cells.append("")
                continue
            p50 = max(float(r["p50_us"]) for r in chosen)
            p99 = max(float(r["p99_us"]) for r in chosen)
            cells.append(f"{p50:.0f} / {p99:.0f}")
            worst[policy] = max(worst.get(policy, (0.0, "")), (p99, workload.removeprefix("openb_pod_list_")))
        lines.append(f"| {workload.removeprefix('openb_pod_list_')} | " + " | ".join(cells) + " |")
    summary = [
        f"{policy} {worst[policy][0] / 1000:.2f} ms ({worst[policy][1]})"
        for policy in ("gpupool", "fgd")
        if policy in worst
    ]
    if summary:
        lines += ["", f"Worst p99 over all {len(workloads)} workloads: " + ", ".join(summary) + "."]
    return lines


def _against_paper(
    grouped: dict[tuple[str, str], list[dict[str, Any]]], reference: dict[tuple[str, str], dict[str, str]]
) -> list[str]:
    if not reference:
        return []
    lines = ["", "Default workload at 130%, ours against the paper (mean of the same seeds, 42–51):", ""]
    lines += ["| policy | ours | paper | difference |", "|---|---|---|---|"]
    for policy, paper_name in PAPER_NAMES.items():
        ours = grouped.get(("openb_pod_list_default", policy))
        theirs = reference.get(("openb_pod_list_default", paper_name))
        if ours and theirs:
            mine, published = _mean(ours, "130"), float(theirs["alloc_pct_at_130"])
            lines.append(f"| {policy} | {mine:.2f} | {published:.2f} | {mine - published:+.2f} |")
    return lines


def _mean(results: list[dict[str, Any]], checkpoint: str) -> float:
    values = [r["alloc_pct"][checkpoint] for r in results]
    return statistics.fmean(v for v in values if v is not None)


if __name__ == "__main__":
    main()
