"""Reconciliation against a real JupyterHub, its proxy, the gpupool service and a spawned JupyterLab.

The hub is the one of ``test_local_spawner`` (same config and pool), with the role the embedded hub gives the
service (``list:users``, ``read:servers``) and a one-second ``GPUPOOL_RECONCILE_SECONDS``, so the running
service's loop is watched through its API. ``reconcile_once`` is also called directly, against the same hub,
with a manager of its own over a store in tmp: that is where unleased servers and ``stop_unleased`` show.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hub_harness import SERVICE
from job_user import job_user
from test_local_spawner import (
    ADMIN_TOKEN,
    HUB_CLIENT_TOKEN,
    Hub,
    _job,
    _lease,
    _server,
    _start,
    _wait_for,
    _wait_ready,
    spawner_hub,
)

from gpupool.spawner.backends.discovery import discover_pool
from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES, load_profiles
from gpupool.spawner.pool.leases import LeaseState
from gpupool.spawner.pool.profiles import find_profile
from gpupool.spawner.service.leasing.group_names import warn_of_unknown_groups
from gpupool.spawner.service.leasing.lease_manager import LeaseManager
from gpupool.spawner.service.leasing.reconcile import SERVER_GONE, HubClient, ReconcileReport, reconcile_once
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url

INTERVAL = 1.0
SERVICE_ROLE = f"""
c.JupyterHub.load_roles.append(
    {{"name": "gpupool-service", "scopes": ["list:users", "read:servers", "list:groups"], "services": ["{SERVICE}"]}}
)
c.JupyterHub.load_groups = {{"students": {{"users": []}}}}
"""
# students is a group of the hub's; studnets, the course's trial's typo, is not
QUOTAS = (
    "per_group:\n  students: {gpu_shares: 0}\n  studnets: {gpu_shares: 0}\nusers:\n  erin: {mig_slices: 1}\n"
)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("reconcile-hub")
    (tmp / "quotas.yaml").write_text(QUOTAS)
    yield from spawner_hub(
        tmp,
        ("alice", "dave"),
        service_env={"GPUPOOL_RECONCILE_SECONDS": str(INTERVAL), "GPUPOOL_QUOTAS": str(tmp / "quotas.yaml")},
        extra_config=[SERVICE_ROLE],
    )


def _running_alice(hub: Hub, admin: httpx.Client) -> str:
    """alice's default server running mig-3g (started when it is not): its lease id."""
    server = _server(hub, admin, "alice")
    if not (server and server["ready"]):
        _start(hub, admin, "alice", "mig-3g")
        server = _wait_ready(hub, admin, "alice")
    lease_id: str = server["state"]["gpupool_lease_id"]
    return lease_id


def test_a_lease_whose_server_does_not_run_is_released_after_two_passes(hub: Hub) -> None:
    hub_client = httpx.Client(headers={"Authorization": f"token {HUB_CLIENT_TOKEN}"}, timeout=20)
    with hub_client, hub.admin() as admin:
        created = hub_client.post(
            f"{hub.service_api}/leases",
            json={"profile": "mig-3g", "owner_kind": "server", "owner_name": "ghost", "user": "dave"},
        )
        assert created.status_code == 201, created.text
        lease_id = created.json()["id"]
        assert created.json()["state"] == "granted"
        asked = time.monotonic()

        _wait_for(
            lambda: _lease(hub, admin, lease_id)["state"] == "released",
            "the ghost server's lease was not released",
            hub.log,
            timeout=10 * INTERVAL,
        )
        assert time.monotonic() - asked > 0.8 * INTERVAL  # not on the first pass that saw it
        assert _lease(hub, admin, lease_id)["release_reason"] == SERVER_GONE


def test_a_running_server_keeps_its_lease_across_passes(hub: Hub) -> None:
    with hub.admin() as admin:
        lease_id = _running_alice(hub, admin)
        time.sleep(3.5 * INTERVAL)  # three passes or more
        assert _lease(hub, admin, lease_id)["state"] == "granted"
        assert _server(hub, admin, "alice")["ready"]  # type: ignore[index]


def test_reconcile_once_against_the_hub_reports_and_on_request_stops_an_unleased_server(
    hub: Hub, tmp_path: Path
) -> None:
    with hub.admin() as admin:
        service_lease = _running_alice(hub, admin)
    # A manager over a store of its own: alice's lease is not in it, so her server runs unleased here.
    store = LeaseStore(sqlite_url(str(tmp_path / "leases.sqlite")))
    manager = LeaseManager(discover_pool(str(hub.tmp / "pool.yaml")).nodes, store)
    profile = find_profile(load_profiles(EXAMPLE_PROFILES), "mig-3g")
    ghost = manager.request_lease("dave", (), "server", "ghost", profile.slug, profile.request())
    job = manager.request_lease("dave", (), "job", "train", profile.slug, profile.request())

    async def run() -> list[ReconcileReport]:
        hub_api = HubClient(f"{hub.hub_api}", ADMIN_TOKEN)
        try:
            first = await reconcile_once(manager, hub_api)
            second = await reconcile_once(manager, hub_api, previous=first)
            third = await reconcile_once(manager, hub_api, previous=second, stop_unleased=True)
            return [first, second, third]
        finally:
            await hub_api.aclose()

    first, second, third = asyncio.run(run())
    assert first.released == () and first.suspects == {ghost.id}
    assert [lease.id for lease in second.released] == [ghost.id] and second.suspects == frozenset()
    assert manager.get(ghost.id).release_reason == SERVER_GONE
    assert manager.get(job.id).state is LeaseState.GRANTED

    for report in (first, second):
        assert [(s.user, s.name, s.profile) for s in report.unleased] == [("alice", "", "mig-3g")]
        assert report.stopped == ()
    assert [s.key for s in third.stopped] == [("alice", "")]
    with hub.admin() as admin:
        _wait_for(lambda: _server(hub, admin, "alice") is None, "alice's server was not stopped", hub.log)
        assert _lease(hub, admin, service_lease)["state"] == "released"  # the spawner gave it back
    store.close()


def test_a_group_the_quotas_file_names_and_the_hub_lacks_is_warned_of_once_the_hub_answers(hub: Hub) -> None:
    """A course's trial: with ``studnets:`` in the quotas file the hub started without a word, and the students
    quietly lost their group's limits."""
    typo = "the quotas file limits group studnets, which is not a JupyterHub group (yet?): a misspelling?"
    _wait_for(lambda: typo in hub.log.read_text(errors="replace"), "the warning of the typo", hub.log)
    assert "limits group students," not in hub.log.read_text(errors="replace")  # the hub has that one


def test_an_edited_quotas_file_is_in_force_within_seconds_and_a_broken_edit_changes_nothing(hub: Hub) -> None:
    """A course's trial edited the quotas file under a running hub: after 90 s nothing had changed, and
    nothing said a restart was needed."""
    quotas = hub.tmp / "quotas.yaml"

    def erins_quota() -> str:
        with hub.admin() as admin:
            answer = admin.get(f"{hub.service_api}/quota", params={"user": "erin"})
        assert answer.status_code == 200, answer.text
        return str(answer.json()["summary"])

    assert erins_quota() == "erin's quota: 1 MIG slice, 0 held or queued"
    try:
        edit = QUOTAS.replace("erin: {mig_slices: 1}", "erin: {mig_slices: 3}")
        quotas.write_text(edit.replace("per_group:\n", "per_group:\n  tutros: {whole_gpus: 2}\n"))
        _wait_for(
            lambda: erins_quota() == "erin's quota: 3 MIG slices, 0 held or queued", "the new limit", hub.log
        )
        typo = "the quotas file limits group tutros, which is not a JupyterHub group (yet?): a misspelling?"
        _wait_for(
            lambda: typo in hub.log.read_text(errors="replace"), "the edit's new typo warned of", hub.log
        )
        quotas.write_text(QUOTAS.replace("erin: {mig_slices: 1}", "erin: {mig_slice: 1}"))
        said = "users.erin: unknown field 'mig_slice' (did you mean 'mig_slices'?)"
        _wait_for(lambda: said in hub.log.read_text(errors="replace"), "the broken edit logged", hub.log)
        assert erins_quota() == "erin's quota: 3 MIG slices, 0 held or queued"  # the limits before it stay
    finally:
        quotas.write_text(QUOTAS)
    _wait_for(
        lambda: erins_quota() == "erin's quota: 1 MIG slice, 0 held or queued", "the file as it was", hub.log
    )


def test_without_list_groups_the_check_is_left_out_in_a_line(
    hub: Hub, caplog: pytest.LogCaptureFixture
) -> None:
    """A hub whose role for the service predates list:groups (a Zero to JupyterHub values file, say)."""
    client = HubClient(hub.hub_api, HUB_CLIENT_TOKEN)  # the spawners' token: no list:groups

    async def check() -> None:
        try:
            await asyncio.wait_for(warn_of_unknown_groups(client, {"studnets": "the quotas file"}), 30)
        finally:
            await client.aclose()

    with caplog.at_level(logging.INFO):
        asyncio.run(check())
    assert "group names not checked: the service's token may not list the hub's groups" in caplog.text


def test_an_empty_store_under_running_servers_asks_whether_it_was_changed_without_a_copy(
    hub: Hub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lab's trial pointed GPUPOOL_DB_URL at a new database and forgot `gpupool store copy`: the service
    started on an empty store and said only that each server ran without a lease."""
    with hub.admin() as admin:
        _running_alice(hub, admin)
    store = LeaseStore(sqlite_url(str(tmp_path / "new.sqlite")))
    manager = LeaseManager(discover_pool(str(hub.tmp / "pool.yaml")).nodes, store)

    async def two_passes() -> None:
        client = HubClient(hub.hub_api, ADMIN_TOKEN)
        try:
            first = await reconcile_once(manager, client)
            await reconcile_once(manager, client, previous=first)
        finally:
            await client.aclose()

    with caplog.at_level(logging.WARNING):
        asyncio.run(two_passes())
    store.close()
    hint = "was GPUPOOL_DB_URL changed without `gpupool store copy`?"
    assert caplog.text.count(hint) == 1, caplog.text  # said once, not at every pass


def test_a_pass_hands_on_a_user_gone_from_the_hub_the_second_time_and_nobody_when_every_holder_is_gone(
    hub: Hub, tmp_path: Path
) -> None:
    """Holders of leases whom the hub does not have are retired on the second pass that finds them gone, never on
    the first; a hub that has none of the holders (its database replaced) retires nobody (from a review)."""
    store = LeaseStore(sqlite_url(str(tmp_path / "leases.sqlite")))
    manager = LeaseManager(discover_pool(str(hub.tmp / "pool.yaml")).nodes, store)
    profile = find_profile(load_profiles(EXAMPLE_PROFILES), "cpu")
    retired: list[str] = []

    async def retire(user: str, before: float) -> None:
        assert before <= time.time()
        retired.append(user)

    async def passes(count: int) -> None:
        client = HubClient(hub.hub_api, ADMIN_TOKEN)
        try:
            report = None
            for _ in range(count):
                report = await reconcile_once(manager, client, previous=report, retire_missing=retire)
                retired.append("|")  # where each pass ended
        finally:
            await client.aclose()

    for user in ("dave", "ghost-user"):  # dave is the hub's, ghost-user never was
        manager.request_lease(user, (), "job", f"train-{user}", profile.slug, profile.request())
    asyncio.run(passes(3))
    assert retired == ["|", "ghost-user", "|", "ghost-user", "|"]
    manager.request_lease("other-ghost", (), "job", "train", profile.slug, profile.request())
    for lease in manager.leases_for("dave", active_only=True):
        manager.release(lease.id, "the test")
    retired.clear()
    asyncio.run(passes(2))  # ghost-user and other-ghost: every holder gone
    assert retired == ["|", "|"]
    store.close()


def test_a_user_the_hub_deleted_without_asking_the_service_has_their_jobs_ended(hub: Hub) -> None:
    """Left over from the last review: the hub asks the service to retire a deleted user, and asks again while
    it does not answer, but a hub restarted meanwhile forgets to (and ``delete_invalid_users`` never asks): the
    user's jobs ran on, for whoever was given the name next. Reconciliation now retires a user who holds leases
    and whom the hub has not had for two passes. The module's last test: it kills the service and the hub."""
    user = job_user()  # the service runs jobs as root, so only as a user's own account
    hub.create_user(user)
    hub.token_for(user)
    with hub.admin() as admin, hub.as_user(user) as them:
        made = them.post("/jobs", json={"command": ["sleep", "600"], "profile": "cpu"})
        assert made.status_code == 201, made.text
        job_id = made.json()["id"]
        _wait_for(lambda: _job(hub, admin, job_id)["state"] == "running", "their job to run", hub.log)
        hub.kill_service()
        assert admin.delete(f"{hub.hub_api}/users/{user}", timeout=60).status_code == 204
        assert f"deleting {user}: asking the service again every 10 s" in hub.log.read_text()
        hub.crash()  # before it asks again: the hub that comes back knows nothing of the deletion
        hub.restart()
        _wait_for(
            lambda: str(_job(hub, admin, job_id).get("user")).startswith(f"{user}/deleted "),
            "the job of the user the hub no longer has to end and be filed away",
            hub.log,
            timeout=60,
        )
        ended = _job(hub, admin, job_id)
        assert ended["state"] == "cancelled", ended
        assert ended["reason"] == "cancelled by the service: the hub no longer has the user", ended
