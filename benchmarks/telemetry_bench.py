"""CPU cost of telemetry sampling: 8 GPUs with 7 MIG slices each, every 2 s.

    .venv/bin/python benchmarks/telemetry_bench.py [--samples 300] [--interval 2]

What is timed (CPU time of this process, ``time.process_time``, per pass over all 64 devices):

- ``NvmlSampler`` on the fake pynvml (``tests/fake_pynvml.py``): eight H100 80GB GPUs, each split into seven
  1g.10gb instances, GPM supported, so every pass reads 8 GPUs and 56 GPM instance pairs. This is the
  sampler's own cost; the real driver's ioctls come on top (the NVML calls per pass are counted, so a
  per-call driver cost measured on hardware can be added).
- ``SimulatedSampler`` on the matching simulated pool, each slice held by a real (sleeping) process whose
  CPU time is read from ``/proc``: once with the lease's pids given, once finding them by
  ``CUDA_VISIBLE_DEVICES`` (a scan of every process's environment each pass, the default).
- The service's bookkeeping per pass (``Telemetry.record``: ring buffers, minute aggregates, who holds what)
  on a LeaseManager over the same pool with every slice leased; and, per scrape, the Prometheus text.

"% of a core" is CPU seconds per pass divided by the interval. Target (issue 5): under 1% of one core.
Results go to stdout and to ``--out`` (default ``benchmarks/results/telemetry.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the fake pynvml lives with the tests
from fake_pynvml import fake_pynvml, h100_80gb, state_of  # noqa: E402

from gpupool.spawner.backends.nvml_telemetry import NvmlSampler  # noqa: E402
from gpupool.spawner.backends.simulated import parse_pool  # noqa: E402
from gpupool.spawner.backends.simulated_telemetry import SimulatedSampler  # noqa: E402
from gpupool.spawner.pool.devices import Node  # noqa: E402
from gpupool.spawner.pool.requests import MigSlice, Request  # noqa: E402
from gpupool.spawner.service.api.telemetry_routes import render_metrics  # noqa: E402
from gpupool.spawner.service.leasing.lease_manager import LeaseManager  # noqa: E402
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url  # noqa: E402
from gpupool.spawner.service.telemetry.telemetry_loop import Telemetry  # noqa: E402
from gpupool.spawner.telemetry import Snapshot  # noqa: E402

GPUS, SLICES = 8, 7


def cpu_per_call(call: Callable[[float], object], samples: int, interval: float) -> list[float]:
    """CPU seconds of each of ``samples`` calls, the clock advancing ``interval`` between them."""
    costs: list[float] = []
    at = time.time()
    for _ in range(samples):
        at += interval
        began = time.process_time()
        call(at)
        costs.append(time.process_time() - began)
    return costs


def pool() -> tuple[Node, ...]:
    mig = {i: [f"1g.10gb@{s}" for s in range(SLICES)] for i in range(GPUS)}
    data = {"nodes": [{"name": "dgx-h100-01", "cpu": 224, "memory": "2048GiB",
                       "gpus": {"product": "H100-80GB", "count": GPUS, "nvlink": True}, "mig": mig}]}  # fmt: skip
    return parse_pool(data, "telemetry-bench")


@contextlib.contextmanager
def holders(nodes: tuple[Node, ...]) -> Iterator[dict[str, set[int]]]:
    """One sleeping process per MIG slice, pinned to it by CUDA_VISIBLE_DEVICES, killed afterwards."""
    started: list[subprocess.Popen[bytes]] = []
    pids: dict[str, set[int]] = {}
    try:
        for instance in (i for n in nodes for g in n.gpus for i in g.mig_instances):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=instance.uuid)
            process = subprocess.Popen(["sleep", "3600"], env=env, start_new_session=True)
            started.append(process)
            pids[instance.uuid] = {process.pid}
        time.sleep(0.5)  # every exec done, so the environment scan sees them
        yield pids
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait()


def row(
    label: str, costs: list[float], interval: float, note: str = ""
) -> tuple[str, float, float, float, str]:
    median = statistics.median(costs)
    p90 = sorted(costs)[int(0.9 * (len(costs) - 1))]
    return label, median * 1e3, p90 * 1e3, 100 * median / interval, note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300, help="timed passes per sampler (default 300)")
    parser.add_argument(
        "--interval", type=float, default=2.0, help="sampling interval in seconds (default 2)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "telemetry.md")
    args = parser.parse_args(argv)
    began = time.monotonic()
    rows = []

    module = fake_pynvml([h100_80gb([f"1g.10gb@{s}" for s in range(SLICES)]) for _ in range(GPUS)])
    with NvmlSampler("dgx-h100-01", nvml=module) as sampler:
        sampler.sample(time.time())  # primes GPM
        calls_before = len(state_of(module).calls)
        costs = cpu_per_call(sampler.sample, args.samples, args.interval)
        calls = (len(state_of(module).calls) - calls_before) / args.samples
        devices = sampler.device_count
    rows.append(row("NvmlSampler, fake pynvml", costs, args.interval, f"{calls:.0f} NVML calls per pass"))

    nodes = pool()
    with holders(nodes) as pids:
        given = SimulatedSampler(nodes, lambda: pids)
        given.sample(time.time())
        rows.append(row("SimulatedSampler, pids given", cpu_per_call(given.sample, args.samples, args.interval),
                        args.interval, f"{len(pids)} processes read from /proc"))  # fmt: skip
        scanning = SimulatedSampler(nodes)
        scanning.sample(time.time())
        processes = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())
        rows.append(row("SimulatedSampler, pids by CUDA_VISIBLE_DEVICES",
                        cpu_per_call(scanning.sample, args.samples, args.interval), args.interval,
                        f"scans all {processes} processes' environments each pass"))  # fmt: skip

        with tempfile.TemporaryDirectory() as tmp:
            manager = LeaseManager(nodes, LeaseStore(sqlite_url(f"{tmp}/leases.sqlite")))
            for n in range(len(pids)):
                manager.request_lease(
                    f"user{n}", [], "server", "", "mig-1g", Request(1000, 4096, MigSlice("1g.10gb"))
                )
            telemetry = Telemetry(manager, given, interval=args.interval)
            snapshots: list[Snapshot] = [
                given.sample(time.time() + i * args.interval) for i in range(args.samples)
            ]
            feed = iter(snapshots)
            rows.append(row("Telemetry.record (service bookkeeping)",
                            cpu_per_call(lambda _at: telemetry.record(next(feed)), args.samples, args.interval),
                            args.interval, "history, minute aggregates, holders from the lease manager"))  # fmt: skip
            scrape = cpu_per_call(lambda _at: render_metrics(manager, telemetry), 50, args.interval)
            scrape_ms = statistics.median(scrape) * 1e3
            manager.store.close()

    lines = [
        "# Telemetry sampling overhead",
        "",
        f"- Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; {os.cpu_count()} CPUs, "
        f"{platform.machine()}, Python {platform.python_version()}, load average at the end "
        f"{os.getloadavg()[0]:.2f}",
        f"- Command: `.venv/bin/python benchmarks/telemetry_bench.py --samples {args.samples} --interval "
        f"{args.interval:g}` ({time.monotonic() - began:.0f} s)",
        f"- Pool: {GPUS} H100 80GB GPUs x {SLICES} 1g.10gb MIG slices = {devices} devices per pass; CPU time of "
        "the sampling process (`time.process_time`), median and p90 over the passes.",
        "",
        f"| What | CPU per pass, median (ms) | p90 (ms) | % of one core at {args.interval:g} s | note |",
        "|---|---:|---:|---:|---|",
        *(
            f"| {label} | {med:.2f} | {p90:.2f} | {pct:.3f}% | {note} |"
            for label, med, p90, pct, note in rows
        ),
        "",
        f"Per service, sampler plus bookkeeping: NVML {rows[0][3] + rows[3][3]:.3f}% of a core; simulated "
        f"{rows[2][3] + rows[3][3]:.3f}% (finding the pids by environment, as the service does by default), "
        f"{rows[1][3] + rows[3][3]:.3f}% with the pids given. Target: under 1% of one core.",
        "",
        f"A Prometheus scrape (`render_metrics`, all {devices} devices, {len(pids)} leases) costs "
        f"{scrape_ms:.2f} ms CPU; at a 15 s scrape interval that is {scrape_ms / 150:.3f}% of a core.",
        "",
        "The fake pynvml answers in Python; real NVML adds the driver's time per call (ioctls), which this "
        "machine (no GPU) cannot measure: multiply the calls per pass by that cost and add it.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
