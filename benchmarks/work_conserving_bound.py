"""How much any scheduler that places every task that fits could allocate, per seed, beside what runs reach.

    python benchmarks/work_conserving_bound.py --trace PATH/TO/cluster-trace-gpu-v2023 --out benchmarks/results

The optimality bound (``placement_bound``) lets a placement leave any task out; the protocol does not, and
neither does any policy it compares. ``work_conserving_bound`` bounds only runs that place each task as it
arrives wherever it fits (``spawner/bench/work_conserving.py`` says how), so a target above it is out of reach of
gpupool, FGD and every such policy, on that arrival. Each seed's bound runs in its own process, ``--jobs`` at a
time; one takes several minutes on the default workload. Seeds bounded before stay in
``work_conserving_bound.jsonl`` beside the table, so ``--seeds 45,50-51`` adds to it.
"""

from __future__ import annotations

import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from trace_args import trace_parser

from gpupool.spawner.arg_types import seed_list
from gpupool.spawner.bench.bound import arrived_tasks, placement_bound
from gpupool.spawner.bench.placement import run_placement
from gpupool.spawner.bench.trace import load_nodes, load_pods
from gpupool.spawner.bench.work_conserving import LP_SECONDS, work_conserving_bound

POLICIES = ("gpupool", "fgd")


def one_seed(trace: Path, workload: str, seed: int, seconds: float, lp_seconds: float) -> dict[str, object]:
    nodes = load_nodes(trace / "openb_node_list_gpu_node.csv")
    pods = load_pods(trace / f"openb_pod_list_{workload}.csv")
    arrival = arrived_tasks(nodes, pods, seed)
    bound = work_conserving_bound(nodes, arrival, seconds=seconds, lp_seconds=lp_seconds)
    row: dict[str, object] = {"seed": seed, **bound.as_dict()}
    row["any placement"] = placement_bound(nodes, arrival, "share-patterns").percent
    for policy in POLICIES:
        row[policy] = run_placement(nodes, pods, policy, seed).alloc_pct["130"]
    print(row, flush=True)
    return row


def table(rows: list[dict[str, object]]) -> str:
    columns = [*POLICIES, "percent", "any placement"]
    lines = [
        "| seed | gpupool @130 | fgd @130 | bound, placing what fits | bound, any placement "
        "| placed from the start | LPs | LPs stopped | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        figures = " | ".join(f"{row[c]:.2f}" for c in columns)
        lines.append(
            f"| {row['seed']} | {figures} | {row['placed_from_start']:,} | {row['intervals']} "
            f"| {row['stopped']} | {row['seconds']} |"
        )
    means = " | ".join(f"**{statistics.mean(float(r[c]) for r in rows):.2f}**" for c in columns)  # type: ignore[arg-type]
    lines.append(f"| mean | {means} | | | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = trace_parser(__doc__)
    parser.add_argument("--seeds", default=list(range(42, 52)), type=seed_list, help="e.g. 42-51")
    parser.add_argument("--seconds", default=300.0, type=float, help="time to refine each seed's bound")
    parser.add_argument("--lp-seconds", default=LP_SECONDS, type=float, help="most seconds for one LP")
    parser.add_argument("--jobs", default=2, type=int, help="seeds bounded at once")
    args = parser.parse_args()

    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(one_seed, args.trace, args.workload, seed, args.seconds, args.lp_seconds)
            for seed in args.seeds
        ]
        rows = [future.result() for future in futures]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = kept_with(args.out / "work_conserving_bound.jsonl", args.workload, rows)
    switch = rows[0]["switch_kind"]
    (args.out / "work_conserving_bound.md").write_text(
        f"Workload {args.workload}; the first refusal branched on is of the {switch} share.\n\n{table(rows)}"
    )


def kept_with(store: Path, workload: str, rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """The seeds bounded before (a seed's new row replaces its old one), kept in ``store``; this workload's."""
    kept = [json.loads(line) for line in store.read_text().splitlines()] if store.exists() else []
    fresh = {(workload, row["seed"]) for row in rows}
    kept = [row for row in kept if (row["workload"], row["seed"]) not in fresh]
    kept += [{"workload": workload, **row} for row in rows]
    store.write_text("".join(json.dumps(row) + "\n" for row in kept))
    return sorted((row for row in kept if row["workload"] == workload), key=lambda row: int(row["seed"]))


if __name__ == "__main__":
    main()
