"""What the placement protocol rewards that a researcher would not: refusing shares while GPUs sit free.

    python benchmarks/share_refusal.py --trace PATH/TO/cluster-trace-gpu-v2023 --out benchmarks/results

The protocol (``gpupool bench placement``) places each task that fits, with no departures, and scores the GPU
capacity allocated once 130% of it has arrived. A large share (810 milli, the default workload's most common
task) opens a fresh GPU and strands the rest of it, while whole-GPU tasks keep arriving that would have used
that GPU in full. So a scheduler that *refuses* a large share unless a GPU already shared can take it scores
higher, though every refusal is a researcher left waiting beside idle GPUs. This runs the default policy with
that refusal added, for shares of at least each of ``--floors`` milli, to show how much of the distance to the
bound is such refusals (FGD and first-fit, placing what fits, are rows too). gpupool itself never refuses
work that fits.

Each row also bounds what its runs could have reached once they had placed the shares they did: the
optimality bound (``spawner/bench/bound.py``) over placements that hold at least those shares. Placing what
fits, the distance left to that bound is packing; beyond it, only placing other shares (refusing) helps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from trace_args import trace_parser

from gpupool.spawner.arg_types import seed_list
from gpupool.spawner.bench.bound import placement_bound
from gpupool.spawner.bench.placement import start_protocol
from gpupool.spawner.bench.trace import TracePod, load_nodes, load_pods
from gpupool.spawner.pool.devices import FULL_MILLI, Node
from gpupool.spawner.pool.requests import GpuShare, Request
from gpupool.spawner.pool.state import Allocation, PoolState


def opens_a_fresh_gpu(state: PoolState, request: Request) -> bool:
    """True when ``request`` fits, but only on GPUs that nothing holds yet."""
    candidates = state.candidates(request)
    shared = any(node.free[option[0]] < FULL_MILLI for node, options in candidates for option in options)
    return bool(candidates) and not shared


@dataclass(frozen=True)
class RefusalRun:
    """One run of the protocol; percentages are of the cluster's GPU capacity, once 130% has arrived."""

    allocated: float
    placed: int
    refused: int  # shares that fitted and were turned away
    bound_holding_shares: float  # the most any placement holding the shares this run placed could allocate


def run(
    nodes: list[Node], pods: list[TracePod], seed: int, floor: int | None, policy: str = "gpupool"
) -> RefusalRun:
    """The protocol with ``policy``, refusing shares of ``floor`` milli or more that would open a fresh GPU."""
    state, arrival, _ = start_protocol(nodes, pods, policy, seed)
    capacity = sum(len(n.gpus) for n in nodes) * FULL_MILLI
    used = placed = refused = 0
    shares_placed = []
    for number, pod in enumerate(arrival):
        need = pod.request.gpu
        large = floor is not None and isinstance(need, GpuShare) and need.milli >= floor
        if large and opens_a_fresh_gpu(state, pod.request):
            refused += 1
            continue
        if isinstance(state.place(pod.request, f"pod-{number}"), Allocation):
            used += pod.gpu_milli_total
            placed += 1
            if isinstance(need, GpuShare):
                shares_placed.append(pod)
    bound = placement_bound(nodes, arrival, holding=shares_placed)
    return RefusalRun(100 * used / capacity, placed, refused, bound.percent)


def table(nodes: list[Node], pods: list[TracePod], seeds: list[int], floors: list[int]) -> str:
    lines = [
        "| policy | shares refused when they would open a fresh GPU | allocated @130 "
        "| shares refused that fitted | bound holding the shares placed |",
        "|---|---|---|---|---|",
    ]
    rows = [("gpupool", None), ("fgd", None), ("first-fit", None), *(("gpupool", floor) for floor in floors)]
    for policy, floor in rows:
        runs = [run(nodes, pods, seed, floor, policy) for seed in seeds]
        what = "none" if floor is None else f"≥ {floor} milli"
        allocated = statistics.mean(r.allocated for r in runs)
        refused = statistics.mean(r.refused for r in runs)
        bound = statistics.mean(r.bound_holding_shares for r in runs)
        lines.append(f"| {policy} | {what} | {allocated:.2f} | {refused:,.0f} | {bound:.2f} |")
        print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = trace_parser(__doc__)
    parser.add_argument("--seeds", default=list(range(42, 52)), type=seed_list, help="e.g. 42-51")
    parser.add_argument("--floors", default="700,450", help="comma-separated share sizes in milli")
    args = parser.parse_args()

    nodes = load_nodes(args.trace / "openb_node_list_gpu_node.csv")
    pods = load_pods(args.trace / f"openb_pod_list_{args.workload}.csv")
    floors = [int(f) for f in args.floors.split(",")]
    text = table(nodes, pods, args.seeds, floors)
    args.out.mkdir(parents=True, exist_ok=True)
    seeds = f"{args.seeds[0]}–{args.seeds[-1]}" if len(args.seeds) > 1 else str(args.seeds[0])
    (args.out / "share_refusal.md").write_text(f"Workload {args.workload}, mean of seeds {seeds}.\n\n{text}")


if __name__ == "__main__":
    main()
