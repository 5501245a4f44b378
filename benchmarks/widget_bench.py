"""CPU that ``GpuMonitor`` and ``JobPanel`` cost the notebook's process while they refresh in the background.

    .venv/bin/python benchmarks/widget_bench.py [--seconds 60] [--out benchmarks/results/widgets.md]

A real JupyterHub with the gpupool service on the simulated demo pool (telemetry every 2 s); a user holds an
``h100`` lease. In this process, as a kernel would, each widget is made with the user's token and left to
refresh (``GpuMonitor`` every 1.5 s, ``JobPanel`` every 2 s) for ``--seconds``; the process's CPU time over
that window, divided by the window, is the widget's cost in % of one core. A kernel also sends each changed
value to the browser as a comm message; with no browser attached here that part is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hub_harness import SERVICE, RunningHub, free_ports, write_hub_config  # noqa: E402

from gpupool.spawner.backends.simulated import DEMO_POOL  # noqa: E402
from gpupool.spawner.names import SERVICE_PREFIX  # noqa: E402
from gpupool.widgets import Connection, GpuMonitor, JobPanel  # noqa: E402

ADMIN_TOKEN = "bench-admin-token-widgets-0123456789abcdef"
ADMIN_SCOPES = ("admin:users", "tokens", "custom:gpupool:admin", f"access:services!service={SERVICE}")
USER = "wanda"


def cpu_share(make: object, seconds: float) -> tuple[float, int]:
    """% of one core this process used while the widget ``make()`` returns refreshed for ``seconds``, on an
    event loop of its own as a kernel's (the widgets refresh as tasks on the running loop)."""

    async def measure() -> tuple[float, int]:
        widget = make()  # type: ignore[operator]
        await asyncio.sleep(3)  # first fills and caches settle before the window opens
        began_cpu, began = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        used = time.process_time() - began_cpu
        widget.close()
        return 100 * used / (time.monotonic() - began), int(seconds)

    return asyncio.run(measure())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window per widget (default 60)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "widgets.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-widget-bench-") as scratch:
        tmp, ports = Path(scratch), free_ports()
        service_env = {"GPUPOOL_POOL": str(DEMO_POOL), "GPUPOOL_DB_URL": f"sqlite:///{tmp}/gpupool.sqlite"}
        write_hub_config(
            tmp,
            ports,
            admin_token=ADMIN_TOKEN,
            admin_scopes=ADMIN_SCOPES,
            pool_file=DEMO_POOL,
            service_env=service_env,
            hub_client_token="bench-hub-client-token-widgets-0123456789",
        )
        with RunningHub(tmp, ports, ADMIN_TOKEN, service_env=service_env, fail=sys.exit) as hub:
            hub.create_user(USER)
            token = hub.token_for(USER)
            connection = Connection(f"{hub.url}{SERVICE_PREFIX}", token)
            lease = connection.call(
                "POST", "leases", json={"profile": "h100", "owner_kind": "server", "owner_name": ""}
            )
            rows = [
                (
                    "GpuMonitor, refresh 1.5 s",
                    *cpu_share(
                        lambda: GpuMonitor(connection, refresh=1.5, lease_id=lease["id"]), args.seconds
                    ),
                ),
                (
                    "JobPanel, refresh 2 s",
                    *cpu_share(lambda: JobPanel(connection, refresh=2.0), args.seconds),
                ),
            ]
            connection.close()
    lines = [
        "# Notebook widgets: CPU in the notebook's process",
        "",
        f"- Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average at the end {os.getloadavg()[0]:.2f}",
        f"- Command: `.venv/bin/python benchmarks/widget_bench.py --seconds {args.seconds:g}`",
        "- Real hub and service on the simulated demo pool; comm messages to a browser not included.",
        "",
        "| Widget | window (s) | CPU, % of one core |",
        "|---|---:|---:|",
        *(f"| {name} | {window} | {share:.2f}% |" for name, share, window in rows),
        "",
        "Target (issue 5): under 1% of one core.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
