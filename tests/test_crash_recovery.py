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

from gpupool.spawner.service.leasing.reconcile import SERVER_GONE

USERS = ("alice", "bob", "carol", "dave")
_probes = itertools.count()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    yield from spawner_hub(
        tmp_path_factory.mktemp("crash-hub"),
        USERS,
        service_env={"GPUPOOL_RECONCILE_SECONDS": "1"},
        extra_config=[SERVICE_ROLE],
    )


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


def _singleuser_leases(hub: Hub) -> dict[int, str]:
    """``{pid: GPUPOOL_LEASE_ID}`` of every single-user server process of this hub, known to it or not."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"jupyterhub-singleuser" not in (proc / "cmdline").read_bytes():
                continue
            env = environ_of(int(proc.name))
        except OSError:
            continue
        if env.get("HOME", "").startswith(f"{hub.tmp}/homes/"):
            found[int(proc.name)] = env.get("GPUPOOL_LEASE_ID", "")
    return found


def _check_pool(hub: Hub, admin: httpx.Client, all_devices: set[str]) -> dict[str, dict[str, Any]]:
    """Assert the invariant (see the module's description); return the active leases by user."""
    servers = {user: _settled(hub, admin, user) for user in USERS}
    held = {user: s["state"].get("gpupool_lease_id") for user, s in servers.items() if s is not None}
    active = _active(hub, admin)
    owners = sorted((lease["user"], lease["owner_name"]) for lease in active)
    assert sorted(lease["id"] for lease in active) == sorted(held.values()), (active, held)
    assert owners == sorted((user, "") for user in held), "a server holds two leases, or none"
    uuids = [device["uuid"] for lease in active for device in lease["devices"]]
    assert len(uuids) == len(set(uuids)), f"a device is in two leases: {active}"
    assert _free_devices(hub, admin) == all_devices - set(uuids)
    processes = _singleuser_leases(hub)
    assert sorted(processes.values()) == sorted(held.values()), (
        f"single-user processes {processes} do not match the servers' leases {held}"
    )
    assert sorted(processes) == sorted(int(s["state"]["pid"]) for s in servers.values() if s is not None)
    return {lease["user"]: lease for lease in active}


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
