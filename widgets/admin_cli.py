"""``gpupool drain | undrain NODE[/GPU]``: take a node or one GPU out of the pool, and put it back (admins).

Drained: nothing new is placed there, jobs running there are stopped and requeued, servers keep running.
The token must carry ``custom:gpupool:admin``; pass ``--url`` and ``--token`` or set ``GPUPOOL_SERVICE_URL``
and ``JUPYTERHUB_API_TOKEN``, as for the job commands.
"""

from __future__ import annotations

import argparse
from typing import Any

from ._api import Connection, GpupoolError
from .jobs_cli import connect, connection_options, run

__all__ = ["add_admin_commands", "parse_device", "run"]


def add_admin_commands(commands: Any) -> None:
    """Add ``drain`` and ``undrain`` to the ``gpupool`` parser's subparsers."""
    for name, handler, text in (
        ("drain", _drain, "stop placing on a node or GPU; its jobs are requeued, servers keep running"),
        ("undrain", _undrain, "place on a drained node or GPU again"),
    ):
        sub = commands.add_parser(name, help=f"{text} (admins)", description=f"{text[0].upper()}{text[1:]}.")
        sub.add_argument("device", metavar="NODE[/GPU]", help="a node, or one GPU on it: dgx-h100-01/3")
        connection_options(sub, whose="of an admin")
        sub.set_defaults(handler=handler)


def parse_device(text: str) -> dict[str, Any]:
    """``node`` or ``node/gpu`` as the request body; GpupoolError (status 0) names what is wrong."""
    node, slash, gpu = text.rpartition("/") if "/" in text else (text, "", "")
    if not node or (slash and not gpu.isdigit()):
        raise GpupoolError(
            0, "invalid_request", f"NODE[/GPU]: expected e.g. dgx-h100-01 or dgx-h100-01/3, got {text!r}"
        )
    return {"node": node, "gpu_index": int(gpu)} if slash else {"node": node}


def _drain(args: argparse.Namespace) -> int:
    body = parse_device(args.device)
    connection = connect(args)
    out = connection.call("POST", "admin/drain", json=body)
    jobs = ", ".join(_job(connection, job_id) for job_id in out["stopped_jobs"]) or "none"
    print(f"{args.device}\t{out['health']}\tjobs requeued: {jobs}")
    if out["servers"]:
        print(
            f"servers still running there: {', '.join(_server(connection, lease) for lease in out['servers'])}"
        )
    return 0


def _job(connection: Connection, job_id: str) -> str:
    """``J7q2 (alice's train)``: who a requeued job is, not only its id."""
    try:
        job = connection.call("GET", f"jobs/{job_id}")
    except GpupoolError:
        return job_id
    return f"{job_id} ({job['user']}'s {job['name']})"


def _server(connection: Connection, lease_id: str) -> str:
    """``alice's server`` (a named one: ``alice's server gpu``), with its lease for the record."""
    try:
        lease = connection.call("GET", f"leases/{lease_id}")
    except GpupoolError:
        return f"lease {lease_id}"
    name = f" {lease['owner_name']}" if lease.get("owner_name") else ""
    return f"{lease['user']}'s server{name} (lease {lease_id})"


def _undrain(args: argparse.Namespace) -> int:
    out = connect(args).call("POST", "admin/undrain", json=parse_device(args.device))
    print(f"{args.device}\t{out['health']}")
    return 0
