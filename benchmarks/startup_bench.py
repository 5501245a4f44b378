"""Start-up: ``gpupool up`` against plain JupyterHub, side by side in one run.

    .venv/bin/python benchmarks/startup_bench.py [--rounds 5] [--warmup 1] [--out benchmarks/results/startup.md]

Each round starts, one after the other in an order that alternates from round to round:

- ``jupyterhub``: plain JupyterHub (``python -m jupyterhub``, the installed version) with a minimal
  configuration: its default spawner, the dummy authenticator, configurable-http-proxy from ``.node/``,
  everything on 127.0.0.1 on free ports, its database and secrets in a fresh temporary folder;
- ``gpupool up``: the ``gpupool`` command as ``make run`` runs it (the demo pool, its proxy, the gpupool service,
  jupyterhub-idle-culler), on free ports, with a fresh state folder.

What is timed is the user's wait: from just before the process starts until ``GET /hub/login`` through the
proxy first answers 200 (polled every 20 ms). The hub's own log then gives, on the same clock, when it began
its work (imported and configured), when its API listened and when it said "JupyterHub is now running" (after
every managed service answered). Each start is
stopped only after that line, with SIGTERM to the hub, then SIGKILL to every process group it made (the hub
starts its proxy and services in sessions of their own), and the run checks that none of them is left.
``--warmup`` untimed rounds come first, so both sides start from warm disk caches.

Results go to stdout and, as a markdown table, to ``--out`` (default ``benchmarks/results/startup.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import itertools
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHP = ROOT / ".node" / "node_modules" / ".bin" / "configurable-http-proxy"
GPUPOOL = Path(sys.executable).parent / "gpupool"
KINDS = ("jupyterhub", "gpupool up")
POLL = 0.02
# JupyterHub's log lines: "[I 2026-12-03 13:49:35.123 JupyterHub app:3950] JupyterHub is now running at ..."
_STAMP = re.compile(r"^\[\w (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) JupyterHub [^\]]*\] (.*)$")
MILESTONES = {
    "first log line": "Running JupyterHub version",  # imported, configured: the hub starts its work
    "hub API listening": "Hub API listening on",
    "now running": "JupyterHub is now running",
}


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_family() -> int:
    """A port free together with the ``+1`` (proxy API), ``+81`` (hub) and ``+2101`` (service) that
    ``gpupool up`` derives; the plain hub uses the same three."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port + 2101 < 65536 and all(_free(port + d) for d in (0, 1, 81, 2101)):
            return port
    raise RuntimeError("no free port with free +1, +81 and +2101 neighbours")


def plain_config(folder: Path, port: int) -> Path:
    """A minimal JupyterHub configuration on ``port``, its state in ``folder``."""
    lines = [
        "c = get_config()  # noqa: F821",
        "c.JupyterHub.ip = '127.0.0.1'",
        f"c.JupyterHub.port = {port}",
        "c.JupyterHub.hub_ip = '127.0.0.1'",
        f"c.JupyterHub.hub_port = {port + 81}",
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{port + 1}'",
        f"c.ConfigurableHTTPProxy.command = [{str(CHP)!r}]",
        f"c.ConfigurableHTTPProxy.pid_file = {str(folder / 'jupyterhub-proxy.pid')!r}",
        f"c.JupyterHub.db_url = 'sqlite:///{folder / 'jupyterhub.sqlite'}'",
        f"c.JupyterHub.cookie_secret_file = {str(folder / 'jupyterhub_cookie_secret')!r}",
        f"c.JupyterHub.pid_file = {str(folder / 'jupyterhub.pid')!r}",
        "c.JupyterHub.authenticator_class = 'dummy'",
    ]
    path = folder / "jupyterhub_config.py"
    path.write_text("\n".join(lines) + "\n")
    return path


def command(kind: str, folder: Path, port: int) -> list[str]:
    if kind == "jupyterhub":
        return [sys.executable, "-m", "jupyterhub", "-f", str(plain_config(folder, port))]
    return [str(GPUPOOL), "up", "--port", str(port), "--state-dir", str(folder / "state")]


def login_answers(port: int) -> bool:
    """Whether ``GET /hub/login`` through the proxy answers 200 now."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/hub/login")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from the field after the name (state, ppid, pgrp, session, …), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def descendants(root: int) -> dict[int, str]:
    """``root`` and every process below it, each with its start time (to tell a reused pid apart)."""
    children: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    for pid in _pids():
        fields = _stat(pid)
        if fields:
            children.setdefault(int(fields[1]), []).append(pid)
            started[pid] = fields[19]
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in started and pid not in found:
            found[pid] = started[pid]
            todo.extend(children.get(pid, ()))
    return found


def cpu_seconds(pids: Iterable[int]) -> float:
    """User and system CPU time of ``pids`` so far, with their reaped children's (``/proc``, clock ticks)."""
    ticks = 0
    for pid in pids:
        fields = _stat(pid)
        if fields:
            ticks += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def alive(processes: dict[int, str]) -> list[int]:
    """Those of ``processes`` still running (zombies count as gone)."""
    left = []
    for pid, start in processes.items():
        fields = _stat(pid)
        if fields and fields[19] == start and fields[0] != "Z":
            left.append(pid)
    return left


@dataclass
class Start:
    kind: str
    seconds: float  # process start → first 200 on /hub/login
    cpu: float  # CPU seconds its processes had used by then (less sensitive to other work on the machine)
    milestones: dict[str, float] = field(default_factory=dict)  # from the hub's log, same origin
    processes: int = 0  # how many it started, itself included
    left: int = 0  # how many were still running after the stop


def milestones(log: str, origin: float) -> dict[str, float]:
    """Seconds after ``origin`` (a wall-clock time) at which the hub logged each of :data:`MILESTONES`."""
    found: dict[str, float] = {}
    for line in log.splitlines():
        match = _STAMP.match(line)
        if not match:
            continue
        for name, text in MILESTONES.items():
            if name not in found and match.group(2).startswith(text):
                stamp = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
                found[name] = stamp - origin
    return found


def start_once(kind: str, timeout: float = 120, keep_log: Path | None = None) -> Start:
    """Start ``kind`` in a fresh folder, time it, then stop it and everything it started; ``keep_log``: where
    to copy its log (the hub's, the proxy's and the services')."""
    with tempfile.TemporaryDirectory(prefix="gpupool-startup-") as tmp:
        folder = Path(tmp)
        port = free_port_family()
        argv = command(kind, folder, port)
        log_path = folder / "out.log"
        with log_path.open("wb") as out:
            origin_wall = time.time()
            origin = time.monotonic()
            process = subprocess.Popen(
                argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        # what it starts, looked up as it goes: a hub that exits early leaves orphans no tree leads to
        processes: dict[int, str] = {}
        try:
            seconds, cpu = None, 0.0
            deadline = origin + timeout
            for polls in itertools.count():
                if time.monotonic() > deadline or process.poll() is not None:
                    break
                if login_answers(port):
                    seconds = time.monotonic() - origin
                    processes |= descendants(process.pid)
                    cpu = cpu_seconds(processes)
                    break
                if polls % 10 == 9:
                    processes |= descendants(process.pid)
                time.sleep(POLL)
            # stop only once the hub has started everything, so that nothing it starts escapes the count
            while time.monotonic() < deadline and process.poll() is None:
                processes |= descendants(process.pid)
                if MILESTONES["now running"] in log_path.read_text(errors="replace"):
                    break
                time.sleep(0.1)
            processes |= descendants(process.pid)
            log = log_path.read_text(errors="replace")
            if seconds is None or process.poll() is not None:
                raise RuntimeError(f"{kind} did not answer /hub/login within {timeout:g}s:\n{log[-4000:]}")
        finally:
            processes |= descendants(process.pid)
            left = stop(process, processes)
            if keep_log is not None:
                keep_log.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log_path, keep_log)
        assert seconds is not None
        return Start(kind, seconds, cpu, milestones(log, origin_wall), len(processes), len(left))


def stop(process: subprocess.Popen[bytes], processes: dict[int, str]) -> list[int]:
    """SIGTERM to the hub (it stops its proxy and services), then SIGKILL to every group it made; what is
    left running afterwards."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
    groups = {process.pid}
    for pid in alive(processes):
        fields = _stat(pid)
        if fields:
            groups.add(int(fields[2]))
    for group in groups:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    deadline = time.monotonic() + 5
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(processes)


def summary(times: list[float]) -> tuple[float, float, float]:
    return min(times), statistics.median(times), max(times)


def report(starts: list[Start], args: argparse.Namespace, load: tuple[float, float], total: float) -> str:
    by_kind = {kind: [s for s in starts if s.kind == kind] for kind in KINDS}
    medians = {kind: statistics.median(s.seconds for s in by_kind[kind]) for kind in KINDS}
    ratio = medians["gpupool up"] / medians["jupyterhub"]
    rows = []
    for kind in KINDS:
        lo, med, hi = summary([s.seconds for s in by_kind[kind]])
        marks = []
        for name in MILESTONES:
            values = [s.milestones[name] for s in by_kind[kind] if name in s.milestones]
            marks.append(f"{statistics.median(values):.2f}" if values else "—")
        cpu = statistics.median(s.cpu for s in by_kind[kind])
        processes = max(s.processes for s in by_kind[kind])
        cells = [
            kind,
            len(by_kind[kind]),
            f"{lo:.2f}",
            f"{med:.2f}",
            f"{hi:.2f}",
            *marks,
            f"{cpu:.2f}",
            processes,
        ]
        rows.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    rounds = []
    for index in range(args.rounds):
        pair = starts[2 * index : 2 * index + 2]
        order = " → ".join(s.kind for s in pair)
        rounds.append(f"| {index + 1} | {order} | " + " | ".join(f"{s.seconds:.2f}" for s in pair) + " |")
    left = sum(s.left for s in starts)
    command_line = (
        f".venv/bin/python benchmarks/startup_bench.py --rounds {args.rounds} --warmup {args.warmup}"
    )
    lines = [
        "# Start-up: `gpupool up` against plain JupyterHub",
        "",
        f"- Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
        f"JupyterHub {version('jupyterhub')}, configurable-http-proxy from `.node/`; load average "
        f"{load[0]:.2f} at the start, {load[1]:.2f} at the end (other work on the machine falls on both "
        "sides alike: they alternate)",
        f"- Command: `{command_line}` (total {total:.0f} s)",
        "- Plain JupyterHub: its default spawner, the dummy authenticator, a fresh folder; `gpupool up`: the "
        "demo pool, the gpupool service and jupyterhub-idle-culler, a fresh state folder. Both on 127.0.0.1, "
        "both from the project's `.venv`, where JupyterHub loads every `jupyterhub.spawners` entry point at "
        "start (gpupool's three too, and with `gpupool-kube` KubeSpawner and kubernetes_asyncio), plain or not.",
        "",
        f"## Process start → first 200 on `/hub/login` through the proxy (N={args.rounds} each, "
        f"{args.warmup} warm-up round{'s' if args.warmup != 1 else ''} first)",
        "",
        "Medians from the hub's log, on the same clock: its first line (JupyterHub imported and configured), "
        'its API listening, and "JupyterHub is now running" (after every managed service answered). CPU: '
        "user and system seconds its processes had used by the first 200, which other work on the machine "
        "changes less than it changes wall time.",
        "",
        "| start | N | min (s) | median (s) | max (s) | "
        + " | ".join(f"{name} (s)" for name in MILESTONES)
        + " | CPU by the first 200 (s) | processes |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(MILESTONES) + "---:|---:|",
        *rows,
        "",
        f"Median `gpupool up` / median JupyterHub: **{ratio:.2f}** (target, issue 15: at most 1.10). "
        f"Processes left running after the stops: {left}.",
        "",
        "| round | order | first (s) | second (s) |",
        "|---:|---|---:|---:|",
        *rounds,
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed starts of each kind (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "startup.md")
    parser.add_argument("--logs", type=Path, metavar="DIR", help="keep each start's log in DIR")
    args = parser.parse_args()
    if not CHP.exists() or not GPUPOOL.exists():
        print(f"needs {CHP} and {GPUPOOL}: run `make` first", file=sys.stderr)
        return 2
    if not shutil.which("node"):
        print("needs node on PATH for configurable-http-proxy", file=sys.stderr)
        return 2
    began = time.monotonic()
    load_start = os.getloadavg()[0]
    starts: list[Start] = []
    for index in range(args.warmup + args.rounds):
        order = KINDS if index % 2 == 0 else KINDS[::-1]
        for kind in order:
            name = f"{index + 1:02d}-{kind.replace(' ', '-')}.log"
            start = start_once(kind, keep_log=args.logs / name if args.logs else None)
            timed = index >= args.warmup
            if timed:
                starts.append(start)
            marks = " ".join(f"{k} {v:.2f}" for k, v in start.milestones.items())
            print(
                f"{'round ' + str(index - args.warmup + 1) if timed else 'warm-up'}: {kind:<10} "
                f"{start.seconds:.2f} s ({marks}; {start.processes} processes, {start.left} left)",
                flush=True,
            )
            if start.left:
                print(f"{kind} left {start.left} processes running", file=sys.stderr)
                return 1
    text = report(starts, args, (load_start, os.getloadavg()[0]), time.monotonic() - began)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
