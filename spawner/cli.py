"""The ``gpupool`` command: run the hub, install it for a host's users, read a pool, check MIG layouts,
benchmark placement policies, submit and follow training jobs, and print the service's Kubernetes manifests."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from . import bench_command, mig_command, pool_command, store_command
from .hub import up

# Each command imports what it needs when it runs: ``gpupool up`` becomes JupyterHub, and every import before
# that is time the hub's login page waits (NumPy, the kubelet's web server and the service's API client, which
# the other commands need, cost it 0.3 s).

if TYPE_CHECKING:
    from .pool import mig

JOB_COMMANDS = ("submit", "jobs", "logs", "cancel")
ADMIN_COMMANDS = ("drain", "undrain", "fault", "repair", "simulate-xid")
REPORT_COMMANDS = ("usage",)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    try:
        # the service's clients: a refusal is one line and exit status 1, whichever command met it
        if args.command in (*JOB_COMMANDS, *ADMIN_COMMANDS, *REPORT_COMMANDS):
            code: int = _job_commands().run(args.handler, args)
            return code
        result: int = args.handler(args)
        return result
    except BrokenPipeError:  # `gpupool pool --json | head`: the reader has what it wanted
        sys.stderr.close()
        return 0
    except _user_errors() as error:  # evaluated only when something was raised
        print(f"gpupool: {error}", file=sys.stderr)
        return 2


def _user_errors() -> tuple[type[Exception], ...]:
    """The errors that mean a bad file or argument: one line for the user, no traceback."""
    from .backends.simulated import PoolFileError
    from .bench.bound import BoundUnavailable
    from .bench.trace import TraceError
    from .files.quotas_file import QuotaFileError
    from .hub.install import InstallError
    from .hub.user_environment import UserEnvironmentError
    from .kube.manifests import ManifestError
    from .pool import mig
    from .pool.profiles import ProfileError
    from .service.store.copy import StoreCopyError

    return (
        PoolFileError,
        TraceError,
        BoundUnavailable,
        mig.NotMigCapable,
        mig.UnknownMigProfile,
        up.UpError,
        ProfileError,
        QuotaFileError,
        ManifestError,
        InstallError,
        UserEnvironmentError,
        StoreCopyError,
    )


class _NeedsWholeParser(Exception):
    """The one-command parser met something (an error) that the whole command line's parser should answer."""


class _OneCommandParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _NeedsWholeParser(message)


def _parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by a parser of its command alone when that command's parser lives here (``gpupool up``
    then does not import the other commands' modules), else, and for any error, by the whole parser: help
    and error messages are the same either way."""
    if argv and argv[0] in OWN_COMMANDS:
        try:
            return _parser(only=argv[0]).parse_args(argv)
        except _NeedsWholeParser:
            pass
    return _parser().parse_args(argv)


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, a parser that knows that one of :data:`OWN_COMMANDS`."""
    parser_class = argparse.ArgumentParser if only is None else _OneCommandParser
    parser = parser_class(prog="gpupool", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    if only is not None:
        OWN_COMMANDS[only](commands)
        return parser
    for add in OWN_COMMANDS.values():
        add(commands)
    _add_kube(commands)
    _job_commands().add_job_commands(commands)
    _admin_commands().add_admin_commands(commands)
    importlib.import_module("gpupool.widgets.usage_cli").add_usage_command(commands)
    importlib.import_module("gpupool.spawner.hub.install").add_install_commands(commands)
    return parser


def _add_up(commands: Any) -> None:
    hub = commands.add_parser(
        "up", help="run JupyterHub with the gpupool service on this machine (a demo login on loopback)"
    )
    hub.add_argument(
        "-f",
        dest="extra_config",
        metavar="EXTRA_CONFIG.py",
        action="append",
        default=[],
        help="a JupyterHub/gpupool config file loaded after the defaults (repeatable)",
    )
    hub.add_argument(
        "--pool",
        metavar="FILE",
        help="a pool file (simulated backend); default: this host's GPUs, else the demo pool",
    )
    hub.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="spawn servers as pods on this cluster with KubeGPUSpawner, its nodes being the pool "
        "(e.g. the KUBECONFIG that `gpupool kube up` prints)",
    )
    hub.add_argument("--ip", default="127.0.0.1", help="where users connect (default 127.0.0.1)")
    hub.add_argument(
        "--port",
        type=int,
        default=8000,
        help="the public port (default 8000); the proxy's API, the hub and the gpupool service take port+1, "
        "port+81 and port+2101 on loopback unless set below",
    )
    for flag, default in (
        ("--proxy-api-port", "port+1"),
        ("--hub-port", "port+81"),
        ("--service-port", "port+2101"),
    ):
        hub.add_argument(flag, type=int, metavar="PORT", help=f"on loopback (default {default})")
    hub.add_argument(
        "--state-dir",
        default=".gpupool",
        metavar="DIR",
        help="databases, cookie secret, tokens and pid files (default .gpupool/ in the working directory)",
    )
    hub.add_argument(
        "--no-demo-login",
        dest="demo_login",
        action="store_false",
        help="no demo user: JupyterHub's default authenticator, or the one an -f file sets",
    )
    hub.set_defaults(handler=_up)


def _add_mig(commands: Any) -> None:
    mig_parser = commands.add_parser("mig", help="MIG geometry of a GPU product")
    mig_commands = mig_parser.add_subparsers(dest="mig_command", required=True)
    check = mig_commands.add_parser("check", help="exit 0 when these MIG instances fit one GPU together")
    check.add_argument("product", help="e.g. H100-80GB, 'NVIDIA A100-SXM4-40GB', NVIDIA-H200")
    check.add_argument(
        "profiles", nargs="+", metavar="PROFILE", help="e.g. 3g.40gb 2g.20gb 1g.10gb, or pinned: 3g.40gb@4"
    )
    check.set_defaults(handler=_mig_check)
    layouts = mig_commands.add_parser("layouts", help="every maximal MIG layout of a product")
    layouts.add_argument("product")
    layouts.add_argument("--json", action="store_true", help="print every layout with its placements as JSON")
    layouts.set_defaults(handler=_mig_layouts)
    mig_command.add_mig_advise(mig_commands)


def _add_kube(commands: Any) -> None:
    from importlib.metadata import version

    from .files.profiles_file import EXAMPLE_PROFILES
    from .pool.policies import POLICIES

    kube = commands.add_parser("kube", help="gpupool on Kubernetes")
    kube_commands = kube.add_subparsers(dest="kube_command", required=True)
    manifests = kube_commands.add_parser(
        "manifests",
        help="print the gpupool service's Deployment, Service, ConfigMap and RBAC as YAML for kubectl apply -f -",
    )
    manifests.add_argument("--namespace", required=True, help="where the hub and the service run")
    manifests.add_argument(
        "--image",
        default=f"gpupool-hub:{version('jupyterhub-gpupool')}",
        help="the hub image with gpupool (images/hub/Dockerfile), e.g. registry.example.org/gpupool-hub:0.1.0",
    )
    manifests.add_argument(
        "--job-image",
        default=f"gpupool-singleuser:{version('jupyterhub-gpupool')}",
        help="the image training Jobs run in (images/singleuser/Dockerfile)",
    )
    manifests.add_argument("--user-namespace", help="where users' pods and Jobs run (default: --namespace)")
    manifests.add_argument(
        "--profiles",
        metavar="FILE",
        default=str(EXAMPLE_PROFILES),
        help="profiles file (default: the example)",
    )
    manifests.add_argument("--quotas", metavar="FILE", help="quotas file (default: nobody is limited)")
    manifests.add_argument("--policy", default="gpupool", choices=sorted(POLICIES))
    manifests.add_argument(
        "--hub-api-url", default="http://hub:8081/hub/api", help="the hub's API as the service reaches it"
    )
    manifests.add_argument(
        "--db-secret", default="gpupool-db", metavar="NAME", help="Secret whose key 'url' is the database URL"
    )
    manifests.set_defaults(handler=_kube_manifests)
    _local_cluster().add_up_command(kube_commands)


def _job_commands() -> Any:
    """The job commands live on the notebook side (``gpupool.widgets``, a client of the service's API); the
    admin side reaches them by name so that it does not depend on that outer layer."""
    return importlib.import_module("gpupool.widgets.jobs_cli")


def _local_cluster() -> Any:
    """``gpupool kube up``: loaded by name so that other commands do not import the kubelet's web server."""
    return importlib.import_module("gpupool.spawner.kube.local.cluster")


def _admin_commands() -> Any:
    """``drain``, ``undrain``, ``fault``, ``repair`` and ``simulate-xid``: API clients too, reached by name like the
    job commands."""
    return importlib.import_module("gpupool.widgets.admin_cli")


def _up(args: argparse.Namespace) -> int:
    prepared = up.prepare(
        state_dir=args.state_dir,
        ip=args.ip,
        port=args.port,
        ports=(args.proxy_api_port, args.hub_port, args.service_port),
        pool=args.pool,
        extra_config=tuple(args.extra_config),
        demo_login=args.demo_login,
        kubeconfig=args.kubeconfig,
    )
    up.run(prepared)  # this process becomes JupyterHub, until it stops
    return 0


def _mig_check(args: argparse.Namespace) -> int:
    from .pool import mig

    geo = mig.geometry(args.product)
    pinned = [_pinned(geo, text) for text in args.profiles if "@" in text]
    free = [text for text in args.profiles if "@" not in text]
    problem = mig.layout_problem(geo, pinned)
    placed = None if problem else mig.fit(geo, free, pinned)
    wanted = " + ".join(args.profiles)
    if placed is None:
        reason = problem or mig.why_not_fit(geo, [p.profile for p in pinned] + free)
        print(f"no: {wanted} do not fit one {geo.product}: {reason}")
        return 1
    layout = ", ".join(str(p) for p in sorted((*pinned, *placed)))
    print(f"yes: on one {geo.product} as {layout} (profile@start, in memory slices)")
    return 0


def _pinned(geo: mig.Geometry, text: str) -> mig.Placement:
    from .pool import mig

    profile, _, start = text.partition("@")
    geo.profile(profile)  # an unknown name raises with the product's list
    if not start.isdigit():
        raise mig.UnknownMigProfile(f"{text!r}: the start after @ must be a memory slice such as 0 or 4")
    return mig.Placement(int(start), profile)


def _mig_layouts(args: argparse.Namespace) -> int:
    from .pool import mig

    geo = mig.geometry(args.product)
    layouts = mig.maximal_layouts(geo)
    if args.json:
        print(
            json.dumps(
                {
                    "product": geo.product,
                    "memory_slices": geo.memory_slices,
                    "compute_slices": geo.compute_slices,
                    "layouts": [
                        [{"profile": p.profile, "start": p.start} for p in layout] for layout in layouts
                    ],
                },
                indent=2,
            )
        )
        return 0
    combos = mig.profile_combinations(layouts)
    print(
        f"{geo.product}: {len(layouts)} maximal layouts (no instance can be added), "
        f"{len(combos)} combinations of profiles among them"
    )
    for combo in combos:
        print("  " + " + ".join(combo))
    return 0


def _kube_manifests(args: argparse.Namespace) -> int:
    """The files are checked as the service would check them, so a bad one fails here, not in the pod."""
    from pathlib import Path

    import yaml

    from .files.profiles_file import load_profiles
    from .files.quotas_file import load_quotas
    from .kube.deploy import ServiceDeployment, service_manifests

    load_profiles(args.profiles)
    if args.quotas:
        load_quotas(args.quotas)
    settings = ServiceDeployment(
        namespace=args.namespace,
        image=args.image,
        user_namespace=args.user_namespace,
        hub_api_url=args.hub_api_url,
        db_secret=args.db_secret,
        quotas=bool(args.quotas),
        policy=args.policy,
        job_image=args.job_image,
    )
    quotas = Path(args.quotas).read_text() if args.quotas else None
    documents = service_manifests(settings, Path(args.profiles).read_text(), quotas)
    sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True))
    return 0


# The commands whose parsers live here, in the order the help lists them (before kube, jobs and drain).
OWN_COMMANDS: dict[str, Callable[[Any], None]] = {
    "up": _add_up,
    "pool": pool_command.add_pool_command,
    "mig": _add_mig,
    "bench": bench_command.add_bench_command,
    "store": store_command.add_store_command,
}


if __name__ == "__main__":
    sys.exit(main())
