"""``kill -9`` of the hub, then of the gpupool service, mid-spawn and while servers run: no lease leaks or doubles.

One real hub for the module (the config and pool of ``test_local_spawner``: one whole H100 and one H100 split
into two 3g.40gb MIG slices), its proxy, the service as a managed service reconciling every second, and spawned
``jupyterhub-singleuser`` servers. Each test crashes something with SIGKILL and brings it back the way an
operator would: the hub is started again on the same config and database; a dead service is started by hand
(the hub itself restarts a dead managed service only on its 30-second poll).

What a ``kill -9`` of the hub leaves, as these tests rely on it: the proxy and the single-user servers run in
sessions of their own and live on; the managed service ends with the hub. The restarted hub stops the old
proxy (its pid file) and starts its own, and a new service that restores every lease and the queue. After every scenario :func:`_check_pool` asserts the invariant: the active leases are
exactly those of the ready servers (one each), no device is in two leases, ``GET pool`` shows every other
device free, and every single-user process runs on the active lease of its own server.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hub_harness import environ_of
from job_user import clean_home, job_user
from polling import pauses
from test_local_spawner import (
    HUB_CLIENT_TOKEN,
    Hub,
    _free_devices,
    _lease,
    _server,
    _start,
    _stop,
    _wait_for,
    _wait_ready,
    spawner_hub,
)
from test_reconcile import SERVICE_ROLE

from gpupool.spawner.pool.job_states import FINISHED as FINISHED_STATES
from gpupool.spawner.pool.job_states import NEVER_STARTED
from gpupool.spawner.service.leasing.reconcile import SERVER_GONE

USERS = ("alice", "bob", "carol", "dave")
JOBS_USER = job_user()  # a system account (jobs never run as root): its jobs run on this hub's pool
_probes = itertools.count()
FINISHED = {state.value for state in FINISHED_STATES}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("crash-hub")
    # The matrix's job user holds both MIG slices at once (one job ending, one starting): more than the
    # default quota's half of the pool's slices.
    (tmp / "quotas.yaml").write_text("per_user:\n  mig_slices: 2\n")
    for hub in spawner_hub(
        tmp,
        (*USERS, JOBS_USER),
        service_env={"GPUPOOL_RECONCILE_SECONDS": "1", "GPUPOOL_QUOTAS": str(tmp / "quotas.yaml")},
        extra_config=[SERVICE_ROLE],
    ):
        hub.token_for(JOBS_USER)
        yield hub
    clean_home(JOBS_USER)


@pytest.fixture(scope="module")
def all_devices(hub: Hub) -> set[str]:
    """Every whole GPU and MIG slice of the pool: free before the first test starts anything."""
    with hub.admin() as admin:
        return _free_devices(hub, admin)


# ---- helpers ------------------------------------------------------------------------------------------


def _active(hub: Hub, admin: httpx.Client) -> list[dict[str, Any]]:
    response = admin.get(f"{hub.service_api}/leases", params={"active_only": True})
    assert response.status_code == 200, response.text
    leases: list[dict[str, Any]] = response.json()
    return leases


def _settled(hub: Hub, admin: httpx.Client, user: str) -> dict[str, Any] | None:
    """``user``'s server once no start, stop or check is under way: ready, or None."""

    def settled() -> bool:
        server = _server(hub, admin, user)
        return server is None or (bool(server["ready"]) and not server["pending"])

    _wait_for(settled, f"{user}'s server did not settle", hub.log, timeout=40)
    return _server(hub, admin, user)


def _reconciled(hub: Hub, admin: httpx.Client) -> None:
    """Wait for two full reconciliation passes: a probe lease for a server nobody runs is released by the
    second pass that sees it, so every lease that was already a ghost is released by then too."""
    with httpx.Client(headers={"Authorization": f"token {HUB_CLIENT_TOKEN}"}, timeout=20) as hub_client:
        created = hub_client.post(
            f"{hub.service_api}/leases",
            json={
                "profile": "cpu",
                "owner_kind": "server",
                "owner_name": f"probe-{next(_probes)}",
                "user": "dave",
            },
        )
    assert created.status_code == 201, created.text
    probe = created.json()["id"]
    _wait_for(
        lambda: _lease(hub, admin, probe)["state"] == "released",
        "reconciliation did not release the probe lease",
        hub.log,
        timeout=20,
    )
    assert _lease(hub, admin, probe)["release_reason"] == SERVER_GONE


def _environments(command: bytes = b"") -> Iterator[tuple[int, dict[str, str]]]:
    """``(pid, environment)`` of every live process whose command line holds ``command``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if command not in (proc / "cmdline").read_bytes():
                continue
            yield int(proc.name), environ_of(int(proc.name))
        except OSError:
            continue


def _singleuser_leases(hub: Hub) -> dict[int, str]:
    """``{pid: GPUPOOL_LEASE_ID}`` of every single-user server process of this hub, known to it or not."""
    return {
        pid: env.get("GPUPOOL_LEASE_ID", "")
        for pid, env in _environments(b"jupyterhub-singleuser")
        if env.get("HOME", "").startswith(f"{hub.tmp}/homes/")
    }


def _check_pool(hub: Hub, admin: httpx.Client, all_devices: set[str]) -> dict[str, dict[str, Any]]:
    """Assert the invariant (see the module's description); return the active server leases by user."""
    servers = {user: _settled(hub, admin, user) for user in USERS}
    held = {user: s["state"].get("gpupool_lease_id") for user, s in servers.items() if s is not None}
    everything, jobs = _job_leases(hub, admin)
    active = [lease for lease in everything if lease["owner_kind"] == "server"]
    owners = sorted((lease["user"], lease["owner_name"]) for lease in active)
    assert sorted(lease["id"] for lease in active) == sorted(held.values()), (active, held)
    assert owners == sorted((user, "") for user in held), "a server holds two leases, or none"
    uuids = [device["uuid"] for lease in active + jobs for device in lease["devices"]]
    assert len(uuids) == len(set(uuids)), f"a device is in two leases: {active}"
    assert _free_devices(hub, admin) == all_devices - set(uuids)
    processes = _singleuser_leases(hub)
    assert sorted(processes.values()) == sorted(held.values()), (
        f"single-user processes {processes} do not match the servers' leases {held}"
    )
    assert sorted(processes) == sorted(int(s["state"]["pid"]) for s in servers.values() if s is not None)
    return {lease["user"]: lease for lease in active}


def _job_leases(hub: Hub, admin: httpx.Client) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every active lease, and the job leases among them, asserting that each job lease belongs to one live
    job and that a running job's processes see exactly its lease's devices. A job may end between the two
    reads (its lease and its state): the reads are repeated until they agree, or the last pair is judged."""
    for _ in pauses(3.0):
        everything = _active(hub, admin)
        live = {
            job["id"]: job
            for job in admin.get(f"{hub.service_api}/jobs").json()
            if job["state"] in ("queued", "running", "requeued") and job["lease_id"]
        }
        leases = [lease for lease in everything if lease["owner_kind"] == "job"]
        if sorted(lease["owner_name"] for lease in leases) == sorted(live):
            break
    assert sorted(lease["owner_name"] for lease in leases) == sorted(live), (leases, live)
    for lease in leases:
        job = live[lease["owner_name"]]
        seen = _job_devices(job["id"])
        if job["state"] == "running" and seen:
            assert seen == {lease["visible_devices"]}, f"job {job['id']} runs on {seen}, leased {lease}"
    return everything, leases


def _job_devices(job_id: str) -> set[str]:
    """``CUDA_VISIBLE_DEVICES`` of every live process of ``job_id`` (found by its ``GPUPOOL_JOB_ID``)."""
    return {
        env.get("CUDA_VISIBLE_DEVICES", "")
        for _, env in _environments()
        if env.get("GPUPOOL_JOB_ID") == job_id
    }


def _crash(hub: Hub, victim: str) -> None:
    """``kill -9`` the hub, the service or both, and bring back what died as an operator would."""
    if victim in ("service", "both"):
        hub.kill_service()
    if victim in ("hub", "both"):
        hub.crash()
        hub.restart()  # with a new managed service, the old one gone with the hub
    else:
        hub.start_service()


def _job(hub: Hub, script: str) -> dict[str, Any]:
    with hub.as_user(JOBS_USER) as me:
        answer = me.post("/jobs", json={"command": ["sh", "-c", script], "profile": "mig-3g"})
    assert answer.status_code == 201, answer.text
    job: dict[str, Any] = answer.json()
    return job


def _job_now(hub: Hub, admin: httpx.Client, job_id: str) -> dict[str, Any]:
    job: dict[str, Any] = admin.get(f"{hub.service_api}/jobs/{job_id}").json()
    return job


def _queued(hub: Hub, admin: httpx.Client, user: str) -> dict[str, Any]:
    """Wait until ``user`` has a queued lease, and return it."""

    def queued() -> bool:
        return any(lease["user"] == user and lease["state"] == "queued" for lease in _active(hub, admin))

    _wait_for(queued, f"{user}'s lease was not queued", hub.log, timeout=30)
    return next(lease for lease in _active(hub, admin) if lease["user"] == user)


# ---- tests --------------------------------------------------------------------------------------------


def test_a_hub_killed_while_a_server_runs_finds_it_again_with_its_one_lease_and_so_does_the_service(
    hub: Hub, all_devices: set[str]
) -> None:
    with hub.admin() as admin:
        _start(hub, admin, "alice", "mig-3g")
        lease_id = _wait_ready(hub, admin, "alice")["state"]["gpupool_lease_id"]
        devices = _lease(hub, admin, lease_id)["devices"]

        hub.crash()
        assert hub.service_pids(), "the managed service died with the hub"
        hub.restart()
        alice = _settled(hub, admin, "alice")
        assert alice is not None and alice["state"]["gpupool_lease_id"] == lease_id
        _reconciled(hub, admin)
        assert _check_pool(hub, admin, all_devices)["alice"]["devices"] == devices

        hub.kill_service()
        hub.start_service()
        _reconciled(hub, admin)
        assert _check_pool(hub, admin, all_devices)["alice"]["devices"] == devices

        _stop(hub, admin, "alice")
        assert _check_pool(hub, admin, all_devices) == {}
        assert _free_devices(hub, admin) == all_devices


def test_a_hub_killed_mid_spawn_leaves_no_lease_for_a_server_that_does_not_run(
    hub: Hub, all_devices: set[str]
) -> None:
    with hub.admin() as admin:
        _start(hub, admin, "bob", "h100")
        _wait_ready(hub, admin, "bob")
        _start(hub, admin, "carol", "h100")  # waits in the queue for bob's H100
        ghost = _queued(hub, admin, "carol")
        _start(hub, admin, "dave", "mig-3g")  # killed just after the grant, before the server is up

        def granted() -> bool:
            return any(
                lease["user"] == "dave" and lease["state"] == "granted" for lease in _active(hub, admin)
            )

        _wait_for(granted, "dave's lease was not granted", hub.log, timeout=20)
        hub.crash()
        hub.restart()

        # The restarted hub finds carol's spawn gone; she asks again at once, before reconciliation could
        # tell her old lease from her new one, and gets the H100 when bob stops.
        _wait_for(lambda: _server(hub, admin, "carol") is None, "carol's spawn was not dropped", hub.log)
        _start(hub, admin, "carol", "h100")
        _stop(hub, admin, "bob")
        carol = _wait_ready(hub, admin, "carol")
        assert carol["state"]["gpupool_lease_id"] != ghost["id"]
        _reconciled(hub, admin)
        leases = _check_pool(hub, admin, all_devices)
        assert set(leases) <= {"carol", "dave"} and "carol" in leases
        assert _lease(hub, admin, ghost["id"])["state"] == "released"

        for user in ("carol", "dave"):
            if _server(hub, admin, user) is not None:
                _stop(hub, admin, user)
        assert _check_pool(hub, admin, all_devices) == {}


def test_a_killed_service_comes_back_with_every_lease_once_and_a_queued_spawn_goes_on(
    hub: Hub, all_devices: set[str]
) -> None:
    with hub.admin() as admin:
        _start(hub, admin, "alice", "mig-3g")
        _start(hub, admin, "bob", "h100")
        before = {
            user: _wait_ready(hub, admin, user)["state"]["gpupool_lease_id"] for user in ("alice", "bob")
        }
        devices = {user: _lease(hub, admin, lease_id)["devices"] for user, lease_id in before.items()}
        _start(hub, admin, "carol", "h100")
        _queued(hub, admin, "carol")

        hub.kill_service()
        hub.start_service()
        for user, lease_id in before.items():
            lease = _lease(hub, admin, lease_id)
            assert lease["state"] == "granted" and lease["devices"] == devices[user]

        _stop(hub, admin, "bob")
        carol = _settled(hub, admin, "carol")
        if carol is None:  # the spawn gave up while the service was down: nothing of it may remain
            _reconciled(hub, admin)
            assert set(_check_pool(hub, admin, all_devices)) == {"alice"}
            _start(hub, admin, "carol", "h100")
            _wait_ready(hub, admin, "carol")
        _reconciled(hub, admin)
        leases = _check_pool(hub, admin, all_devices)
        assert set(leases) == {"alice", "carol"}
        assert leases["carol"]["devices"] == devices["bob"]

        _stop(hub, admin, "alice")
        _stop(hub, admin, "carol")
        assert _check_pool(hub, admin, all_devices) == {}


def test_a_spawn_started_while_the_service_is_down_waits_for_it(hub: Hub, all_devices: set[str]) -> None:
    with hub.admin() as admin:
        hub.kill_service()
        _start(hub, admin, "alice", "mig-3g")  # the spawner cannot reach the service: it waits
        time.sleep(3)
        assert _server(hub, admin, "alice") is not None  # still starting, not failed
        hub.start_service()
        _wait_ready(hub, admin, "alice")
        assert set(_check_pool(hub, admin, all_devices)) == {"alice"}
        _stop(hub, admin, "alice")
        assert _check_pool(hub, admin, all_devices) == {}


# ---- the kill -9 matrix: the hub, the service or both, each killed once while a server starts, another
# stops, a job starts and another job ends; everything is checked after the restart --------------------------


@pytest.mark.parametrize("victim", ["hub", "service", "both"])
def test_a_crash_as_a_server_stops_and_jobs_start_and_end_loses_and_doubles_nothing(
    hub: Hub, all_devices: set[str], victim: str
) -> None:
    with hub.admin() as admin:
        _start(hub, admin, "bob", "h100")
        _wait_ready(hub, admin, "bob")
        ending = _job(hub, "sleep 1.5; echo done")
        _wait_for(lambda: _job_now(hub, admin, ending["id"])["state"] == "running", "the job to run", hub.log)
        time.sleep(1.2)  # the crash lands as its command ends
        assert admin.delete(f"{hub.hub_api}/users/bob/server").status_code in (202, 204)  # a stop begins
        starting = _job(hub, "sleep 1.5; echo done")  # and a job is about to start
        _start(hub, admin, "carol", "cpu")  # and a spawn is under way
        _crash(hub, victim)

        _check_pool(hub, admin, all_devices)  # each job's lease once, on the devices its processes see
        for job in (ending, starting):
            _wait_for(
                lambda job=job: _job_now(hub, admin, job["id"])["state"] in FINISHED,
                f"job {job['id']} to end",
                hub.log,
                timeout=40,
            )
            done = _job_now(hub, admin, job["id"])
            assert done["state"] == "succeeded", done["history"]
            # Found again after the crash, never run twice: one attempt, besides one the crash may have
            # recorded just before it could start it (requeued as never started, using no retry).
            never_began = [t for t in done["history"] if t["reason"].startswith(NEVER_STARTED)]
            assert done["attempts"] == 1 + len(never_began), done["history"]
            with hub.as_user(JOBS_USER) as me:
                assert me.get(f"/jobs/{job['id']}/logs").text == "done\n"
        _reconciled(hub, admin)
        # The hub may have died before the stop took (bob runs on, leased) or before the spawn's server was
        # up (carol's spawn dropped): either way each server that runs holds one lease, and no other is held.
        running = {user for user in ("bob", "carol") if _settled(hub, admin, user) is not None}
        assert set(_check_pool(hub, admin, all_devices)) == running
        for user in running:
            _stop(hub, admin, user)
        assert _check_pool(hub, admin, all_devices) == {}
        assert _free_devices(hub, admin) == all_devices
