"""What gpupool adds to start-up: import time of the hub's spawner, the service and the notebook widgets.

    .venv/bin/python benchmarks/import_time.py [--runs 7] [--out benchmarks/results/import.md]

Each module is imported in a fresh interpreter with ``-X importtime`` (``--runs`` times; the median is kept),
alone, and the hub's spawner also on top of ``jupyterhub.spawner``, which the hub imports anyway: the
difference is what gpupool costs the hub at start-up. The notebook server (``jupyterhub-singleuser``)
imports nothing of gpupool; a notebook pays for ``gpupool.widgets`` only when it imports it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)")

# (what is measured, modules imported first and not counted, the module measured)
CASES = (
    ("JupyterHub's own spawner module (the baseline the hub pays anyway)", (), "jupyterhub.spawner"),
    ("gpupool's spawner, on top of JupyterHub's", ("jupyterhub.spawner",), "gpupool.spawner.hub.spawner"),
    ("the gpupool service (FastAPI, SQLAlchemy, NumPy placement)", (), "gpupool.spawner.service.assembly"),
    ("the notebook widgets package", (), "gpupool.widgets"),
)


def cumulative_ms(before: tuple[str, ...], module: str) -> float:
    """Milliseconds ``import module`` takes in a fresh interpreter after ``before`` are imported."""
    code = "".join(f"import {m}\n" for m in before) + f"import {module}\n"
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    for line in result.stderr.splitlines():
        match = _LINE.match(line)
        if match and match.group(3) == module and not match.group(2):
            return int(match.group(1)) / 1000
    raise RuntimeError(f"no import time line for {module}:\n{result.stderr[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per module (default 7)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "import.md")
    args = parser.parse_args()
    rows = []
    for label, before, module in CASES:
        times = [cumulative_ms(before, module) for _ in range(args.runs)]
        rows.append((label, module, statistics.median(times), min(times), max(times)))
        print(f"{module}: median {rows[-1][2]:.0f} ms", flush=True)
    lines = [
        "# Import time at start-up",
        "",
        f"- Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average at the end {os.getloadavg()[0]:.2f}",
        f"- Command: `.venv/bin/python benchmarks/import_time.py --runs {args.runs}`; `-X importtime`, "
        "cumulative, median of fresh interpreters",
        "",
        "| What | module | median (ms) | min (ms) | max (ms) |",
        "|---|---|---:|---:|---:|",
        *(
            f"| {label} | `{module}` | {med:.0f} | {lo:.0f} | {hi:.0f} |"
            for label, module, med, lo, hi in rows
        ),
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
