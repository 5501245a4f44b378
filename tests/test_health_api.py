"""Drain and undrain end to end: a real JupyterHub and proxy, the gpupool service as its managed service (as
root, so jobs run as the system account from ``job_user``), real job processes, and ``gpupool drain`` run as
a command.

The pool is one node with two H100s, so where a job lands says everything: drained, the GPU's job moves to
the other one and the next job waits; undrained, the waiting job gets it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hub_harness import SERVICE, RunningHub, free_ports, write_hub_config
from job_user import clean_home, job_user
from polling import until

ADMIN_TOKEN = "test-admin-token-health-0123456789abcd"
HUB_CLIENT_TOKEN = "test-hub-client-token-health-012345678"
NODE = "h100-01"
POOL = f"""
nodes:
  - name: {NODE}
    cpu: 64
    memory: 512GiB
    gpus:
      product: H100-80GB
      count: 2
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningHub]:
    tmp = tmp_path_factory.mktemp("health-hub")
    pool = tmp / "pool.yaml"
    pool.write_text(POOL)
    ports = free_ports()
    user = job_user()
    service_env = {
        "GPUPOOL_POOL": str(pool),
        "GPUPOOL_DB_URL": f"sqlite:///{tmp}/gpupool.sqlite",
        "GPUPOOL_JOB_GRACE_SECONDS": "1.5",
    }
    write_hub_config(
        tmp,
        ports,
        admin_token=ADMIN_TOKEN,
        pool_file=pool,
        hub_client_token=HUB_CLIENT_TOKEN,
        service_env=service_env,
    )
    with RunningHub(tmp, ports, ADMIN_TOKEN, service_env=service_env, fail=pytest.fail) as hub:
        hub.create_user(user)
        hub.token_for(user)
        hub.tokens["me"] = hub.tokens[user]
        yield hub
    clean_home(user)


def gpupool(hub: RunningHub, who: str, *argv: str) -> subprocess.CompletedProcess[str]:
    connection = ["--url", f"{hub.url}/services/gpupool/", "--token", hub.tokens[who]]
    return subprocess.run(
        [sys.executable, "-m", "gpupool.spawner.cli", *argv, *connection],
        capture_output=True,
        text=True,
        timeout=60,
    )


def submit(me: httpx.Client, retries: int = 2) -> dict[str, Any]:
    response = me.post("/jobs", json={"command": ["sleep", "60"], "profile": "h100", "retries": retries})
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def job(me: httpx.Client, job_id: str) -> dict[str, Any]:
    found: dict[str, Any] = me.get(f"/jobs/{job_id}").json()
    return found


def gpu_index(me: httpx.Client, uuid: str) -> int:
    gpus = me.get("/pool").json()["nodes"][0]["gpus"]
    index: int = next(g["index"] for g in gpus if g["uuid"] == uuid)
    return index


def health(me: httpx.Client, index: int) -> str:
    state: str = me.get("/pool").json()["nodes"][0]["gpus"][index]["health"]
    return state


def running_on(me: httpx.Client, job_id: str) -> int | None:
    found = job(me, job_id)
    if found["state"] != "running" or not found["devices"]:
        return None
    return gpu_index(me, found["devices"][0]["uuid"])


def test_an_admin_drains_a_gpu_its_job_moves_new_work_waits_and_undrain_brings_it_back(
    hub: RunningHub, tmp_path: Path
) -> None:
    with hub.as_user("me") as me, hub.as_user("admin") as admin:
        first = submit(me)
        until(lambda: running_on(me, first["id"]) is not None, "the first job to run")
        drained = running_on(me, first["id"])
        assert drained is not None
        other = 1 - drained

        refused = gpupool(hub, "me", "drain", f"{NODE}/{drained}")  # a user's token may not
        assert refused.returncode == 1 and "custom:gpupool:admin" in refused.stderr, refused.stderr
        assert me.post("/admin/undrain", json={"node": NODE}).status_code == 403
        assert me.get("/admin/health").status_code == 403

        out = gpupool(hub, "admin", "drain", f"{NODE}/{drained}")
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"{NODE}/{drained}\tdrained\tjobs requeued: {first['id']}"), out.stdout
        assert f"{first['id']} ({first['user']}'s {first['name']})" in out.stdout  # who it is, not only an id
        assert health(me, drained) == "drained"

        until(lambda: running_on(me, first["id"]) == other, "the requeued job to run on the other GPU")
        history = job(me, first["id"])["history"]
        assert [t["state"] for t in history] == ["queued", "running", "requeued", "running"]
        assert history[2]["reason"] == f"drained by service test-admin: GPU {drained} of node {NODE}"
        # what the job's views show while it runs again (a failure trial read only "attempt 2 started on …")
        assert history[3]["reason"].endswith(f"; the run before: {history[2]['reason']}"), history[3]
        # and the user's own page lists it with that line (a failure trial's page had no jobs at all)
        page = httpx.get(f"{hub.url}/services/{SERVICE}/", params={"token": hub.tokens["me"]}).text
        listed = page[page.index('id="my-jobs"') :]
        assert first["id"] in listed and "the run before: drained by service test-admin" in listed, listed

        second = submit(me)  # the drained GPU is free, yet nothing new is placed on it
        assert job(me, second["id"])["state"] == "queued" and job(me, second["id"])["position"] == 0
        page = httpx.get(f"{hub.url}/services/{SERVICE}/", params={"token": hub.tokens["me"]}).text
        waiting = page[page.index(second["id"], page.index('id="my-jobs"')) :]
        assert re.match(
            rf"{second['id']}</td>.*<td>#1 in the queue, (expected to start by|no expected start)", waiting
        )
        marks = admin.get("/admin/health").json()
        assert marks == [
            {
                "node": NODE,
                "gpu_index": drained,
                "health": "drained",
                "reasons": {"drained": "drained by service test-admin"},
                "leases": [],
            }
        ]

        unknown = gpupool(hub, "admin", "drain", "no-such-node/0")
        assert unknown.returncode == 1 and "node: no such node" in unknown.stderr, unknown.stderr
        bad_gpu = admin.post("/admin/drain", json={"node": NODE, "gpu_index": 9})
        assert bad_gpu.status_code == 400 and bad_gpu.json()["fields"] == ["gpu_index"], bad_gpu.text
        quoted = admin.post("/admin/faults", json={"node": NODE, "gpu_index": "0"})  # numbers must be numbers
        assert quoted.status_code == 400 and quoted.json()["fields"] == ["gpu_index"], quoted.text

        back = gpupool(hub, "admin", "undrain", f"{NODE}/{drained}")
        assert back.returncode == 0 and back.stdout == f"{NODE}/{drained}\thealthy\n", back.stderr
        until(lambda: running_on(me, second["id"]) == drained, "the waiting job to run on the undrained GPU")
        assert health(me, drained) == "healthy" and admin.get("/admin/health").json() == []

        # an admin's trial found faults and repairs only in the API, answering with bare ids
        assert me.delete(f"/jobs/{first['id']}").json()["state"] in (
            "running",
            "cancelled",
        )  # room on `other`
        failed = gpupool(hub, "admin", "fault", f"{NODE}/{drained}")
        assert failed.returncode == 0, failed.stderr
        said = f"{NODE}/{drained}\tunhealthy\tjobs requeued: {second['id']} ({second['user']}'s {second['name']})"
        assert failed.stdout.startswith(said), failed.stdout
        until(lambda: running_on(me, second["id"]) == other, "the requeued job to run on the healthy GPU")
        repaired = gpupool(hub, "admin", "repair", f"{NODE}/{drained}")
        assert repaired.returncode == 0 and repaired.stdout == f"{NODE}/{drained}\thealthy\n", repaired.stderr
        assert me.delete(f"/jobs/{second['id']}").json()["state"] in ("running", "cancelled")

        # a failure trial: a fault said "jobs requeued" of a job that had no retries left, and so failed
        until(lambda: job(me, second["id"])["state"] == "cancelled", "the second job to end")
        last = submit(me, retries=0)
        until(lambda: running_on(me, last["id"]) is not None, "the job without retries to run")
        where = running_on(me, last["id"])
        ended = gpupool(hub, "admin", "fault", f"{NODE}/{where}")
        assert ended.returncode == 0, ended.stderr
        assert ended.stdout.startswith(
            f"{NODE}/{where}\tunhealthy\tjobs requeued: none; jobs that end failed, no retries left (their "
            f"checkpoints kept): {last['id']} ({last['user']}'s {last['name']})"
        ), ended.stdout
        until(lambda: job(me, last["id"])["state"] == "failed", "the job without retries to fail")
        assert gpupool(hub, "admin", "repair", f"{NODE}/{where}").returncode == 0


def test_a_simulated_xid_takes_the_gpu_out_as_a_real_failure_would(hub: RunningHub) -> None:
    """A failure trial could try only an admin's `fault`: nothing let a simulated pool show what the telemetry
    does when a GPU reports a critical XID."""
    with hub.as_user("me") as me, hub.as_user("admin") as admin:
        running = submit(me, retries=1)
        until(lambda: running_on(me, running["id"]) is not None, "the job to run")
        where = running_on(me, running["id"])
        refused = gpupool(hub, "me", "simulate-xid", f"{NODE}/{where}", "79")
        assert refused.returncode == 1 and "custom:gpupool:admin" in refused.stderr, refused.stderr
        no_gpu = gpupool(hub, "admin", "simulate-xid", NODE, "79")
        assert no_gpu.returncode == 1 and "an XID is a GPU's" in no_gpu.stderr, no_gpu.stderr

        mild = gpupool(hub, "admin", "simulate-xid", f"{NODE}/{where}", "13")
        assert mild.returncode == 0 and "not critical: the GPU stays in the pool" in mild.stdout, mild.stdout
        uuid = job(me, running["id"])["devices"][0]["uuid"]
        until(lambda: 13 in xids_reported(me, uuid), "a sample to report XID 13")
        # an application's XID leaves the GPU and its job alone
        assert health(me, where) == "healthy" and running_on(me, running["id"]) == where

        critical = gpupool(hub, "admin", "simulate-xid", f"{NODE}/{where}", "79")
        assert critical.returncode == 0 and "critical (GPU has fallen off the bus)" in critical.stdout
        until(lambda: health(me, where) == "unhealthy", "the telemetry to take the GPU out")
        (mark,) = admin.get("/admin/health").json()
        assert mark["reasons"] == {"unhealthy": "XID 79: GPU has fallen off the bus"}, mark
        until(lambda: running_on(me, running["id"]) == 1 - where, "the job to run again on the other GPU")
        assert gpupool(hub, "admin", "repair", f"{NODE}/{where}").returncode == 0
        assert me.delete(f"/jobs/{running['id']}").status_code == 200


def xids_reported(me: httpx.Client, uuid: str) -> set[int]:
    """The XIDs the recent samples of a device the caller holds reported."""
    devices = me.get("/telemetry").json()["devices"]
    return {x for d in devices if d["uuid"] == uuid for s in d["samples"] for x in s.get("xid_errors") or ()}
