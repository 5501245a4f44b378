"""``gpupool`` as the service runs it: learning the task shapes from the tasks it places, beside the table's runs.

    python benchmarks/learned_mix.py --trace PATH/TO/cluster-trace-gpu-v2023 --out benchmarks/results

The paper's protocol hands FGD the workload's typical shapes before the first task arrives, and the placement
table gives ``gpupool`` the same. The service has no trace: its policy tallies what it places and re-reads the
mix as the count doubles. Each (workload, seed) runs both ways (``gpupool bench placement`` with and without
``--learn``); ``learned_mix.md`` has the allocation at 100% and 130% and the decision p99 of each.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from trace_args import trace_parser

from gpupool.spawner.arg_types import seed_list
from gpupool.spawner.bench.placement import run_placement
from gpupool.spawner.bench.trace import load_nodes, load_pods

MODES = {"given": False, "learned": True}


def one_run(trace: Path, workload: str, seed: int, learn: bool) -> dict[str, Any]:
    nodes = load_nodes(trace / "openb_node_list_gpu_node.csv")
    pods = load_pods(trace / f"openb_pod_list_{workload}.csv")
    run = run_placement(nodes, pods, "gpupool", seed, learn=learn)
    return {"workload": workload, "learn": learn, **run.as_dict()}


Runs = list[dict[str, Any]]


def _mean(runs: Runs, point: str) -> float:
    return statistics.mean(float(run["alloc_pct"][point]) for run in runs)


def _worst_p99_ms(runs: Runs) -> float:
    return max(float(run["p99_us"]) for run in runs) / 1000


def table(runs: Runs, workloads: list[str]) -> str:
    lines = [
        "| workload | given @100 | learned @100 | given @130 | learned @130 | learned − given @130 "
        "| given p99 ms | learned p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    gaps = []
    for workload in workloads:
        given, learned = (
            [run for run in runs if run["workload"] == workload and run["learn"] is learn]
            for learn in MODES.values()
        )
        gap = _mean(learned, "130") - _mean(given, "130")
        gaps.append(gap)
        lines.append(
            f"| {workload} | {_mean(given, '100'):.2f} | {_mean(learned, '100'):.2f} | {_mean(given, '130'):.2f} "
            f"| {_mean(learned, '130'):.2f} | {gap:+.2f} | {_worst_p99_ms(given):.2f} | {_worst_p99_ms(learned):.2f} |"
        )
    lines.append(
        f"\nMean of learned − given at 130% over the {len(workloads)} workloads: {statistics.mean(gaps):+.3f}."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = trace_parser(__doc__)
    parser.add_argument(
        "--workloads", default="", help="comma-separated; every pod list in the trace if empty"
    )
    parser.add_argument("--seeds", default=list(range(42, 52)), type=seed_list, help="e.g. 42-51")
    parser.add_argument("--jobs", default=2, type=int, help="runs at once")
    args = parser.parse_args()
    workloads = (
        args.workloads.split(",")
        if args.workloads
        else sorted(
            path.stem.removeprefix("openb_pod_list_") for path in args.trace.glob("openb_pod_list_*.csv")
        )
    )
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(one_run, args.trace, workload, seed, learn)
            for workload in workloads
            for seed in args.seeds
            for learn in MODES.values()
        ]
        runs = [future.result() for future in futures]
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = f"{min(args.seeds)}–{max(args.seeds)}"
    (args.out / "learned_mix.md").write_text(
        f"`gpupool` given the trace's typical shapes (as the table) and learning them online (as the service), "
        f"seeds {seeds}; p99 is the worst seed's, with {args.jobs} runs at once.\n\n{table(runs, workloads)}"
    )


if __name__ == "__main__":
    main()
