"""Submitting jobs and admitting them with 1,000 in the queue: the job manager on a real SQLite store.

    .venv/bin/python benchmarks/jobs_bench.py [--jobs 1000] [--out benchmarks/results/jobs.md]

The pool is one node with one H100, held by a server's lease, so every job queues. Measured, in-process (the
HTTP layer adds the lease API's figures, see ``hub_bench.py``):

1. ``JobManager.submit`` for each of ``--jobs`` jobs, the queue growing from 0 to ``--jobs``;
2. an admission pass (``LeaseManager.admit``) with them all waiting and nothing free, repeated;
3. one job manager step (``JobManager.step``) over them all, repeated;
4. releasing the server's lease: the time until the first job's lease is granted (release + admission).

Run as root, jobs belong to the system account ``tests/job_user.py`` creates; nothing is started.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from builders import gpu, node  # noqa: E402
from job_user import job_user  # noqa: E402

from gpupool.spawner.pool.profiles import Profile  # noqa: E402
from gpupool.spawner.pool.requests import Request, WholeGpus  # noqa: E402
from gpupool.spawner.service.jobs.job_manager import JobManager  # noqa: E402
from gpupool.spawner.service.jobs.submission import Submission  # noqa: E402
from gpupool.spawner.service.leasing.lease_manager import LeaseManager  # noqa: E402
from gpupool.spawner.service.store.job_store import JobStore  # noqa: E402
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url  # noqa: E402

H100 = frozenset({"H100-80GB"})
ONE = Profile("h100", "One H100", 1000, 1024, WholeGpus(1, H100), max_lifetime=600)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(call: object, repeat: int) -> list[float]:
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()  # type: ignore[operator]
        seconds.append(time.perf_counter() - began)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000, help="jobs to queue (default 1000)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "jobs.md")
    args = parser.parse_args()
    user = job_user()
    with tempfile.TemporaryDirectory(prefix="gpupool-jobs-bench-") as scratch:
        store = LeaseStore(sqlite_url(f"{scratch}/gpupool.sqlite"))
        leases = LeaseManager([node("dgx", [gpu("dgx", 0)])], store)
        jobs = JobManager(leases, JobStore(store.engine), [ONE], max_queued=args.jobs)
        server = leases.request_lease(
            "someone", [], "server", "", "h100", Request(1000, 1024, WholeGpus(1, H100))
        )
        submit_seconds = []
        for i in range(args.jobs):
            ask = Submission(profile="h100", command=["true"], name=f"job-{i}", submission_id=f"s{i}")
            began = time.perf_counter()
            jobs.submit(user, [], ask)
            submit_seconds.append(time.perf_counter() - began)
        admit = timed(leases.admit, 20)
        step = timed(jobs.step, 20)
        began = time.perf_counter()
        leases.release(server.id)
        first_grant = time.perf_counter() - began
        granted = [lease for lease in leases.all_leases(active_only=True) if lease.state.value == "granted"]
        assert len(granted) == 1, "releasing the H100 should admit exactly one job"
        store.close()
    ms = 1000.0
    lines = [
        f"# Jobs: submit and admission with {args.jobs} queued",
        "",
        f"- Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average at the end {os.getloadavg()[0]:.2f}",
        f"- Command: `.venv/bin/python benchmarks/jobs_bench.py --jobs {args.jobs}`; in-process, SQLite (WAL)",
        "",
        "| What | p50 (ms) | p99 (ms) | max (ms) |",
        "|---|---:|---:|---:|",
        f"| submit, queue growing 0 → {args.jobs} | {quantile(submit_seconds, 0.5) * ms:.2f} "
        f"| {quantile(submit_seconds, 0.99) * ms:.2f} | {max(submit_seconds) * ms:.2f} |",
        f"| admission pass, {args.jobs} waiting, nothing free (20 runs) | {quantile(admit, 0.5) * ms:.2f} "
        f"| {quantile(admit, 0.99) * ms:.2f} | {max(admit) * ms:.2f} |",
        f"| job manager step over {args.jobs} queued jobs (20 runs) | {quantile(step, 0.5) * ms:.2f} "
        f"| {quantile(step, 0.99) * ms:.2f} | {max(step) * ms:.2f} |",
        f"| release the H100 → first job granted | {first_grant * ms:.2f} | | |",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"median submit {statistics.median(submit_seconds) * ms:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
