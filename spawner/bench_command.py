"""``gpupool bench``: the FGD paper's placement protocol on a cluster trace, its optimality bound, and the
same protocol with MIG nodes (:mod:`.mig_command`)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from . import mig_command
from .arg_types import positive, whole_number

if TYPE_CHECKING:
    from .bench.bound import BoundResult
    from .bench.trace import TracePod
    from .pool.devices import Node


def add_bench_command(commands: Any) -> None:
    """``gpupool bench placement`` and ``gpupool bench mig``."""
    from .pool.policies import POLICIES

    bench = commands.add_parser("bench", help="benchmarks")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True)
    placement = bench_commands.add_parser(
        "placement", help="the FGD paper's placement protocol on a cluster trace (Alibaba GPU trace v2023)"
    )
    placement.add_argument("--nodes", required=True, metavar="CSV", help="e.g. openb_node_list_gpu_node.csv")
    placement.add_argument("--pods", required=True, metavar="CSV", help="e.g. openb_pod_list_default.csv")
    placement.add_argument("--policy", default="gpupool", choices=sorted(POLICIES))
    placement.add_argument("--seed", type=int, default=42)
    placement.add_argument(
        "--inflate", type=positive, default=1.3, help="demand as a multiple of GPU capacity (default 1.3)"
    )
    placement.add_argument(
        "--scale",
        type=whole_number,
        default=1,
        help="replicate the cluster and its workload N times, to measure cost as the pool grows (default 1)",
    )
    placement.add_argument(
        "--learn",
        action="store_true",
        help="fgd and gpupool learn the task shapes from the tasks they place, as the service's policy does, "
        "instead of being given the trace's typical shapes as the paper gives them",
    )
    placement.add_argument(
        "--bound",
        action="store_true",
        help="also bound what any placement of the arrived tasks could allocate (an LP solved by HiGHS; "
        "needs SciPy: pip install 'jupyterhub-gpupool[bench]')",
    )
    placement.add_argument("--json", action="store_true")
    placement.set_defaults(handler=_bench_placement)
    mig_command.add_bench_mig(bench_commands)


def _bench_placement(args: argparse.Namespace) -> int:
    from .bench.placement import run_placement
    from .bench.trace import load_nodes, load_pods

    nodes, pods = load_nodes(args.nodes), load_pods(args.pods)
    run = run_placement(nodes, pods, args.policy, args.seed, args.inflate, args.scale, args.learn)
    bound = _placement_bound(nodes, pods, args) if args.bound else None
    if args.json:
        print(json.dumps({**run.as_dict(), **({"bound": bound.as_dict()} if bound else {})}))
        return 0
    print(f"policy {run.policy}, seed {run.seed}: {run.pods} tasks, {run.placed} placed, {run.failed} failed")
    for arrived, allocated in run.alloc_pct.items():
        figure = (
            "not reached: no task arrived within a point of it"
            if allocated is None
            else f"{allocated}% allocated"
        )
        print(f"  {arrived}% of GPU capacity arrived: {figure}")
    print(
        f"  fragmented at {round(args.inflate * 100)}% arrived: {run.frag_pct_130}% of GPUs; "
        f"decision p50 {run.p50_us} µs, p99 {run.p99_us} µs"
    )
    print(
        f"  {run.nodes} nodes (scale {run.scale}), {run.seconds} s in all, "
        f"peak memory {run.peak_rss_mib} MiB (the whole process)"
    )
    if bound:
        print(
            f"  no placement of the {bound.tasks:,} GPU tasks that arrived could allocate more than "
            f"{bound.percent}% of GPU capacity ({bound.gpus:,.2f} of {bound.capacity_gpus:,} GPUs; an LP bound "
            f"with each GPU's shares packed and each node kind checked alone ({bound.relaxation}), "
            f"solved in {bound.seconds} s)"
        )
    return 0


def _placement_bound(nodes: list[Node], pods: list[TracePod], args: argparse.Namespace) -> BoundResult:
    """The bound for the run's own arrival: the same cluster, scale, seed and inflation."""
    from .bench.bound import arrived_tasks, placement_bound
    from .bench.placement import scale_cluster

    nodes, pods = scale_cluster(nodes, pods, args.scale)
    return placement_bound(nodes, arrived_tasks(nodes, pods, args.seed, args.inflate))
