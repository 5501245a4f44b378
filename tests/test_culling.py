"""GPU-aware culling end to end: a real hub, proxy, gpupool service and the real jupyterhub-idle-culler process.

The culler runs as a managed service with the shipped ``hub_config/idle_culler_config.py`` (gpupool's arbiter),
a one-second pass, a global ``--timeout`` of an hour (so every cull here comes from a profile's limit) and a
three-second warning. The service samples a simulated pool of three H100s every half second (idle at 5% or
less); a simulated GPU is as busy as the CPU of the processes pinned to it, so servers are made busy by a
spinning process started with ``CUDA_VISIBLE_DEVICES`` naming their leases' devices.

Four servers start at once: alice (``gpu``, idle GPU, browser tab "open": the test keeps posting her
activity), carol (``gpu``, busy GPU, browser inactive), bob (``gpu-brief``, busy GPU, a 20 s maximum lifetime)
and dave (``cpu-quick``, a 6 s idle timeout).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from hub_harness import SERVICE, RunningHub, free_ports, write_hub_config
from prometheus_client.parser import text_string_to_metric_families
from test_local_spawner import (
    ADMIN_SCOPES,
    ADMIN_TOKEN,
    GPU_SPAWNER,
    HUB_CLIENT_TOKEN,
    SPAWNER_CONFIG,
    _free_devices,
    _lease,
    _server,
    _start,
    _wait_for,
    _wait_ready,
)

from gpupool.spawner.hub.up import CULLER_SCOPES, culler_command

WARNING_SECONDS = 3.0
GPU_IDLE_TIMEOUT = 8.0
MAX_LIFETIME = 20.0
CULLER = "idle-culler"

POOL = """
nodes:
  - name: box-01
    cpu: 64
    memory: 512GiB
    gpus: {product: H100-80GB, count: 3}
"""

PROFILES = f"""
profiles:
  - slug: gpu
    display_name: One H100
    gpus: {{count: 1}}
    cpu: 1
    memory: 1GiB
    idle_timeout: 6s
    gpu_idle_timeout: {GPU_IDLE_TIMEOUT:.0f}s
    default: true
  - slug: gpu-brief
    display_name: One H100, briefly
    gpus: {{count: 1}}
    cpu: 1
    memory: 1GiB
    idle_timeout: 6s
    gpu_idle_timeout: {GPU_IDLE_TIMEOUT:.0f}s
    max_lifetime: {MAX_LIFETIME:.0f}s
  - slug: cpu-quick
    display_name: CPU, short idle timeout
    cpu: 1
    memory: 1GiB
    idle_timeout: 6s
"""

# 20 ms of CPU, then 30 ms asleep: about 40% of a core, and still well above the 5% threshold on a loaded box
# (counting CPU time, not wall time, so a busy CI runner cannot starve it into looking idle)
SPIN = (
    "import time\n"
    "while True:\n"
    "    t = time.process_time()\n"
    "    while time.process_time() - t < 0.02: pass\n"
    "    time.sleep(0.03)\n"
)


@dataclass
class Cluster:
    hub: RunningHub
    devices: dict[str, str] = field(default_factory=dict)  # user -> the device of their lease
    spinners: list[subprocess.Popen[bytes]] = field(default_factory=list)
    started: dict[str, float] = field(default_factory=dict)
    warned: dict[str, dict[str, Any]] = field(default_factory=dict)  # user -> the first warning seen
    running_when_warned: dict[str, bool] = field(default_factory=dict)
    gone_at: dict[str, float] = field(default_factory=dict)  # user -> when their ready server was first gone
    hub_started: dict[str, float] = field(default_factory=dict)  # user -> the server's "started" in the hub


def _watch(cluster: Cluster, stop: threading.Event) -> None:
    """Record, every quarter second, each user's first warning and when their server went, so the tests can
    judge the order of events whichever of them runs first."""
    hub = cluster.hub
    ready: set[str] = set()
    with hub.admin() as admin:
        while not stop.wait(0.25):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                users = {u["name"]: u["servers"].get("") for u in admin.get(f"{hub.hub_api}/users").json()}
                warnings = admin.get(f"{hub.service_api}/warnings").json()
                now = time.time()
                for name, server in users.items():
                    if server and server.get("ready"):
                        ready.add(name)
                        cluster.hub_started.setdefault(name, _epoch(server["started"]))
                    elif name in ready and name not in cluster.gone_at:
                        cluster.gone_at[name] = now
                for warning in warnings:
                    if warning["user"] not in cluster.warned:
                        cluster.warned[warning["user"]] = warning
                        cluster.running_when_warned[warning["user"]] = bool(users.get(warning["user"]))


def _culler_config(service_port: int) -> list[str]:
    service = {
        "name": CULLER,
        "command": culler_command(timeout=3600, cull_every=1),
        "environment": {
            "GPUPOOL_SERVICE_URL": f"http://127.0.0.1:{service_port}/services/{SERVICE}/",
            "GPUPOOL_CULL_WARNING_SECONDS": str(WARNING_SECONDS),
        },
    }
    role = {"name": CULLER, "scopes": list(CULLER_SCOPES), "services": [CULLER]}
    return [f"c.JupyterHub.services.append({service!r})", f"c.JupyterHub.load_roles.append({role!r})"]


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _device_of(hub: RunningHub, admin: httpx.Client, user: str) -> str:
    """The device of ``user``'s granted lease, as soon as the spawner has it (before the server is up)."""
    found: list[str] = []

    def granted() -> bool:
        leases = admin.get(f"{hub.service_api}/leases", params={"user": user, "active_only": True}).json()
        found[:] = [d["uuid"] for lease in leases if lease["state"] == "granted" for d in lease["devices"]]
        return bool(found)

    _wait_for(granted, f"{user}'s lease was not granted", hub.log, timeout=30)
    return found[0]


def _spin_on(uuid: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SPIN], env={"CUDA_VISIBLE_DEVICES": uuid})


def _keep_active(hub: RunningHub, user: str, stop: threading.Event) -> None:
    """Post ``user``'s activity every half second, as an open browser tab would."""
    while not stop.wait(0.5):
        now = datetime.now(UTC).isoformat()
        with contextlib.suppress(httpx.HTTPError):
            hub.api(
                "POST",
                f"users/{user}/activity",
                json={"last_activity": now, "servers": {"": {"last_activity": now}}},
            )


def _warnings(hub: RunningHub, user: str) -> list[dict[str, Any]]:
    with hub.as_user(user) as client:
        response = client.get("/warnings")
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("culling-hub")
    (tmp / "pool.yaml").write_text(POOL)
    (tmp / "profiles.yaml").write_text(PROFILES)
    ports = free_ports()
    write_hub_config(
        tmp,
        ports,
        admin_token=ADMIN_TOKEN,
        admin_scopes=ADMIN_SCOPES,
        pool_file=tmp / "pool.yaml",
        service_env={
            "GPUPOOL_PROFILES": str(tmp / "profiles.yaml"),
            "GPUPOOL_SAMPLE_SECONDS": "0.5",
            "GPUPOOL_RECONCILE_SECONDS": "2",
            "GPUPOOL_GPU_IDLE_THRESHOLD": "5",
        },
        hub_client_token=HUB_CLIENT_TOKEN,
        spawner_class=GPU_SPAWNER,
        spawn_timeout=60,
        extra_config=[
            *SPAWNER_CONFIG,
            f"c.SimpleLocalGPUSpawner.profiles_file = {str(tmp / 'profiles.yaml')!r}",
            *_culler_config(ports["service_port"]),
        ],
    )
    stop = threading.Event()
    with RunningHub(tmp, ports, ADMIN_TOKEN, fail=pytest.fail) as hub:
        cluster = Cluster(hub)
        try:
            for name in ("alice", "bob", "carol", "dave"):
                hub.create_user(name)
                hub.token_for(name)
            with hub.admin() as admin:
                for user, profile in (
                    ("carol", "gpu"),
                    ("bob", "gpu-brief"),
                    ("alice", "gpu"),
                    ("dave", "cpu-quick"),
                ):
                    _start(hub, admin, user, profile)
                    cluster.started[user] = time.time()
                for user in ("carol", "bob"):
                    cluster.devices[user] = _device_of(hub, admin, user)
                # one process on both devices: busy from their first seconds, before the culler sees them
                cluster.spinners.append(_spin_on(f"{cluster.devices['carol']},{cluster.devices['bob']}"))
                cluster.devices["alice"] = _device_of(hub, admin, "alice")
                threading.Thread(target=_keep_active, args=(hub, "alice", stop), daemon=True).start()
                threading.Thread(target=_watch, args=(cluster, stop), daemon=True).start()
                for user in ("alice", "bob", "carol", "dave"):
                    _wait_ready(hub, admin, user, timeout=60)
            yield cluster
        finally:
            stop.set()
            for spinner in cluster.spinners:
                spinner.kill()
                spinner.wait()


def _wait_culled(cluster: Cluster, user: str, timeout: float = 40) -> tuple[dict[str, Any], float]:
    """The first warning ``user`` had and when their server went; fails when it does not go in time."""
    _wait_for(lambda: user in cluster.gone_at, f"{user} was not culled", cluster.hub.log, timeout)
    assert user in cluster.warned, f"{user} was culled without a warning"
    assert cluster.running_when_warned[user], f"{user} was warned only after the cull"
    return cluster.warned[user], cluster.gone_at[user]


def test_a_server_idle_on_its_gpu_is_warned_then_culled_with_its_tab_open_and_its_gpu_freed(
    cluster: Cluster,
) -> None:
    hub = cluster.hub
    warning, gone_at = _wait_culled(cluster, "alice")
    assert "GPUs have been idle" in warning["reason"], warning
    assert warning["cull_at"] >= warning["warned_at"] + WARNING_SECONDS - 0.2
    assert gone_at >= warning["cull_at"]
    with hub.admin() as admin:
        _wait_for(
            lambda: _lease(hub, admin, warning["lease_id"])["state"] == "released",
            "alice's lease was not released",
            hub.log,
            timeout=10,
        )
        # an admin trial read only "released by service …" on a culled server's lease
        said = _lease(hub, admin, warning["lease_id"])["release_reason"]
        assert said.startswith("its server was culled (gpu_idle_timeout): its GPUs have been idle"), said
        _wait_for(
            lambda: cluster.devices["alice"] in _free_devices(hub, admin),
            "alice's GPU was not free again",
            hub.log,
            timeout=5,
        )
    assert _warnings(hub, "alice") == []  # the warning ended with the lease
    log = hub.log.read_text()
    assert "culling alice" in log and "GPUs have been idle" in log  # gpupool's arbiter, in the real culler
    # and the culler itself saw her tab open: inactive for less than the profile's idle_timeout
    inactive = re.search(r"Culling server alice \(inactive for 00:00:(\d\d)\)", log)
    assert inactive is not None and int(inactive.group(1)) < 6, log[-3000:]


def test_a_server_busy_on_its_gpu_is_never_culled_for_inactivity(cluster: Cluster) -> None:
    hub = cluster.hub
    # past the GPU and browser idle limits, with the warning and two passes to spare
    until = cluster.started["carol"] + GPU_IDLE_TIMEOUT + WARNING_SECONDS + 2
    _wait_for(lambda: time.time() >= until, "time did not pass", hub.log, timeout=60)
    with hub.admin() as admin:
        server = _server(hub, admin, "carol")
        assert server is not None and server["ready"]
        activity = admin.get(f"{hub.service_api}/activity/users/carol").json()
    assert activity["gpu"]["state"] == "busy", activity
    assert activity["limits"] == {"idle_timeout": 6, "gpu_idle_timeout": 8, "max_lifetime": None}
    assert (
        time.time() - _epoch(server["last_activity"]) > 6
    )  # the browser is idle past the profile's idle_timeout
    assert "carol" not in cluster.warned and _warnings(hub, "carol") == []


def test_the_maximum_lifetime_culls_even_a_busy_server(cluster: Cluster) -> None:
    warning, gone_at = _wait_culled(cluster, "bob", timeout=MAX_LIFETIME + 20)
    assert "maximum lifetime" in warning["reason"], warning
    assert gone_at - cluster.hub_started["bob"] >= MAX_LIFETIME  # the age the culler judges by
    with cluster.hub.admin() as admin:
        _wait_for(
            lambda: cluster.devices["bob"] in _free_devices(cluster.hub, admin),
            "bob's GPU was not free again",
            cluster.hub.log,
            timeout=10,
        )


def test_a_profile_idle_timeout_replaces_the_culler_global_timeout(cluster: Cluster) -> None:
    warning, gone_at = _wait_culled(cluster, "dave")  # the culler's own --timeout is an hour
    assert "inactive for 6s" in warning["reason"], warning
    assert gone_at - cluster.started["dave"] >= 6


def test_each_cull_is_counted_on_the_metrics_page_by_the_limit_it_reached(cluster: Cluster) -> None:
    for user, timeout in (("alice", 40.0), ("dave", 40.0), ("bob", MAX_LIFETIME + 20.0)):
        _wait_culled(cluster, user, timeout)
    with cluster.hub.admin() as admin:
        page = admin.get(f"{cluster.hub.url}/services/{SERVICE}/metrics")
    assert page.status_code == 200, page.text
    (culls,) = (f for f in text_string_to_metric_families(page.text) if f.name == "gpupool_culls")
    counted = {s.labels["limit"]: s.value for s in culls.samples if s.name == "gpupool_culls_total"}
    assert counted == {"gpu_idle_timeout": 1, "idle_timeout": 1, "max_lifetime": 1}  # carol stays: busy
    # and each is kept, to read later: an admin's trial found who was culled, and why, only in the hub's log
    with cluster.hub.admin() as admin:
        kept = admin.get(f"{cluster.hub.url}/services/{SERVICE}/api/v1/culls").json()
    assert sorted((c["user"], c["limit"]) for c in kept) == [
        ("alice", "gpu_idle_timeout"),
        ("bob", "max_lifetime"),
        ("dave", "idle_timeout"),
    ]
    assert all(c["reason"] and c["lease_id"] for c in kept), kept
    with cluster.hub.as_user("dave") as dave:
        assert [c["user"] for c in dave.get("/culls").json()] == ["dave"]  # a user reads their own
        assert dave.get("/culls", params={"user": "alice"}).status_code == 403


def test_users_read_only_their_own_warnings_and_cannot_record_any(cluster: Cluster) -> None:
    with cluster.hub.as_user("carol") as carol:
        assert carol.get("/warnings", params={"user": "bob"}).status_code == 403
        posted = carol.post("/warnings", json={"user": "bob", "cull_at": 0, "reason": "spite"})
        assert posted.status_code == 403, posted.text
        assert carol.delete("/warnings/bob").status_code == 403
        culled = carol.post("/culls", json={"user": "bob", "limit": "idle_timeout", "reason": "spite"})
        assert culled.status_code == 403, culled.text
        assert carol.get("/activity/users/bob").status_code == 403
