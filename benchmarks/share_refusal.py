"""What the placement protocol rewards that a researcher would not: refusing shares while GPUs sit free.

    python benchmarks/share_refusal.py --trace PATH/TO/cluster-trace-gpu-v2023 --out benchmarks/results

The protocol (``gpupool bench placement``) places each task that fits, with no departures, and scores the GPU
capacity allocated once 130% of it has arrived. A large share (810 milli, the default workload's most common
task) opens a fresh GPU and strands the rest of it, while whole-GPU tasks keep arriving that would have used
that GPU in full. So a scheduler that *refuses* a large share unless a GPU already shared can take it scores
higher, though every refusal is a researcher left waiting beside idle GPUs. This runs the default policy with
that refusal added, for shares of at least each of ``--floors`` milli, to show how much of the distance to the
bound is such refusals. gpupool itself never refuses work that fits.
"""

from __future__ import annotations

import statistics

from trace_args import trace_parser

from gpupool.spawner.arg_types import seed_list
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


def run(nodes: list[Node], pods: list[TracePod], seed: int, floor: int | None) -> tuple[float, int, int]:
    """GPU capacity allocated (%) once the protocol's 130% has arrived, the tasks placed, and how many shares
    that fitted were refused."""
    state, arrival, _ = start_protocol(nodes, pods, "gpupool", seed)
    capacity = sum(len(n.gpus) for n in nodes) * FULL_MILLI
    used = placed = refused = 0
    for number, pod in enumerate(arrival):
        need = pod.request.gpu
        large = floor is not None and isinstance(need, GpuShare) and need.milli >= floor
        if large and opens_a_fresh_gpu(state, pod.request):
            refused += 1
            continue
        if isinstance(state.place(pod.request, f"pod-{number}"), Allocation):
            used += pod.gpu_milli_total
            placed += 1
    return 100 * used / capacity, placed, refused


def table(nodes: list[Node], pods: list[TracePod], seeds: list[int], floors: list[int]) -> str:
    lines = [
        "| shares refused when they would open a fresh GPU | allocated @130 | shares refused that fitted |",
        "|---|---|---|",
    ]
    for floor in [None, *floors]:
        runs = [run(nodes, pods, seed, floor) for seed in seeds]
        what = "none (gpupool)" if floor is None else f"≥ {floor} milli"
        allocated = statistics.mean(r[0] for r in runs)
        refused = statistics.mean(r[2] for r in runs)
        lines.append(f"| {what} | {allocated:.2f} | {refused:,.0f} |")
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
