"""``gpupool drain | undrain | fault | repair NODE[/GPU]``: take a node or one GPU out of the pool, and put it
back (admins); ``gpupool simulate-xid NODE/GPU XID``: on a simulated pool, the failure the telemetry finds.

Drained: nothing new is placed there, jobs running there are stopped and requeued, servers keep running.
Marked unhealthy (``fault``) does the same, for a device that failed, until ``repair``; the mark survives a
restart. Each says whose jobs and servers were there, not only their ids.
The token must carry ``custom:gpupool:admin``; pass ``--url`` and ``--token`` or set ``GPUPOOL_SERVICE_URL``
and ``JUPYTERHUB_API_TOKEN``, as for the job commands.
"""

from __future__ import annotations

import argparse
from typing import Any

from ._api import Connection, GpupoolError, printable
from .jobs_cli import connect, connection_options, run

__all__ = ["add_admin_commands", "parse_device", "run"]


def add_admin_commands(commands: Any) -> None:
    """Add ``drain``, ``undrain``, ``fault`` and ``repair`` to the ``gpupool`` parser's subparsers."""
    for name, path, handler, text in (
        (
            "drain",
            "drain",
            _mark,
            "stop placing on a node or GPU; its jobs are requeued, servers keep running",
        ),
        ("undrain", "undrain", _lift, "place on a drained node or GPU again"),
        (
            "fault",
            "faults",
            _mark,
            "mark a failed node or GPU unhealthy, as drain does, until it is repaired",
        ),
        ("repair", "repair", _lift, "lift the unhealthy mark of a repaired node or GPU"),
    ):
        sub = commands.add_parser(name, help=f"{text} (admins)", description=f"{text[0].upper()}{text[1:]}.")
        sub.add_argument("device", metavar="NODE[/GPU]", help="a node, or one GPU on it: dgx-h100-01/3")
        connection_options(sub, whose="of an admin")
        sub.set_defaults(handler=handler, route=f"admin/{path}")
    xid = commands.add_parser(
        "simulate-xid",
        help="on a simulated pool, have the next sample report an XID on a GPU (admins)",
        description="On a simulated pool, have the next telemetry sample report an XID on a GPU, as NVML would: "
        "a critical one (79: fell off the bus, 48: double-bit ECC error, …) takes it out of the pool as a real "
        "failure does, until `gpupool repair`.",
    )
    xid.add_argument("device", metavar="NODE/GPU", help="one GPU: dgx-h100-01/3")
    xid.add_argument("xid", type=int, metavar="XID", help="the XID, e.g. 79")
    connection_options(xid, whose="of an admin")
    xid.set_defaults(handler=_simulate_xid)


def parse_device(text: str) -> dict[str, Any]:
    """``node`` or ``node/gpu`` as the request body; GpupoolError (status 0) names what is wrong."""
    node, slash, gpu = text.rpartition("/") if "/" in text else (text, "", "")
    if not node or (slash and not gpu.isdigit()):
        raise GpupoolError(
            0, "invalid_request", f"NODE[/GPU]: expected e.g. dgx-h100-01 or dgx-h100-01/3, got {text!r}"
        )
    return {"node": node, "gpu_index": int(gpu)} if slash else {"node": node}


def _mark(args: argparse.Namespace) -> int:
    body = parse_device(args.device)
    connection = connect(args)
    out = connection.call("POST", args.route, json=body)
    failed = out.get("failed_jobs", [])
    requeued = ", ".join(_job(connection, job_id) for job_id in out["stopped_jobs"] if job_id not in failed)
    line = f"{args.device}\t{out['health']}\tjobs requeued: {requeued or 'none'}"
    if failed:
        ended = ", ".join(_job(connection, job_id) for job_id in failed)
        line += f"; jobs that end failed, no retries left (their checkpoints kept): {ended}"
    print(line)
    if out["servers"]:
        print(
            f"servers still running there: {', '.join(_server(connection, lease) for lease in out['servers'])}"
        )
    return 0


def _simulate_xid(args: argparse.Namespace) -> int:
    body = parse_device(args.device)
    if "gpu_index" not in body:
        raise GpupoolError(0, "invalid_request", f"NODE/GPU: an XID is a GPU's, e.g. {args.device}/0")
    out = connect(args).call("POST", "admin/simulated-xid", json=body | {"xid": args.xid})
    print(f"{args.device}\tXID {out['xid']}\t{out['effect']}")
    return 0


def _job(connection: Connection, job_id: str) -> str:
    """``J7q2 (alice's train)``: who a requeued job is, not only its id."""
    try:
        job = connection.call("GET", f"jobs/{job_id}")
    except GpupoolError:
        return job_id
    return f"{job_id} ({job['user']}'s {printable(job['name'])})"


def _server(connection: Connection, lease_id: str) -> str:
    """``alice's server`` (a named one: ``alice's server gpu``), with its lease for the record."""
    try:
        lease = connection.call("GET", f"leases/{lease_id}")
    except GpupoolError:
        return f"lease {lease_id}"
    name = f" {lease['owner_name']}" if lease.get("owner_name") else ""
    return f"{lease['user']}'s server{name} (lease {lease_id})"


def _lift(args: argparse.Namespace) -> int:
    out = connect(args).call("POST", args.route, json=parse_device(args.device))
    print(f"{args.device}\t{out['health']}")
    return 0
