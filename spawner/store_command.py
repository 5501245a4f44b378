"""``gpupool store copy``: the service's store copied into another database, for a lab moving from SQLite to
PostgreSQL (or to another database server) without stopping its users' servers first."""

from __future__ import annotations

import argparse
import os
from typing import Any


def add_store_command(commands: Any) -> None:
    store = commands.add_parser("store", help="the gpupool service's store of leases, jobs and usage")
    store_commands = store.add_subparsers(dest="store_command", required=True)
    copy = store_commands.add_parser(
        "copy",
        help="copy every lease, job, health mark and usage minute into another, empty database (the hub and "
        "its service stopped)",
    )
    copy.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="URL",
        help="the store now, e.g. sqlite:////var/lib/gpupool/gpupool.sqlite",
    )
    copy.add_argument(
        "--to",
        dest="target",
        default=os.environ.get("GPUPOOL_DB_URL") or None,
        metavar="URL",
        help="the new, empty store, e.g. postgresql+psycopg://gpupool@127.0.0.1/gpupool (default: "
        "$GPUPOOL_DB_URL; a password is better there or in PGPASSWORD than on a command line, which ps shows)",
    )
    copy.set_defaults(handler=copy_command)


def copy_command(args: argparse.Namespace) -> int:
    from .service.store.copy import StoreCopyError, copy_store

    if not args.target:
        raise StoreCopyError("--to: name the new store's URL, or set GPUPOOL_DB_URL to it")
    copied = copy_store(args.source, args.target, say=lambda line: print(f"  {line}"))
    print(
        f"gpupool: copied {copied.in_words()} from {_shown(args.source)} to {_shown(args.target)}. "
        f"Set GPUPOOL_DB_URL to the new store (in /etc/gpupool/environment on an installed hub), then start "
        "the hub; the old store is left as it was."
    )
    return 0


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url  # here: `gpupool up` imports this module and waits for nothing

    return make_url(url).render_as_string(hide_password=True)
