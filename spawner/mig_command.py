"""``gpupool mig advise`` and ``gpupool bench mig``: MIG layouts for the demand seen, and the placement
benchmark with MIG nodes.

``mig advise`` reads the demand from a pod list like the Alibaba trace's (``--trace``, shrunk to ``--load`` ×
the MIG GPUs' capacity when it asks more, keeping its mix; the pool from ``--pool FILE``, else as ``gpupool
pool`` finds it) or from the running service (``--url``/``--token``, or
``GPUPOOL_SERVICE_URL``/``JUPYTERHUB_API_TOKEN``, or the ``gpupool up`` of ``--state-dir``), whose admin route
``GET admin/mig-advice`` advises on its live pool from its leases and queue (an admin's token). An option of
one source given with the other is refused, never ignored. Advice only: gpupool never changes a MIG layout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

from .arg_types import positive, seed_list
from .names import UP_STATE

DEFAULT_POLICIES = "gpupool,fgd,best-fit,first-fit"


def add_mig_advise(mig_commands: Any) -> None:
    advise = mig_commands.add_parser(
        "advise",
        help="the MIG layout per MIG GPU that serves the demand seen best (a trace, or the service's leases)",
    )
    advise.add_argument("--trace", metavar="PODS.csv", help="a pod list like openb_pod_list_default.csv")
    advise.add_argument("--pool", metavar="FILE", help="with --trace: a pool file (default: as gpupool pool)")
    advise.add_argument(
        "--profiles",
        metavar="FILE",
        help="with --trace: the hub's profiles file; each MIG profile in it keeps a slice to start on (default: "
        "the shipped example, as the service's)",
    )
    advise.add_argument(
        "--load",
        type=positive,
        help="with --trace: a trace asking more is shrunk to LOAD × the MIG GPUs' capacity, keeping its mix "
        "(default 1)",
    )
    advise.add_argument(
        "--url",
        help="without --trace: the gpupool service (default: $GPUPOOL_SERVICE_URL, else --state-dir's)",
    )
    advise.add_argument(
        "--token",
        help="without --trace: an admin's JupyterHub API token (default: $JUPYTERHUB_API_TOKEN, which, "
        "unlike a command line, other accounts cannot read in ps)",
    )
    advise.add_argument(
        "--state-dir", metavar="DIR", help=f"without --trace: gpupool up's state folder (default {UP_STATE})"
    )
    advise.add_argument("--json", action="store_true", help="print JSON instead of text")
    advise.set_defaults(handler=mig_advise)


def add_bench_mig(bench_commands: Any) -> None:
    bench = bench_commands.add_parser(
        "mig", help="the placement protocol with a share of the trace's nodes as MIG nodes"
    )
    bench.add_argument("--nodes", required=True, metavar="CSV", help="e.g. openb_node_list_gpu_node.csv")
    bench.add_argument("--pods", required=True, metavar="CSV", help="e.g. openb_pod_list_default.csv")
    bench.add_argument(
        "--mig-share", type=float, default=0.3, help="share of GPU nodes made MIG (default 0.3)"
    )
    bench.add_argument(
        "--mig-layout",
        default="all-balanced",
        help="a MIG Manager stock layout: all-balanced, all-1g … all-7g",
    )
    bench.add_argument(
        "--mig-product", default="A100-80GB", help="what MIG nodes' GPUs are (default A100-80GB)"
    )
    bench.add_argument(
        "--policy", default=DEFAULT_POLICIES, help=f"comma-separated (default {DEFAULT_POLICIES})"
    )
    bench.add_argument("--seeds", type=seed_list, default=[42], help="e.g. 42, 42,43 or 42-44 (default 42)")
    bench.add_argument("--inflate", type=positive, default=1.3, help="demand as a multiple of capacity (1.3)")
    bench.add_argument("--json", action="store_true", help="one JSON object per run")
    bench.set_defaults(handler=bench_mig)


def _fail(message: str) -> NoReturn:
    print(f"gpupool: {message}", file=sys.stderr)
    raise SystemExit(2)


def mig_advise(args: argparse.Namespace) -> int:
    _refuse_mixed_sources(args)
    description = _from_trace(args) if args.trace else _from_service(args)
    if args.json:
        print(json.dumps(description, indent=2))
        return 0
    from .mig_report import render_advice

    print(render_advice(description))
    return 0


def _refuse_mixed_sources(args: argparse.Namespace) -> None:
    """The demand comes from a trace (with ``--pool``, ``--load``) or from the live service (with ``--url``,
    ``--token``, ``--state-dir``), never both: an option of the other source would be ignored, so it is
    refused in one line naming it."""
    if args.trace is None:
        for flag, value in (("--pool", args.pool), ("--load", args.load), ("--profiles", args.profiles)):
            if value is not None:
                _fail(
                    f"{flag} goes with --trace; without --trace the advice is the live service's, on its own "
                    "pool and from its leases and queue"
                )
        return
    service = [
        f
        for f, v in (("--url", args.url), ("--token", args.token), ("--state-dir", args.state_dir))
        if v is not None
    ]
    if service:
        _fail(
            f"--trace does not go with {', '.join(service)}: --trace advises on a pod list's tasks, "
            f"{'/'.join(service)} on the live service's leases and queue; give one or the other"
        )


def _from_trace(args: argparse.Namespace) -> dict[str, Any]:
    from .backends.discovery import discover_pool
    from .bench.trace import load_pods
    from .files.profiles_file import EXAMPLE_PROFILES, load_profiles
    from .mig_report import describe_advice
    from .pool.mig_advice import advise, demand_of, mig_gpus, mig_products, offered_asks, scaled_demand

    load = 1.0 if args.load is None else args.load
    pods = load_pods(args.trace)  # a missing or bad trace fails before the pool is looked for
    profiles = load_profiles(args.profiles or EXAMPLE_PROFILES)
    found = discover_pool(args.pool)
    if found.note:
        print(f"gpupool: {found.note}", file=sys.stderr)
    gpus = mig_gpus(found.nodes)
    observed = demand_of((pod.request for pod in pods), {gpu.product for gpu in gpus})
    demand = scaled_demand(observed, len(gpus), load)
    source = f"the tasks of {args.trace} on {found.source}"
    if demand != observed:
        source += (
            f" ({observed.total()} asks shrunk to {demand.total()}, {load:g} × the capacity of the "
            f"{len(gpus)} MIG GPUs, keeping their mix)"
        )
    keep = offered_asks((profile.request() for profile in profiles), mig_products(found.nodes))
    return describe_advice(advise(gpus, demand, keep), source)


def _from_service(args: argparse.Namespace) -> dict[str, Any]:
    """The service's advice, through the one API client: a refusal is its sentence (with the client's hint:
    the URL's prefix, an admin's token) on stderr and exit status 1, as for ``gpupool drain``."""
    from .client import GpupoolError
    from .client.connection import Connection

    try:
        connection = Connection(args.url, args.token, state_dir=args.state_dir or UP_STATE)
        answer: dict[str, Any] = connection.call("GET", "admin/mig-advice")
    except GpupoolError as error:
        raise SystemExit(f"gpupool: {error}") from None
    return answer


def bench_mig(args: argparse.Namespace) -> int:
    from .bench.mig_bench import MigSetup, run_with_baseline
    from .bench.mig_table import render_runs
    from .bench.trace import load_nodes, load_pods
    from .pool.mig import NotMigCapable
    from .pool.mig_layouts import UnknownLayout
    from .pool.policies import POLICIES

    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        _fail(f"--policy: unknown {', '.join(unknown) or 'empty'}; choose from {', '.join(POLICIES)}")
    try:
        setup = MigSetup(args.mig_share, args.mig_layout, args.mig_product)
    except UnknownLayout as error:
        _fail(f"--mig-layout: {error}")
    except NotMigCapable as error:
        _fail(f"--mig-product: {error}")
    except ValueError as error:
        _fail(f"--mig-share: {error}")
    nodes, pods = load_nodes(args.nodes), load_pods(args.pods)
    runs = []
    for policy in policies:
        for seed in args.seeds:
            run = run_with_baseline(nodes, pods, policy, seed, setup, args.inflate)
            runs.append(run)
            if args.json:
                print(json.dumps(run.as_dict()), flush=True)
    if not args.json:
        print(render_runs(runs))
    return 0
