"""``gpupool submit | jobs | logs | cancel``: training jobs from a terminal, as the user the token belongs to.

In a notebook server's terminal the service and the token come from the environment, as for ``submit()``
(``GPUPOOL_SERVICE_URL``, ``JUPYTERHUB_API_TOKEN``); elsewhere pass ``--url`` and ``--token`` (or set those),
or run where ``gpupool up`` keeps its state (``--state-dir``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import time
from typing import Any

from ._api import (
    EXAMPLE_URL,
    MAX_RETRIES,
    NO_EXPECTED_START,
    UP_STATE,
    Connection,
    GpupoolError,
    printable,
    time_and_span,
    time_of_day,
)
from .jobs import Job, submit


def add_job_commands(commands: Any) -> None:
    """Add the job subcommands to the ``gpupool`` parser's subparsers."""
    sub = commands.add_parser(
        "submit",
        help="submit a training job: gpupool submit --profile h100 -- python train.py",
        description="Run CMD ARGS… on a profile's devices, as you; prints the job's id, name and state, "
        "tab-separated (`gpupool submit … | cut -f1` for the id alone).",
    )
    connection_options(sub)
    sub.add_argument("--profile", required=True, help="the profile's slug (see the spawn form)")
    sub.add_argument("--name", help="a name for the job (default: the program's)")
    sub.add_argument("--max-runtime", help="e.g. 2h, 30m, 1d or seconds (default: the profile's limit)")
    sub.add_argument(
        "--retries",
        type=_retries,
        default=2,
        help=f"requeues allowed after a fault, 0–{MAX_RETRIES} (default 2)",
    )
    sub.add_argument("--workdir", help="an absolute folder inside your home (default: your home)")
    sub.add_argument("--submission-id", help="your id for this submission: repeating it never runs it twice")
    sub.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the command to run")
    sub.set_defaults(handler=_submit)

    listing = commands.add_parser(
        "jobs", help="your newest jobs and their state (an admin's token: everyone's)"
    )
    listing.add_argument("--user", help="only this user's jobs (an admin's or the hub's token)")
    listing.add_argument("--limit", type=int, default=200, help="the newest this many (default 200)")
    connection_options(listing)
    listing.set_defaults(handler=_jobs)

    logs = commands.add_parser("logs", help="a job's log; -f follows it until the job ends")
    connection_options(logs)
    logs.add_argument("job_id", metavar="ID")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.set_defaults(handler=_logs)

    cancel = commands.add_parser("cancel", help="stop a job and free its devices")
    connection_options(cancel)
    cancel.add_argument("job_id", metavar="ID")
    cancel.set_defaults(handler=_cancel)


def run(handler: Any, args: argparse.Namespace) -> int:
    """Run a job command; a refusal of the service is one line on stderr and exit status 1."""
    try:
        result: int = handler(args)
        return result
    except GpupoolError as error:
        print(f"gpupool: {error}", file=sys.stderr)
        return 1


def connection_options(parser: argparse.ArgumentParser, whose: str = "of yours") -> None:
    """``--url``, ``--token`` and ``--state-dir``, for a command that calls the service (the first two default
    to the environment, then to the service and token of the ``gpupool up`` that keeps its state there)."""
    parser.add_argument("--url", help=f"the service, e.g. {EXAMPLE_URL} (default: $GPUPOOL_SERVICE_URL)")
    parser.add_argument(
        "--token",
        help=f"a JupyterHub API token {whose} (default: $JUPYTERHUB_API_TOKEN, which, unlike a command "
        "line, other accounts cannot read in ps)",
    )
    parser.add_argument(
        "--state-dir",
        default=UP_STATE,
        metavar="DIR",
        help=f"else the service of the gpupool up whose state folder this is (default {UP_STATE})",
    )


def connect(args: argparse.Namespace) -> Connection:
    """The service the command's ``--url``, ``--token`` and ``--state-dir`` name."""
    return Connection(args.url, args.token, state_dir=args.state_dir)


def _option(field: re.Match[str]) -> str:
    return {"working_dir": "--workdir"}.get(field.group(1), "--" + field.group(1).replace("_", "-"))


def _retries(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_RETRIES:
        raise argparse.ArgumentTypeError(f"a whole number from 0 to {MAX_RETRIES}, got {text}")
    return int(text)


def _submit(args: argparse.Namespace) -> int:
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        raise GpupoolError(400, "invalid_request", "command: give it after --, e.g. -- python train.py")
    try:
        job = submit(
            command,
            args.profile,
            name=args.name,
            working_dir=args.workdir,
            max_runtime=args.max_runtime,
            retries=args.retries,
            submission_id=args.submission_id,
            connection=connect(args),
        )
    except GpupoolError as error:  # the API's field names, as the options this command took them from
        detail = re.sub(r"^(working_dir|max_runtime|submission_id)\b", _option, error.detail)
        raise GpupoolError(error.status, error.error, detail) from None
    model = job.model()
    print(f"{job.id}\t{model['name']}\t{where_it_stands(model) or model['state']}")
    return 0


def where_it_stands(model: dict[str, Any], now: float | None = None) -> str:
    """Where a job stands before its command runs: ``#2 in the queue, expected to start by 14:05 UTC (in about
    12 min)`` while it waits (as JobPanel says it: a time of day alone cannot tell today's from tomorrow's),
    ``not started: its pod is not scheduled: …`` while a cluster holds it up ('' once it runs)."""
    held_up = model.get("held_up")
    if model.get("position") is None:
        return f"not started: {held_up}" if held_up else ""
    start = model.get("expected_start")
    at = time.time() if now is None else now
    by = f", expected to start by {time_and_span(float(start), at, time_of_day)}" if start else ""
    if start is None and not held_up:  # as the lease says it: a drained or failed device has no end time
        by = f", {NO_EXPECTED_START}"
    return f"#{model['position'] + 1} in the queue{by}" + (f"; {held_up}" if held_up else "")


def _jobs(args: argparse.Namespace) -> int:
    asked = {"limit": args.limit} | ({"user": args.user} if args.user else {})
    models = connect(args).call("GET", "jobs", params=asked)
    print("ID\tUSER\tNAME\tPROFILE\tSTATE\tSUBMITTED\tWHY")  # USER: an admin's list has everyone's
    for model in models:
        submitted = dt.datetime.fromtimestamp(model["submitted_at"]).strftime("%Y-%m-%d %H:%M")
        state = model["state"] + (f" ({place})" if (place := where_it_stands(model)) else "")
        who = f"{model['id']}\t{model['user']}\t{printable(model['name'])}\t{model['profile']}"
        print(
            f"{who}\t{state}\t{submitted}\t{printable(model['reason'])}"
        )  # a user's words, to your terminal
    return 0


def _logs(args: argparse.Namespace) -> int:
    job = Job(args.job_id, connect(args))
    if args.follow:
        if waiting := where_it_stands(job.model()):  # nothing to show until it starts: say so, not silence
            print(f"[gpupool: job {job.id} is {waiting}; its log follows once it starts]", file=sys.stderr)
        state = job.follow()
        print(f"[gpupool: job {job.id} {state}]", file=sys.stderr)
    else:
        text = job.logs()
        sys.stdout.write(text)
        model = job.model() if not text else {}
        if model.get("state") == "timed-out" and model.get("log_path") is None:  # a pod's log, not a file's
            print(f"[gpupool: no log kept for job {job.id}: {_NO_POD_LOG}]", file=sys.stderr)
    return 0


# A Kubernetes trial's timed-out job printed nothing at all, as if it had written nothing.
_NO_POD_LOG = "on Kubernetes a run ended at its maximum runtime takes its log with its pod (README)"


def _cancel(args: argparse.Namespace) -> int:
    job = Job(args.job_id, connect(args))
    # a trial read "… succeeded" after cancelling a finished job, as if the cancel had done it
    if job.finished:
        print(f"{args.job_id} had already ended ({job.status}): nothing to cancel")
        return 0
    print(f"{args.job_id}\t{job.cancel()}")
    return 0
