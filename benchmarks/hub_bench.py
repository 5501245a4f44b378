"""Spawn-to-ready of SimpleLocalGPUSpawner against JupyterHub's plain spawner, and the lease API under load.

    .venv/bin/python benchmarks/hub_bench.py [--n 10] [--clients 50] [--lease-seconds 10]

One run starts two real JupyterHubs side by side on loopback, each with its own configurable-http-proxy (from
``.node/``) and the same configuration but for the spawner:

- ``gpu``: ``SimpleLocalGPUSpawner`` plus the gpupool service on a simulated pool big enough that nothing
  queues (two H100s, one split into two 3g.40gb slices, and plenty of CPU and memory);
- ``plain``: JupyterHub's ``SimpleLocalProcessSpawner``, which ``SimpleLocalGPUSpawner`` extends.

1. Spawn-to-ready: ``POST /hub/api/users/{u}/server`` until ``/user/{u}/api`` answers 200 through the proxy,
   then the server is stopped (not timed) and the next one starts. Three kinds, ``plain``, ``gpu`` with the
   CPU-only profile ``cpu`` and ``gpu`` with ``mig-3g``, alternate in a rotating order so they share the
   machine's noise; ``--warmup`` untimed spawns of each kind come first.
2. The lease API: ``--clients`` concurrent ``httpx.AsyncClient`` s, each looping ``POST leases`` (profile
   ``cpu``, on behalf of a user of its own) then ``DELETE leases/{id}``, for ``--lease-seconds`` or
   ``--lease-max-requests`` calls, through the proxy (as the spawner calls it) and then straight to the
   service's port. The load generator runs on the same machine as the hub, proxy and service.

Results go to stdout and, as a markdown table, to ``--out`` (default ``benchmarks/results/hub.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import os
import platform
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the hub harness the end-to-end tests use lives in tests/
from hub_harness import (  # noqa: E402
    CHP_BIN,
    GPU_SPAWNER,
    SERVICE,
    RunningHub,
    free_ports,
    log_tail,
    wait_for,
    write_hub_config,
)

ADMIN_TOKEN = "bench-admin-token-0123456789abcdef0123"
HUB_CLIENT_TOKEN = "bench-hub-client-token-0123456789abcdef"
ADMIN_SCOPES = (
    "admin:users",
    "admin:servers",
    "admin:server_state",
    "custom:gpupool:admin",
    "access:services",
)

POOL = """
nodes:
  - name: bench-01
    cpu: 1024
    memory: 4096GiB
    gpus: {product: H100-80GB, count: 2, nvlink: true}
    mig:
      1: [3g.40gb@0, 3g.40gb@4]
"""


def steady_readiness_polls(seconds: float) -> list[str]:
    """Config lines that make the hub poll a starting server every ``seconds`` (both hubs alike).

    JupyterHub polls with an exponential backoff (0.2, 0.6, 1.4, 3.0, 6.2 s … after the process starts, with
    jitter), so a server ready at 3.1 s is seen at about 6.2 s: that rounding, seconds wide, would swamp the
    milliseconds a spawner adds. Polling every 50 ms measures readiness to 50 ms instead.
    """
    return [
        "import jupyterhub.utils as _utils",
        "_backoff = _utils.exponential_backoff",
        "async def _steady(*args, **kwargs):",
        f"    kwargs.update(start_wait={seconds}, scale_factor=1, max_wait={seconds})",
        "    return await _backoff(*args, **kwargs)",
        "_utils.exponential_backoff = _steady",
    ]


class Hub(RunningHub):
    """One benchmarked hub: ``plain`` (JupyterHub's SimpleLocalProcessSpawner) or ``gpu`` (gpupool's)."""

    def __init__(self, kind: str, tmp: Path, ports: dict[str, int], poll: float = 0.05) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        super().__init__(tmp, ports, ADMIN_TOKEN, service=kind == "gpu", startup_timeout=60, stop_timeout=30)
        self.kind = kind
        common: dict[str, Any] = {"admin_token": ADMIN_TOKEN, "admin_name": "bench-admin"}
        common |= {"admin_scopes": ADMIN_SCOPES, "spawn_timeout": 60}
        if kind == "plain":
            plain = f'c.SimpleLocalProcessSpawner.home_dir_template = "{tmp}/homes/{{username}}"'
            spawner = "jupyterhub.spawner.SimpleLocalProcessSpawner"
            polls = steady_readiness_polls(poll) if poll else []
            write_hub_config(tmp, ports, spawner_class=spawner, extra_config=[plain, *polls], **common)
        else:
            (tmp / "pool.yaml").write_text(POOL)
            write_hub_config(
                tmp,
                ports,
                spawner_class=GPU_SPAWNER,
                pool_file=tmp / "pool.yaml",
                hub_client_token=HUB_CLIENT_TOKEN,
                extra_config=steady_readiness_polls(poll) if poll else [],
                **common,
            )


def _log_tail(log: Path) -> str:
    return log_tail(log, chars=100_000)


def _wait_for(check: Callable[[], bool], what: str, log: Path, timeout: float = 60) -> None:
    wait_for(check, what, log, timeout)


def _server(hub: Hub, admin: httpx.Client, user: str) -> dict[str, Any] | None:
    model = admin.get(f"{hub.hub_api}/users/{user}")
    model.raise_for_status()
    server: dict[str, Any] | None = model.json()["servers"].get("")
    if server and server.get("state", {}).get("pid"):
        hub.pids.add(int(server["state"]["pid"]))
    return server


def process_started(pid: int) -> float:
    """When process ``pid`` started, in ``CLOCK_BOOTTIME`` seconds (``/proc``'s clock, in 10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, counted from after the name


def spawn_to_ready(
    hub: Hub, admin: httpx.Client, probe: httpx.Client, user: str, profile: str | None
) -> tuple[float, float]:
    """Seconds from ``POST .../server`` until ``/user/{user}/api`` answers through the proxy, and until the
    server's process started (what the spawner does before it starts the process); then stops it."""
    body = {"profile": profile} if profile else None
    posted = time.clock_gettime(time.CLOCK_BOOTTIME)
    started = time.perf_counter()
    response = admin.post(f"{hub.hub_api}/users/{user}/server", json=body)
    if response.status_code not in (201, 202):
        raise RuntimeError(f"{hub.kind} spawn of {user} ({profile}): {response.status_code} {response.text}")
    deadline = started + 60
    url = f"{hub.url}/user/{user}/api"
    while True:
        try:
            answer = probe.get(url)
            if answer.status_code == 200 and "version" in answer.json():
                break
        except (httpx.HTTPError, ValueError):
            pass
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{user}'s server not ready in 60s; log:\n{_log_tail(hub.log)}")
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    server = _server(hub, admin, user)  # notes the pid for clean-up too
    pid = int((server or {}).get("state", {}).get("pid") or 0)
    if not pid:
        raise RuntimeError(f"{hub.kind}: no pid in {user}'s server state: {server}")
    to_process = process_started(pid) - posted
    stopped = admin.delete(f"{hub.hub_api}/users/{user}/server")
    if stopped.status_code not in (202, 204):
        raise RuntimeError(f"stop of {user}: {stopped.status_code} {stopped.text}")
    _wait_for(lambda: _server(hub, admin, user) is None, f"{user}'s server did not stop", hub.log)
    return elapsed, to_process


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1), linear between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


async def lease_load(
    base_url: str, clients: int, seconds: float, max_requests: int, warmup: int, cycle_rate: float | None
) -> dict[str, Any]:
    """``clients`` concurrent loops of POST lease + DELETE lease; latencies per call, requests/s, errors.

    ``cycle_rate`` None: each client starts its next cycle as soon as the last one ends (closed loop, the
    service's saturation). A number: each client starts cycles at Poisson arrivals of that rate per second,
    and a POST's latency counts from when it was due, so time spent waiting behind a slow answer counts too.
    """
    rng = random.Random(7)
    headers = {"Authorization": f"token {HUB_CLIENT_TOKEN}"}
    latencies: dict[str, list[float]] = {"POST": [], "DELETE": []}
    errors: list[str] = []
    state = {"left": max_requests, "warm": 0, "stop_at": 0.0}
    go = asyncio.Event()

    async def one_cycle(client: httpx.AsyncClient, i: int, record: bool, due: float | None = None) -> None:
        body = {
            "profile": "cpu",
            "owner_kind": "server",
            "owner_name": f"c{i}",
            "user": f"bench{i}",
            "groups": [],
        }
        t0 = time.perf_counter() if due is None else due
        created = await client.post("leases", json=body)
        t1 = time.perf_counter()
        if created.status_code != 201 or created.json().get("state") != "granted":
            errors.append(f"POST {created.status_code} {created.text[:200]}")
            return
        t2 = time.perf_counter()
        released = await client.delete(f"leases/{created.json()['id']}")
        t3 = time.perf_counter()
        if released.status_code != 200:
            errors.append(f"DELETE {released.status_code} {released.text[:200]}")
        if record:
            latencies["POST"].append(t1 - t0)
            latencies["DELETE"].append(t3 - t2)

    async def worker(i: int) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30, limits=limits) as client:
            try:
                for _ in range(warmup):
                    await one_cycle(client, i, record=False)
            finally:
                state["warm"] += 1
            await go.wait()
            due = time.perf_counter()
            while time.perf_counter() < state["stop_at"] and state["left"] >= 2:
                state["left"] -= 2
                if cycle_rate is None:
                    await one_cycle(client, i, record=True)
                    continue
                due += rng.expovariate(cycle_rate)
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                await one_cycle(client, i, record=True, due=due)

    tasks = [asyncio.create_task(worker(i)) for i in range(clients)]
    deadline = time.perf_counter() + 60
    while (
        state["warm"] < clients and time.perf_counter() < deadline
    ):  # start measuring with every client warm
        await asyncio.sleep(0.02)
    began = time.perf_counter()
    state["stop_at"] = began + seconds
    go.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - began
    calls = len(latencies["POST"]) + len(latencies["DELETE"])
    return {"latencies": latencies, "errors": errors, "wall": wall, "calls": calls}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=10, help="timed spawns per kind (default 10)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed spawns per kind first (default 1)")
    parser.add_argument("--clients", type=int, default=50, help="concurrent lease API clients (default 50)")
    parser.add_argument(
        "--lease-seconds", type=float, default=10.0, help="lease load per target (default 10)"
    )
    parser.add_argument("--lease-max-requests", type=int, default=100_000, help="cap on calls per target")
    parser.add_argument(
        "--cycle-rates",
        type=lambda text: [float(part) for part in text.split(",")],
        default=[0.5, 2.0],
        help="paced loads: POST+DELETE cycles per second per client, Poisson arrivals (default 0.5,2: one "
        "call a second per client, as a waiting spawner polls, and four)",
    )
    parser.add_argument("--skip-spawn", action="store_true", help="only the lease API (one hub, no spawns)")
    parser.add_argument(
        "--hub-poll",
        type=float,
        default=0.05,
        help="seconds between the hubs' readiness polls of a starting server (0: JupyterHub's backoff)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hub.md")
    args = parser.parse_args()
    if shutil.which("configurable-http-proxy", path=str(CHP_BIN)) is None:
        print(f"configurable-http-proxy is not in {CHP_BIN}; run `make test` first", file=sys.stderr)
        return 2
    command = shlex.join(
        [os.path.relpath(sys.executable, ROOT), os.path.relpath(__file__, ROOT), *sys.argv[1:]]
    )
    run_began = time.monotonic()
    args.load_at_start = os.getloadavg()

    with tempfile.TemporaryDirectory(prefix="gpupool-hub-bench-") as scratch:
        hubs = {}
        for kind in ("gpu",) if args.skip_spawn else ("plain", "gpu"):
            ports = free_ports()
            hubs[kind] = Hub(kind, Path(scratch) / kind, ports, poll=args.hub_poll)
        try:
            for hub in hubs.values():
                hub.start()
            for hub in hubs.values():
                hub.wait_up()
            print("hubs up", flush=True)
            spawn = {} if args.skip_spawn else run_spawns(hubs, args.n, args.warmup)
            leases = {}
            gpu = hubs["gpu"]
            targets = {
                "through the proxy": f"{gpu.url}/services/{SERVICE}/api/v1/",
                "straight to the service": f"http://127.0.0.1:{gpu.ports['service_port']}/services/{SERVICE}/api/v1/",
            }
            modes: dict[str, float | None] = {
                f"paced {rate * 2 * args.clients:g} calls/s": rate for rate in args.cycle_rates
            }
            modes["closed loop"] = None
            for (target, base), (mode, rate) in itertools.product(targets.items(), modes.items()):
                name = f"{mode}, {target}"
                print(f"lease load {name}: {args.clients} clients, {args.lease_seconds:g}s", flush=True)
                leases[name] = asyncio.run(
                    lease_load(
                        base,
                        args.clients,
                        args.lease_seconds,
                        args.lease_max_requests,
                        warmup=2,
                        cycle_rate=rate,
                    )
                )
        finally:
            for hub in hubs.values():
                hub.stop()

    report = render(args, spawn, leases, command, time.monotonic() - run_began)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(f"wrote {args.out}")
    failed = any(r["errors"] for r in leases.values())
    return 1 if failed else 0


KINDS = (("plain", "plain", None), ("gpu: cpu", "gpu", "cpu"), ("gpu: mig-3g", "gpu", "mig-3g"))


def run_spawns(hubs: dict[str, Hub], n: int, warmup: int) -> dict[str, list[float]]:
    """``warmup`` untimed then ``n`` timed spawns of each kind, in an order that rotates every round."""
    times: dict[str, list[float]] = {
        name: [] for label, _, _ in KINDS for name in (label, f"{label} process")
    }
    users = {"plain": "bench-plain", "gpu: cpu": "bench-cpu", "gpu: mig-3g": "bench-mig"}
    probe = httpx.Client(timeout=5, follow_redirects=False)
    admins = {k: httpx.Client(headers={"Authorization": f"token {ADMIN_TOKEN}"}, timeout=60) for k in hubs}
    try:
        for label, kind, _ in KINDS:
            created = admins[kind].post(f"{hubs[kind].hub_api}/users/{users[label]}")
            if created.status_code != 201:
                raise RuntimeError(f"creating {users[label]}: {created.status_code} {created.text}")
        for round_ in range(warmup + n):
            order = KINDS[round_ % 3 :] + KINDS[: round_ % 3]
            for label, kind, profile in order:
                seconds, to_process = spawn_to_ready(hubs[kind], admins[kind], probe, users[label], profile)
                if round_ >= warmup:
                    times[label].append(seconds)
                    times[f"{label} process"].append(to_process)
            done = "warm-up" if round_ < warmup else f"{round_ - warmup + 1}/{n}"
            print(
                f"spawn round {done}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items() if v),
                flush=True,
            )
    finally:
        probe.close()
        for admin in admins.values():
            admin.close()
    return times


def render(
    args: argparse.Namespace,
    spawn: dict[str, list[float]],
    leases: dict[str, dict[str, Any]],
    command: str,
    runtime: float,
) -> str:
    lines = [
        "# Hub benchmarks: spawn-to-ready and the lease API",
        "",
        f"- Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {platform.machine()}, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}; load average at the "
        f"start {args.load_at_start[0]:.2f} (other work on the machine adds noise to both sides alike)",
        f"- Command: `{command}` (total {runtime:.0f} s)",
        "- Everything on loopback, one machine: two JupyterHubs (plain and gpupool) each with its own "
        "configurable-http-proxy, the gpupool service on a simulated pool where nothing queues, and the "
        "load generator.",
        "",
    ]
    if spawn:
        lines += render_spawns(args, spawn)
    lines += render_leases(args, leases)
    return "\n".join(lines) + "\n"


def render_spawns(args: argparse.Namespace, spawn: dict[str, list[float]]) -> list[str]:
    plain = statistics.median(spawn["plain"])
    lines = [
        f"## Spawn-to-ready (N={args.n} each, {args.warmup} warm-up, kinds alternating in a rotating order)",
        "",
        "From `POST /hub/api/users/{u}/server` until `/user/{u}/api` answers 200 through the proxy. "
        + (
            f"Both hubs poll a starting server every {args.hub_poll:g} s instead of JupyterHub's backoff "
            "(0.2, 0.6, 1.4, 3.0, 6.2 s …), whose rounding is seconds wide."
            if args.hub_poll
            else "JupyterHub's own readiness backoff (0.2, 0.6, 1.4, 3.0, 6.2 s …) rounds every figure."
        ),
        "",
        "| Spawner | profile | median (s) | p90 (s) | min (s) | added over plain (median) "
        "| POST → server process started, median (ms) | added before the process (ms) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    plain_process = statistics.median(spawn["plain process"])
    for label, _, profile in KINDS:
        values = spawn[label]
        median = statistics.median(values)
        process = statistics.median(spawn[f"{label} process"])
        spawner = "SimpleLocalProcessSpawner" if label == "plain" else "SimpleLocalGPUSpawner"
        added = (
            "—"
            if label == "plain"
            else f"{(median - plain) / plain * 100:+.1f}% ({(median - plain) * 1000:+.0f} ms)"
        )
        before = "—" if label == "plain" else f"{(process - plain_process) * 1000:+.0f}"
        lines.append(
            f"| {spawner} | {profile or '—'} | {median:.3f} | {quantile(values, 0.9):.3f} | {min(values):.3f} "
            f"| {added} | {process * 1000:.0f} | {before} |"
        )
    return [
        *lines,
        "",
        "The process column is the part a spawner controls: from the POST until the server's process exists "
        "(`/proc` start time, 10 ms ticks); after that both run the same `jupyterhub-singleuser`.",
        "",
        "Target (issue 3): under 5% added.",
        "",
    ]


def render_leases(args: argparse.Namespace, leases: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        f"## Lease API under {args.clients} concurrent clients",
        "",
        f"Each client (its own `httpx.AsyncClient`, one connection) runs cycles of `POST leases` (profile "
        f"`cpu`, on behalf of a user of its own) then `DELETE leases/{{id}}`, for {args.lease_seconds:g} s "
        "after 2 warm-up cycles each, with the hub's service token as the spawner uses it. **Paced N calls/s**: "
        "each client starts cycles at random (Poisson) moments, N calls/s offered in all, and a POST's latency "
        "counts from when it was due. **Closed loop**: each client starts "
        "its next cycle as soon as its last one ends, so the service runs flat out and latency is queueing "
        "(50 clients / throughput); that row measures throughput.",
        "",
        "| Load, target | calls | requests/s | POST p50 (ms) | POST p99 (ms) | DELETE p50 (ms) | DELETE p99 (ms) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in leases.items():
        post, delete = result["latencies"]["POST"], result["latencies"]["DELETE"]
        if not post:
            lines.append(f"| {name} | 0 | — | — | — | — | — | {len(result['errors'])} |")
            continue
        lines.append(
            f"| {name} | {result['calls']} | {result['calls'] / result['wall']:.0f} | "
            f"{quantile(post, 0.5) * 1000:.1f} | {quantile(post, 0.99) * 1000:.1f} | "
            f"{quantile(delete, 0.5) * 1000:.1f} | {quantile(delete, 0.99) * 1000:.1f} | {len(result['errors'])} |"
        )
    lines += ["", "Target (issue 3): p99 under 20 ms.", ""]
    for name, result in leases.items():
        if result["errors"]:
            lines.append(f"First error {name}: `{result['errors'][0]}`")
    return lines


if __name__ == "__main__":
    sys.exit(main())
