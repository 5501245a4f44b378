"""Limits that hold on one host: each server and job in a control group with its profile's CPU and memory.

Making control groups takes root, as the hub and the service on a real host have; the tests run as root in CI
(cgroup v1 there, v2 on most desktops). A real hub with the GPU spawner and the gpupool service, on a profile
of 768 MiB: a notebook kernel that allocates 1 GiB is killed by the kernel's OOM killer inside its server's
group, while the hub and another user's server carry on; a job past its memory ends the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hub_harness import RunningHub
from job_user import clean_home, job_user, python_with_numpy
from polling import until
from test_local_spawner import spawner_hub
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from gpupool.spawner.limits import CPU_PERIOD_US, Limits, server_group, this_host

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="as root only: control groups are made by root (CI runs as root)"
)

POOL = "nodes:\n  - {name: box-01, cpu: 16, memory: 64GiB}\n"
PROFILES = """
profiles:
  - slug: small
    display_name: Small CPU server
    cpu: 1
    memory: 768MiB
    default: true
"""
ALLOCATE = "x = bytearray(1024**3)"  # 1 GiB touched, past the profile's 768 MiB


def test_this_host_enforces_limits() -> None:
    host = this_host()
    assert host.enforced, host.reason


def test_a_process_past_its_memory_is_killed_and_its_cpu_quota_is_the_profiles() -> None:
    host = this_host()
    group = host.create(f"test-{uuid.uuid4().hex[:8]}", Limits(cpu_milli=1500, memory_mib=64))
    assert group is not None
    try:
        code = "x = bytearray(300 * 1024**2); print('survived')"
        result = _run_in(group.add, ["python3", "-c", code])
        assert result == -9 and group.oom_kills() >= 1
        (quota,) = [d / f for d in group.folders for f in ("cpu.max", "cpu.cfs_quota_us") if (d / f).exists()]
        assert quota.read_text().split()[0] == str(
            1500 * CPU_PERIOD_US // 1000
        )  # v2 "quota period", v1 quota
        # v1 without swap accounting: swappiness 0 keeps a group past its limit from swapping the host to a stall
        swappiness = [d / "memory.swappiness" for d in group.folders if (d / "memory.swappiness").exists()]
        assert all(f.read_text().strip() == "0" for f in swappiness), swappiness
    finally:
        group.remove()
    assert not any(folder.exists() for folder in group.folders)


def _run_in(preexec: Any, command: list[str]) -> int:
    return subprocess.run(command, preexec_fn=preexec, capture_output=True).returncode


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningHub]:
    users = ("alice", "bob", job_user())
    yield from spawner_hub(
        tmp_path_factory.mktemp("limits-hub"), users, pool=POOL, profiles=PROFILES, spawn_timeout=60
    )
    clean_home(job_user())


def test_a_kernel_past_its_servers_memory_is_killed_while_the_hub_and_others_carry_on(
    hub: RunningHub,
) -> None:
    admin = hub.admin()
    servers = {user: _start(hub, admin, user) for user in ("alice", "bob")}
    alice = servers["alice"]
    group = this_host().group(server_group(alice["state"]["gpupool_lease_id"]))
    assert group is not None and int(alice["state"]["pid"]) in group.pids()
    assert "CPU and memory limits are enforced" in hub.log.read_text()

    token = hub.token_for("alice")
    user_api = f"{hub.url}/user/alice/api"
    kernel = httpx.post(f"{user_api}/kernels", headers={"Authorization": f"token {token}"}, json={}).json()
    asyncio.run(_execute(f"{user_api}/kernels/{kernel['id']}/channels", token, ALLOCATE))
    until(lambda: group.oom_kills() >= 1, "the kernel's 1 GiB was not stopped by the OOM killer", timeout=60)

    assert (memory := group.memory_used()) is not None and memory < 768 * 1024**2
    for user, server in servers.items():  # both servers, the hub, and the proxy still answer
        status = httpx.get(f"{hub.url}/user/{user}/api/status", headers=_auth(hub, user))
        assert status.status_code == 200, (user, status.text)
        assert os.path.exists(f"/proc/{server['state']['pid']}")
    for user in servers:
        assert admin.delete(f"{hub.hub_api}/users/{user}/server").status_code in (202, 204)
    # a stop may take the spawner's SIGINT, SIGTERM and SIGKILL waits (10 + 5 + 5 s) on a slow machine
    until(
        lambda: not any(folder.exists() for folder in group.folders), "the server's group was not removed", 60
    )


def test_a_job_runs_in_a_group_of_its_own_and_past_its_memory_is_killed(hub: RunningHub) -> None:
    user = job_user()
    python, env = python_with_numpy()
    service = httpx.Client(base_url=hub.service_api, headers=_auth(hub, user), timeout=30)
    where = service.post(
        "/jobs",
        json={
            "profile": "small",
            "command": [*python, "-c", "print(open('/proc/self/cgroup').read())"],
            "env": env,
        },
    )
    hog = service.post("/jobs", json={"profile": "small", "command": [*python, "-c", ALLOCATE], "env": env})
    assert where.status_code == hog.status_code == 201, (where.text, hog.text)

    def ended(job: dict[str, Any]) -> dict[str, Any] | None:
        model: dict[str, Any] = service.get(f"/jobs/{job['id']}").json()
        return model if model["state"] in ("succeeded", "failed") else None

    until(
        lambda: ended(where.json()) is not None and ended(hog.json()) is not None, "the jobs did not end", 60
    )
    done = ended(where.json())
    assert done is not None and done["state"] == "succeeded", done
    log = service.get(f"/jobs/{done['id']}/logs").text
    assert f"gpupool/job-{done['id']}-1" in log, log
    killed = ended(hog.json())
    assert killed is not None and killed["state"] == "failed", killed
    assert killed["reason"].startswith("the kernel's OOM killer stopped it"), killed


def test_a_server_shows_its_cpu_and_memory_against_its_profiles_limits(hub: RunningHub) -> None:
    """What GpuMonitor and the dashboard read: a kernel that spins and holds 300 MiB shows about a core of the
    profile's one and about 300 MiB of its 768, read from the server's own group."""
    admin = hub.admin()
    server = _start(hub, admin, "bob")
    lease_id = server["state"]["gpupool_lease_id"]
    token = hub.token_for("bob")
    user_api = f"{hub.url}/user/bob/api"
    kernel = httpx.post(f"{user_api}/kernels", headers={"Authorization": f"token {token}"}, json={}).json()
    busy = "x = bytearray(300 * 1024**2)\nimport time\nend = time.time() + 60\nwhile time.time() < end: pass"
    asyncio.run(_execute(f"{user_api}/kernels/{kernel['id']}/channels", token, busy))
    service = httpx.Client(base_url=hub.service_api, headers={"Authorization": f"token {token}"}, timeout=10)
    seen: dict[str, Any] = {}

    def busy_and_holding() -> bool:
        seen.update(service.get(f"/leases/{lease_id}/resources").json())
        return (seen["cpu_used"] or 0) > 0.6 and (seen["memory_used_mib"] or 0) > 300

    until(busy_and_holding, f"the server's use did not show: {seen}", timeout=60)
    assert (seen["limits_by"], seen["cpu_limit"], seen["memory_limit_mib"]) == ("cgroup", 1.0, 768)
    assert seen["cpu_used"] < 1.2 and seen["memory_used_mib"] < 768  # the quota and the limit hold
    other = httpx.get(f"{hub.service_api}/leases/{lease_id}/resources", headers=_auth(hub, "alice"))
    assert other.status_code == 403  # another user's server is not theirs to watch
    page = admin.get(f"{hub.url}/services/gpupool/").text  # the admin dashboard's row for it
    row = re.search(
        rf"<tr><td>bob[^<]*</td><td>small</td><td>([^<]*)</td><td>([^<]*)</td><td>{lease_id}</td>", page
    )
    assert row and row.group(1).endswith(" of 1") and row.group(2).endswith(" of 0.8"), page
    assert admin.delete(f"{hub.hub_api}/users/bob/server").status_code in (202, 204)


def test_what_a_killed_server_leaves_running_ends_with_it(hub: RunningHub) -> None:
    """Kernels, and what they start in sessions of their own (``nohup python train.py &``), outlive a server
    killed outright, holding the memory (and on a GPU host, the devices) of a lease that goes to the next
    user. Stopping the server ends them all and removes its group."""
    admin = hub.admin()
    server = _start(hub, admin, "alice")
    server_pid = int(server["state"]["pid"])
    group = this_host().group(server_group(server["state"]["gpupool_lease_id"]))
    assert group is not None
    token = hub.token_for("alice")
    user_api = f"{hub.url}/user/alice/api"
    kernel = httpx.post(f"{user_api}/kernels", headers={"Authorization": f"token {token}"}, json={}).json()
    detach = "import subprocess\nsubprocess.Popen(['sleep', '600'], start_new_session=True)"
    asyncio.run(_execute(f"{user_api}/kernels/{kernel['id']}/channels", token, detach))
    until(lambda: len(group.pids()) >= 3, "the kernel and its child did not start in the server's group", 60)
    left = [pid for pid in group.pids() if pid != server_pid]

    os.kill(server_pid, signal.SIGKILL)
    assert admin.delete(f"{hub.hub_api}/users/alice/server").status_code in (202, 204)
    until(
        lambda: not any(os.path.exists(f"/proc/{pid}") for pid in left), f"processes {left} outlived it", 30
    )
    until(lambda: not any(folder.exists() for folder in group.folders), "the server's group was not removed")


def test_what_a_job_leaves_running_ends_with_it(hub: RunningHub) -> None:
    """A command that starts a child in a session of its own and exits: the job ends, and the child with it."""
    user = job_user()
    service = httpx.Client(base_url=hub.service_api, headers=_auth(hub, user), timeout=30)
    detach = "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!"
    job = service.post("/jobs", json={"profile": "small", "command": ["/bin/sh", "-c", detach]})
    assert job.status_code == 201, job.text

    def ended() -> dict[str, Any] | None:
        model: dict[str, Any] = service.get(f"/jobs/{job.json()['id']}").json()
        return model if model["state"] in ("succeeded", "failed") else None

    until(lambda: ended() is not None, "the job did not end", 60)
    done = ended()
    assert done is not None and done["state"] == "succeeded", done
    child = int(service.get(f"/jobs/{done['id']}/logs").text.split()[0])
    until(lambda: not os.path.exists(f"/proc/{child}"), f"the job's child {child} outlived it", 10)


def _start(hub: RunningHub, admin: httpx.Client, user: str) -> dict[str, Any]:
    response = admin.post(f"{hub.hub_api}/users/{user}/server", json={"profile": "small"})
    assert response.status_code in (201, 202), response.text

    def ready() -> dict[str, Any] | None:
        server: dict[str, Any] | None = admin.get(f"{hub.hub_api}/users/{user}").json()["servers"].get("")
        return server if server and server["ready"] else None

    until(lambda: ready() is not None, f"{user}'s server did not start", timeout=60)
    server = ready()
    assert server is not None
    hub.pids.add(int(server["state"]["pid"]))
    return server


def _auth(hub: RunningHub, user: str) -> dict[str, str]:
    return {"Authorization": f"token {hub.tokens.get(user) or hub.token_for(user)}"}


async def _execute(url: str, token: str, code: str) -> None:
    """Send ``code`` to a kernel over Jupyter's websocket protocol, without waiting for a reply (the kernel
    may be killed before it sends one)."""
    request = HTTPRequest(url.replace("http", "ws", 1), headers={"Authorization": f"token {token}"})
    connection = await websocket_connect(request)
    session = uuid.uuid4().hex
    header = {
        "msg_id": uuid.uuid4().hex,
        "username": "test",
        "session": session,
        "msg_type": "execute_request",
        "version": "5.3",
    }
    content = {"code": code, "silent": False, "store_history": False, "allow_stdin": False}
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
    await connection.write_message(json.dumps(message))
    await asyncio.sleep(0.5)
    connection.close()
