"""``gpupool usage``: GPU-hours held against used, per user and profile, over a span (``GET usage``).

A user's token reads their own rows; an admin's every user's, which is how an admin answers "who held GPUs
without using them last week". Times are the API's: Unix seconds or ISO 8601 dates and times, UTC unless they
say otherwise. "Used" is time held above the idle threshold (the service's ``gpu_idle_threshold``, 10% unless
set), the one below which the admin page lists a GPU as held but idle; "unknown" is time whose utilisation
could not be read, left out of the idle share.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .jobs_cli import connect, connection_options

__all__ = ["add_usage_command", "usage_table"]

_COLUMNS = ("USER", "PROFILE", "HELD", "USED", "UNKNOWN", "IDLE")


def add_usage_command(commands: Any) -> None:
    """Add ``usage`` to the ``gpupool`` parser's subparsers."""
    sub = commands.add_parser(
        "usage",
        help="GPU-hours held and used, per user and profile (an admin's token: everyone's)",
        description="GPU-hours held and used (in GPU-equivalents) per user and profile; the last 30 days "
        "unless --since/--until say otherwise.",
    )
    connection_options(sub)
    sub.add_argument("--since", help="from this time: 2026-12-01, 2026-12-01T09:30 or Unix seconds (UTC)")
    sub.add_argument("--until", help="to this time, as --since (default: now)")
    sub.add_argument("--user", help="one user's rows (an admin's token)")
    sub.add_argument("--json", action="store_true", help="the API's rows as JSON")
    sub.set_defaults(handler=_usage)


def _usage(args: argparse.Namespace) -> int:
    params = {key: value for key in ("since", "until", "user") if (value := getattr(args, key)) is not None}
    connection = connect(args)
    rows = connection.call("GET", "usage", params=params)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    # an admin trial could not tell which span the table covered, nor that its GPU-hours were of made-up GPUs
    span = f"since {args.since}" if args.since else "the last 30 days"
    span += f" until {args.until}" if args.until else " to now"
    if connection.call("GET", "pool").get("simulated"):
        span += "; a simulated pool: these GPUs are not real"
    print(usage_table(rows))
    print(f"({span}; minutes are counted whole)")
    return 0


def usage_table(rows: list[dict[str, Any]]) -> str:
    """The rows, most held first, and their total, as tab-separated columns (GPU-hours to two places)."""
    if not rows:
        return "no GPU-hours held in this span"
    ordered = sorted(rows, key=lambda row: (-row["gpu_hours_held"], row["user"], row["profile"]))
    held, used, unknown = (
        sum(row[key] for row in rows) for key in ("gpu_hours_held", "gpu_hours_used", "gpu_hours_unknown")
    )
    total = {"user": "total", "profile": "", "gpu_hours_held": held, "gpu_hours_used": used}
    total |= {"gpu_hours_unknown": unknown, "idle_share": _idle_share(held, used, unknown)}
    lines = ["\t".join(_COLUMNS)]
    lines += ["\t".join(_cells(row)) for row in (*ordered, total)]
    return "\n".join(lines)


def _cells(row: dict[str, Any]) -> list[str]:
    idle = row["idle_share"]
    hours = [f"{row[key]:.2f}" for key in ("gpu_hours_held", "gpu_hours_used", "gpu_hours_unknown")]
    return [row["user"], row["profile"], *hours, "n/a" if idle is None else f"{idle:.0%}"]


def _idle_share(held: float, used: float, unknown: float) -> float | None:
    """The API's idle share of a sum of rows: of the hours whose utilisation was read, those not used."""
    known = held - unknown
    return None if known <= 0 else max(0.0, known - used) / known
