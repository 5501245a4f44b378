"""``gpupool pool``: the pool as it is now when a gpupool service runs, else as this host or a pool file has it.

The live pool (who holds what, drains, faults, what is free this minute, who waits) comes from the running
service's ``GET pool`` and ``GET leases``: the one given with ``--url``/``--token`` (or
``GPUPOOL_SERVICE_URL``/``JUPYTERHUB_API_TOKEN``), or the one a ``gpupool up`` keeps in its state folder here
(``--state-dir``, default ``.gpupool``). Without one, or with ``--pool FILE``, the devices are read as the service
would read them at start, and the output says it is not the live pool.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from .names import UP_STATE


def add_pool_command(commands: Any) -> None:
    pool = commands.add_parser(
        "pool", help="show the pool and what is free: live from the running service, else its devices"
    )
    pool.add_argument("--pool", metavar="FILE", help="a pool file (simulated backend), never the live pool")
    pool.add_argument("--url", help="the gpupool service (default: $GPUPOOL_SERVICE_URL, else --state-dir's)")
    pool.add_argument(
        "--token",
        help="a JupyterHub API token (default: $JUPYTERHUB_API_TOKEN, which, unlike a command line, other "
        "accounts cannot read in ps; else --state-dir's)",
    )
    pool.add_argument(
        "--state-dir", default=UP_STATE, metavar="DIR", help=f"gpupool up's state folder (default {UP_STATE})"
    )
    pool.add_argument("--json", action="store_true", help="print JSON instead of text")
    pool.set_defaults(handler=show_pool)


def show_pool(args: argparse.Namespace) -> int:
    from .client import GpupoolError
    from .client.connection import URL_ENV, Connection
    from .inventory import render_pool
    from .pool.expected_start import time_of_day

    description, holders, waiting, not_live = None, {}, None, ""
    if args.pool is None:
        try:
            connection = Connection(args.url, args.token, state_dir=args.state_dir)
            description = connection.call("GET", "pool")
            if not args.json:  # the JSON keeps lease ids; the text says whose they are
                leases = connection.call("GET", "leases", params={"active_only": "true"})
                holders = _whose(leases)
                waiting = _waiting(leases, holders, time.time())
            heading = f"Live, from the gpupool service at {connection.base_url}"
            if lost := description.get("unreachable_since"):
                heading = (
                    f"NOT LIVE: the cluster's API server has not answered the gpupool service at "
                    f"{connection.base_url} since {time_of_day(float(lost))}; this is the pool as last seen"
                )
        except GpupoolError as error:
            if args.url or args.token:  # asked for the service: its refusal is the answer
                raise SystemExit(f"gpupool: {error}") from None
            # where it looked: a first-day trial ran it from another folder than gpupool up's; an address from
            # the environment is named by the error itself
            folder = os.path.abspath(args.state_dir)
            looked = error.status == 0 and not os.environ.get(URL_ENV)
            why = f"no running gpupool service found from {folder}/" if looked else str(error)
            not_live = f"not the live pool ({why}): the devices as the service would find them"
            print(f"gpupool: {not_live}", file=sys.stderr)
    if description is None:
        description = _devices(args.pool)
        # on stdout too: a trial took the demo pool for its cluster's
        heading = not_live[:1].upper() + not_live[1:]
    if args.json:
        print(json.dumps(description, indent=2))
    else:
        print("\n".join(filter(None, [heading, render_pool(description, holders), waiting])))
    return 0


def _devices(pool_file: str | None) -> dict[str, Any]:
    from .backends.discovery import discover_pool
    from .inventory import describe_pool
    from .pool.state import PoolState

    found = discover_pool(pool_file)
    if found.note:
        print(f"gpupool: {found.note}", file=sys.stderr)
    return describe_pool(PoolState(found.nodes), found.backend, found.source)


def _whose(leases: list[dict[str, Any]]) -> dict[str, str]:
    """Each lease the caller may read (their own; an admin's token: all) as who holds it, with its id."""
    return {
        lease["id"]: f"{lease['user']}'s "
        + ("server" if lease["owner_kind"] == "server" else f"job {lease['owner_name']}")
        + f" ({lease['id']})"
        for lease in leases
    }


def _waiting(leases: list[dict[str, Any]], whose: dict[str, str], now: float) -> str:
    """The queue, next first, as far as the caller may see it (an admin's token: everyone's): the devices above
    say who holds them, this who waits for them and until when."""
    from .pool.expected_start import in_words, time_of_day

    queued = sorted((q for q in leases if q["position"] is not None), key=lambda q: q["position"])
    if not queued:
        return "\nWaiting: none that this token may see."
    lines = ["", f"Waiting: {len(queued)} that this token may see, next first"]
    for lease in queued:
        start = lease.get("expected_start")
        lines.append(
            f"  #{lease['position'] + 1}  {whose[lease['id']]}  {lease['profile']}  since "
            f"{time_of_day(lease['created_at'])}; {in_words(start, now, time_of_day)}"
        )
    return "\n".join(lines)
