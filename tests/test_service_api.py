"""The gpupool service's HTTP API, through a real JupyterHub, its proxy and hub-issued tokens.

One hub for the module: JupyterHub (DummyAuthenticator, sqlite in tmp), configurable-http-proxy from
``.node/`` (``make test`` installs it), and the service as a managed JupyterHub service on the demo pool.
Users and their tokens are made through the hub's REST API with an admin service token from the config.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hub_harness import SERVICE, RunningHub, free_ports, service_command, write_hub_config
from polling import until
from prometheus_client.parser import text_string_to_metric_families

from gpupool.spawner.backends.simulated import DEMO_POOL

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
HUB_CLIENT_TOKEN = "test-hub-client-token-0123456789abcdef"
Hub = RunningHub


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("hub")
    ports = free_ports()
    quotas = tmp / "quotas.yaml"
    quotas.write_text("users:\n  carol: {mig_slices: 1}\n  dora: {mig_slices: 0}\n")  # nobody else is limited
    service_env = {
        "GPUPOOL_POOL": str(DEMO_POOL),
        "GPUPOOL_DB_URL": f"sqlite:///{tmp}/gpupool.sqlite",
        "GPUPOOL_QUOTAS": str(quotas),
        "GPUPOOL_RECONCILE_SECONDS": "0",  # the leases made here have no servers: reconciliation would end them
    }
    write_hub_config(
        tmp,
        ports,
        admin_token=ADMIN_TOKEN,
        pool_file=DEMO_POOL,
        hub_client_token=HUB_CLIENT_TOKEN,
        service_env=service_env,
        extra_config=[POOL_ADMIN_AND_SERVICE_ROLES],
    )
    with RunningHub(tmp, ports, ADMIN_TOKEN, service_env=service_env, fail=pytest.fail) as hub:
        hub.tokens["hub-client"] = HUB_CLIENT_TOKEN
        for name in ("alice", "bob", "carol", "dora"):
            hub.create_user(name)
            hub.token_for(name)
        hub.token_for("erin")  # made by her role
        yield hub


# erin is a person with gpupool's admin scope; the service may ask the hub whether a user exists (read:servers)
POOL_ADMIN_AND_SERVICE_ROLES = """
c.JupyterHub.load_roles.append({"name": "pool-admins", "scopes": ["custom:gpupool:admin"], "users": ["erin"]})
c.JupyterHub.load_roles.append({"name": "gpupool-service", "scopes": ["read:servers"], "services": ["gpupool"]})
"""


def _mig_instance(pool: dict[str, Any], uuid: str) -> dict[str, Any]:
    return next(m for n in pool["nodes"] for g in n["gpus"] for m in g["mig"] if m["uuid"] == uuid)


def _new_lease(hub: Hub, user: str, profile: str = "mig-3g", **body: Any) -> dict[str, Any]:
    """A lease for ``user``'s server, made as the hub's spawner makes it (users cannot make leases)."""
    with hub.as_user("hub-client") as spawner:
        response = spawner.post(
            "/leases",
            json={"profile": profile, "owner_kind": "server", "owner_name": "", "user": user} | body,
        )
    assert response.status_code == 201, response.text
    lease: dict[str, Any] = response.json()
    return lease


def _release(hub: Hub, lease: dict[str, Any]) -> None:
    """Give ``lease`` back as the hub's spawner does when its server stops (users cannot release leases)."""
    with hub.as_user("hub-client") as spawner:
        response = spawner.delete(f"/leases/{lease['id']}")
    assert response.status_code == 200, response.text


def test_the_openapi_document_loads_through_the_proxy(hub: Hub) -> None:
    document = httpx.get(f"{hub.service_api}/openapi.json", timeout=10).json()
    paths = set(document["paths"])
    prefix = f"/services/{SERVICE}/api/v1"
    assert {
        f"{prefix}/pool",
        f"{prefix}/profiles",
        f"{prefix}/leases",
        f"{prefix}/leases/{{lease_id}}",
    } <= paths


def test_a_request_without_a_token_is_401_and_a_bad_token_403(hub: Hub) -> None:
    missing = httpx.get(f"{hub.service_api}/pool", timeout=10)
    assert missing.status_code == 401
    assert "Authorization: token" in missing.json()["detail"]
    bad = httpx.get(f"{hub.service_api}/pool", headers={"Authorization": "Bearer not-a-token"}, timeout=10)
    assert bad.status_code == 403
    assert "does not accept this token" in bad.json()["detail"]


def test_the_metrics_page_parses_and_matches_the_pool_and_its_leases(hub: Hub) -> None:
    with hub.as_user("alice") as alice, hub.as_user("admin") as admin:
        lease = _new_lease(hub, "alice")
        url = f"{hub.url}/services/gpupool/metrics"
        assert httpx.get(url, headers=alice.headers, timeout=10).status_code == 403  # admins only
        page = httpx.get(url, headers=admin.headers, timeout=10)
        assert page.status_code == 200, page.text
        families = {f.name: f for f in text_string_to_metric_families(page.text)}
        granted = [
            x for x in admin.get("/leases", params={"active_only": "true"}).json() if x["state"] == "granted"
        ]
        leases = {s.labels["state"]: s.value for s in families["gpupool_leases"].samples}
        assert leases["granted"] == len(granted)
        pool = admin.get("/pool").json()
        totals = {
            s.labels["device"]: s.value
            for s in families["gpupool_gpu_memory_total_bytes"].samples
            if not s.labels.get("mig_profile")
        }
        for gpu in (g for n in pool["nodes"] for g in n["gpus"]):
            if gpu["uuid"] in totals:
                assert totals[gpu["uuid"]] == gpu["memory_mib"] * 2**20
        assert totals, "the sampler has not reported any GPU yet"
        _release(hub, lease)

    def quota_refusals() -> float:
        page = httpx.get(url, headers={"Authorization": f"token {ADMIN_TOKEN}"}, timeout=10).text
        (family,) = (
            f for f in text_string_to_metric_families(page) if f.name == "gpupool_placement_refusals"
        )
        return next(s.value for s in family.samples if s.labels["reason"] == "quota")

    before = quota_refusals()
    with hub.as_user("hub-client") as spawner:
        held = _new_lease(hub, "carol", "mig-1g")
        body = {"profile": "mig-1g", "owner_kind": "server", "owner_name": "second", "user": "carol"}
        assert spawner.post("/leases", json=body).status_code == 403
        _release(hub, held)
    assert quota_refusals() == before + 1


def test_the_pool_says_it_is_simulated(hub: Hub) -> None:
    with hub.as_user("alice") as alice:
        pool = alice.get("/pool").json()
    assert pool["backend"] == "simulated"
    assert pool["summary"]["mig_slices_free"]


def test_alice_sees_the_profiles_she_may_use_with_availability(hub: Hub) -> None:
    with hub.as_user("alice") as alice:
        response = alice.get("/profiles")
    assert response.status_code == 200, response.text
    profiles = {p["slug"]: p for p in response.json()}
    assert "mig-3g" in profiles and "cpu" in profiles
    assert "h100-x4" not in profiles  # only for the training group
    assert profiles["mig-3g"]["available_now"] >= 1
    assert profiles["mig-3g"]["queued"] == 0


def test_alice_gets_a_mig_slice_and_releasing_it_returns_the_capacity(hub: Hub) -> None:
    with hub.as_user("alice") as alice:
        lease = _new_lease(hub, "alice")
        assert lease["state"] == "granted" and lease["user"] == "alice"
        (device,) = lease["devices"]
        assert device["uuid"].startswith("MIG-") and lease["visible_devices"] == device["uuid"]
        assert not _mig_instance(alice.get("/pool").json(), device["uuid"])["free"]
        assert lease["id"] in {mine["id"] for mine in alice.get("/leases").json()}

        # a trial freed her running server's slice this way, and it went to another user's job meanwhile
        kept = alice.delete(f"/leases/{lease['id']}")
        assert kept.status_code == 409 and "stop the server" in kept.json()["detail"], kept.text
        assert not _mig_instance(alice.get("/pool").json(), device["uuid"])["free"]

        with hub.as_user("hub-client") as spawner:  # as when her server stops
            released = spawner.delete(f"/leases/{lease['id']}")
        assert released.status_code == 200, released.text
        assert released.json()["state"] == "released"
        assert _mig_instance(alice.get("/pool").json(), device["uuid"])["free"]
        again = alice.delete(f"/leases/{lease['id']}")  # a released lease: releasing it again changes nothing
        assert again.status_code == 200 and again.json()["state"] == "released"


def test_bob_can_neither_see_nor_release_alices_lease(hub: Hub) -> None:
    with hub.as_user("alice") as alice, hub.as_user("bob") as bob:
        lease = _new_lease(hub, "alice")
        peeks = (
            f"/leases/{lease['id']}",
            f"/leases/{lease['id']}/resources",
            f"/activity/leases/{lease['id']}",
        )
        for refused in (*(bob.get(peek) for peek in peeks), bob.delete(f"/leases/{lease['id']}")):
            assert refused.status_code == 403, refused.text
            assert "alice" not in refused.text  # whose it is stays private
        assert bob.get("/leases/no-such-lease").status_code == 404
        assert lease["id"] not in {theirs["id"] for theirs in bob.get("/leases").json()}
        assert alice.get(f"/leases/{lease['id']}").json()["state"] == "granted"
    _release(hub, lease)


def test_only_the_hubs_spawners_make_leases(hub: Hub) -> None:
    # a lease a user made for no server would hold its GPU until reconciliation found it out
    with hub.as_user("bob") as bob, hub.as_user("hub-client") as spawner, hub.as_user("admin") as admin:
        for body in ({}, {"user": "alice"}, {"user": "bob"}):
            refused = bob.post(
                "/leases", json={"profile": "cpu", "owner_kind": "server", "owner_name": ""} | body
            )
            assert refused.status_code == 403, refused.text
            assert "user bob may not make leases" in refused.json()["detail"]
        nameless = spawner.post("/leases", json={"profile": "cpu", "owner_kind": "server", "owner_name": ""})
        assert nameless.status_code == 400 and nameless.json()["fields"] == ["user"]
        lease = _new_lease(hub, "alice", "cpu", owner_name="gpu")
        assert lease["user"] == "alice"
        assert lease["id"] in {every["id"] for every in admin.get("/leases").json()}
        alices = spawner.get("/leases", params={"user": "alice", "active_only": "true"}).json()
        assert lease["id"] in {hers["id"] for hers in alices} and {hers["user"] for hers in alices} == {
            "alice"
        }
        peek = bob.get("/leases", params={"user": "alice"})
        assert peek.status_code == 403 and peek.json()["fields"] == ["user"]
        assert spawner.delete(f"/leases/{lease['id']}").status_code == 200


def test_a_quota_from_the_quotas_file_refuses_with_the_limit_named(hub: Hub) -> None:
    with hub.as_user("hub-client") as spawner:
        first = _new_lease(hub, "carol", "mig-1g")
        refused = spawner.post(
            "/leases", json={"profile": "mig-3g", "owner_kind": "server", "owner_name": "b", "user": "carol"}
        )
        assert refused.status_code == 403, refused.text
        problem = refused.json()
        assert problem["error"] == "quota_exceeded"
        assert "carol's quota allows 1 MIG slice at once" in problem["detail"], problem["detail"]
        _release(hub, first)
        _new_lease(hub, "carol", "mig-3g")  # with the first one given back, the second fits the quota


def test_an_unknown_profile_is_a_400_listing_the_slugs_the_user_may_use(hub: Hub) -> None:
    lease = {"profile": "nope", "owner_kind": "server", "owner_name": ""}
    with hub.as_user("hub-client") as spawner:
        response = spawner.post("/leases", json=lease | {"user": "alice"})
        for_a_trainer = spawner.post("/leases", json=lease | {"user": "tess", "groups": ["training"]})
    with hub.as_user("alice") as alice:
        submitted = alice.post("/jobs", json={"profile": "nope", "command": ["true"]})
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "unknown_profile" and body["fields"] == ["profile"]
    assert "mig-3g" in body["detail"] and "cpu" in body["detail"]
    # h100-x4 is the training group's: alice is offered only what she could use (it listed every profile)
    assert "h100-x4" not in body["detail"] and "h100-x4" not in submitted.json()["detail"], submitted.text
    assert submitted.status_code == 400 and "mig-3g" in submitted.json()["detail"]
    assert for_a_trainer.status_code == 400 and "h100-x4" in for_a_trainer.json()["detail"]


def test_a_bad_body_names_the_field(hub: Hub) -> None:
    with hub.as_user("hub-client") as spawner:
        lease = {"profile": "cpu", "user": "alice"}
        response = spawner.post("/leases", json=lease | {"owner_kind": "vm", "owner_name": ""})
        missing = spawner.post("/leases", json=lease | {"owner_kind": "server"})
    assert response.status_code == 400
    assert response.json()["fields"] == ["owner_kind"]
    assert response.json()["detail"].startswith("owner_kind:")
    assert missing.status_code == 400 and missing.json()["fields"] == ["owner_name"]


def test_a_second_service_on_the_taken_port_stops_before_it_opens_a_store(hub: Hub) -> None:
    elsewhere = hub.tmp / "second-service.sqlite"
    second = subprocess.run(
        service_command(),
        env=os.environ | hub.service_env | {"GPUPOOL_DB_URL": f"sqlite:///{elsewhere}"},
        cwd=hub.tmp,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode != 0
    assert "is another gpupool service running there?" in second.stderr, second.stderr
    assert not elsewhere.exists()  # it never opened (or created) a lease store
    assert (
        httpx.get(f"{hub.service_api}/openapi.json", timeout=5).status_code == 200
    )  # the first one serves on


def test_a_restarted_service_still_knows_alices_lease(hub: Hub) -> None:
    """Runs last: the hub restarts a dead managed service only on its 30 s poll, so start one ourselves."""
    with hub.as_user("alice") as alice:
        lease = _new_lease(hub, "alice")
        hub.kill_service()
        hub.start_service()

        again = alice.get(f"/leases/{lease['id']}")
        assert again.status_code == 200, again.text
        assert again.json()["state"] == "granted" and again.json()["devices"] == lease["devices"]
        (device,) = lease["devices"]
        assert not _mig_instance(alice.get("/pool").json(), device["uuid"])["free"]


def test_a_deleted_users_last_minutes_on_a_gpu_are_filed_with_their_records(hub: Hub) -> None:
    """From a review: the minute a deleted user's server was still running in closed after their records were
    filed away, and was stored under their name, as usage of whoever is given the name next."""
    until(lambda: time.time() % 60 < 40, "a minute with 20 s left", timeout=30)  # held within one minute
    lease = _new_lease(hub, "fay", "h100")
    held_from = time.time()
    time.sleep(6)
    with hub.as_user("hub-client") as spawner:
        filed = spawner.delete("/users/fay").json()["records_filed_as"]
        held_s = time.time() - held_from
        usage = spawner.get("/usage", params={"user": filed}).json()
        assert [(row["profile"], row["user"]) for row in usage] == [("h100", filed)], usage
        assert usage[0]["gpu_hours_held"] * 3600 > held_s - 4, (usage, held_s)
        assert spawner.get("/usage", params={"user": "fay"}).json() == []
    assert lease["user"] == "fay"


def test_usage_is_each_users_own_and_admins_see_everyone(hub: Hub) -> None:
    with hub.as_user("bob") as bob, hub.as_user("admin") as admin:
        assert bob.get("/usage").status_code == 200
        peek = bob.get("/usage", params={"user": "alice"})
        assert peek.status_code == 403 and peek.json()["fields"] == ["user"]
        assert admin.get("/usage", params={"user": "alice"}).status_code == 200
        backwards = admin.get("/usage", params={"since": 10, "until": 5})
        assert backwards.status_code == 400 and "since" in backwards.json()["detail"]
        # an admin's trial asked for last week as since=2026-12-01 and got "Input should be a valid number"
        by_date = admin.get("/usage", params={"since": "2026-12-01", "until": "2026-12-08T00:00"})
        by_seconds = admin.get("/usage", params={"since": 1796083200, "until": 1796688000})
        assert by_date.status_code == 200 and by_date.json() == by_seconds.json(), by_date.text
        a_second_late = admin.get("/usage", params={"since": "2026-12-01T00:00:01", "until": 1796083201})
        assert a_second_late.status_code == 400, a_second_late.text  # the date is that instant, in UTC
        typo = admin.get("/usage", params={"since": "2026-13-01"})
        assert typo.status_code == 400 and typo.json()["fields"] == ["since"], typo.text
    with hub.as_user("hub-client") as spawners:  # gpupool up's state-folder token, as for leases
        assert spawners.get("/usage", params={"user": "alice"}).status_code == 200


def test_an_admin_asking_about_a_user_the_hub_does_not_have_is_told_so(hub: Hub) -> None:
    """An admin trial: `gpupool usage --user` with a misspelt name answered "no GPU-hours held in this span", as
    for a user who used nothing; so did jobs, leases, culls and warnings."""
    with hub.as_user("erin") as erin:
        for path in ("/usage", "/jobs", "/leases", "/culls", "/warnings"):
            typo = erin.get(path, params={"user": "dorra"})
            assert typo.status_code == 404 and typo.json()["fields"] == ["user"], (path, typo.text)
            assert typo.json()["detail"] == "user: the hub has no user 'dorra'", typo.text
            assert erin.get(path, params={"user": "dora"}).json() == [], path  # she has used nothing yet
    with hub.as_user("bob") as bob:  # not an admin: refused, as before, without saying whether dorra exists
        assert bob.get("/usage", params={"user": "dorra"}).status_code == 403


def test_the_quota_says_what_carol_may_hold_and_what_she_holds(hub: Hub) -> None:
    """Finding 6 of the researcher's-day review: nothing showed a user their quota or what they held."""
    with hub.as_user("hub-client") as spawner:  # what earlier tests left carol holding goes back first
        for left in spawner.get("/leases", params={"user": "carol", "active_only": True}).json():
            assert spawner.delete(f"/leases/{left['id']}").status_code == 200
    lease = _new_lease(hub, "carol", "mig-1g")
    with hub.as_user("carol") as carol, hub.as_user("bob") as bob, hub.as_user("hub-client") as spawner:
        mine = carol.get("/quota").json()
        assert mine["summary"] == "Your quota: 1 MIG slice, 1 held or queued", mine
        assert [(q["resource"], q["limit"], q["held"]) for q in mine["limits"]] == [("mig_slices", 1, 1)]
        assert bob.get("/quota", params={"user": "carol"}).status_code == 403
        assert spawner.get("/quota", params={"user": "carol"}).json()["summary"] == mine["summary"]
        with hub.admin() as admin:  # a hostile user's trial: the admin read carol's as "Your quota"
            theirs = admin.get(f"{hub.service_api}/quota", params={"user": "carol"}).json()["summary"]
        assert theirs == "carol's quota: 1 MIG slice, 1 held or queued", theirs
        assert bob.get("/quota").json()["summary"] == "Your quota: no limits"
        _release(hub, lease)
        assert carol.get("/quota").json()["summary"] == "Your quota: 1 MIG slice, 0 held or queued"


def test_profiles_say_what_carols_quota_refuses_now_with_the_limit_named(hub: Hub) -> None:
    """Stop 34 left this alone: with her one MIG slice held, carol's form still said "2 could start now" for
    mig-3g, and the start was then refused for her quota (the form itself: ``test_local_spawner``)."""
    with hub.as_user("hub-client") as spawner:  # what earlier tests left carol holding goes back first
        for left in spawner.get("/leases", params={"user": "carol", "active_only": True}).json():
            assert spawner.delete(f"/leases/{left['id']}").status_code == 200
    lease = _new_lease(hub, "carol", "mig-1g")
    with hub.as_user("carol") as carol, hub.as_user("bob") as bob:
        mine = {p["slug"]: p for p in carol.get("/profiles").json()}
        said = "carol's quota allows 1 MIG slice at once; 1 is held or queued and 1 more was asked for"
        assert mine["mig-3g"]["over_quota"] == said and mine["mig-3g"]["available_now"] > 0
        assert mine["h100"]["over_quota"] is None  # her quota limits MIG slices only
        assert all(p["over_quota"] is None for p in bob.get("/profiles").json())
        assert bob.get("/profiles", params={"user": "carol"}).status_code == 403
    _release(hub, lease)
    with hub.as_user("carol") as carol, hub.as_user("dora") as dora:
        assert {p["slug"]: p for p in carol.get("/profiles").json()}["mig-3g"]["over_quota"] is None
        # the review: a quota of 0 is no quota "in use": nothing dora stops would let her start it
        hers = {p["slug"]: p for p in dora.get("/profiles").json()}["mig-3g"]
        assert hers["over_quota"] is None and hers["quota_forbids"].startswith(
            "dora's quota allows no MIG slices"
        )


def test_a_walltime_is_kept_with_the_lease_and_one_past_the_profiles_lifetime_is_refused(hub: Hub) -> None:
    with hub.as_user("hub-client") as spawner:
        too_long = spawner.post(
            "/leases",
            json={
                "profile": "cpu",
                "owner_kind": "server",
                "owner_name": "w",
                "user": "alice",
                "walltime": 1e9,
            },
        )
        assert too_long.status_code == 400 and too_long.json()["fields"] == ["walltime"], too_long.text
        lease = _new_lease(hub, "alice", "cpu", owner_name="w", walltime=3600)
        assert lease["request"]["seconds"] == 3600
        profiles = {p["slug"]: p for p in spawner.get("/profiles").json()}
        assert profiles["h100"]["max_lifetime"] == 2 * 86400 and profiles["h100"]["idle_timeout"] == 7200
        assert spawner.delete(f"/leases/{lease['id']}").status_code == 200


def test_an_environment_is_asked_for_with_the_lease_and_one_no_gpu_can_run_is_refused_saying_why(
    hub: Hub,
) -> None:
    """The demo's A100 box runs driver 535: its CUDA 12.4 environment can never start. GET profiles says so beside
    it (the spawn form shows it disabled), and a lease naming it anyway is refused naming the field, the
    environment the profile's GPUs can run, and why."""
    with hub.as_user("hub-client") as spawner:
        body = {"profile": "a100-pair", "owner_kind": "server", "owner_name": "env", "user": "alice"}
        body |= {"groups": ["gpu-users"]}
        unknown = spawner.post("/leases", json=body | {"environment": "tf"})
        assert unknown.status_code == 400 and unknown.json()["fields"] == ["environment"], unknown.text
        assert "offers lab, cuda-12-4" in unknown.json()["detail"]
        why = "needs CUDA 12.4; the A100-40GB's driver 535.104.05 supports up to 12.2 (on a100-01)"
        newer = spawner.post("/leases", json=body | {"environment": "cuda-12-4"})
        assert newer.status_code == 409 and newer.json()["fields"] == ["environment"], newer.text
        assert (
            newer.json()["detail"]
            == f"environment: profile a100-pair's GPUs can run lab, not 'cuda-12-4': {why}"
        )
        lease = _new_lease(
            hub, "alice", "a100-pair", owner_name="env", environment="lab", groups=["gpu-users"]
        )
        assert lease["state"] == "granted" and lease["node"] == "a100-01"
        profiles = {p["slug"]: p for p in spawner.get("/profiles").json()}
        offered = {e["slug"]: e["never_fits"] for e in profiles["a100-pair"]["environments"]}
        assert offered == {"lab": None, "cuda-12-4": why}
        assert spawner.delete(f"/leases/{lease['id']}").status_code == 200


def test_a_deleted_user_is_retired_by_the_hub_or_an_admin_only_and_their_records_filed_away(hub: Hub) -> None:
    """``DELETE users/{user}``, which the hub's spawner asks as JupyterHub deletes a user (a hostile-user trial:
    a newcomer given a deleted user's name listed and cancelled the old one's jobs): a user may not ask it;
    the hub's ask releases what the deleted user held and renames their records to a name no user has."""
    lease = _new_lease(hub, "erin", "cpu")
    with hub.as_user("alice") as alice:
        refused = alice.delete("/users/erin")
        assert refused.status_code == 403 and "custom:gpupool:leases" in refused.json()["detail"]
    with hub.as_user("hub-client") as spawner:
        assert spawner.get(f"/leases/{lease['id']}").json()["state"] == "granted"
        retired = spawner.delete("/users/erin").json()
        assert (retired["leases_released"], retired["jobs_cancelled"], retired["still_running"]) == (1, 0, 0)
        filed = retired["records_filed_as"]
        assert filed.startswith("erin/deleted ")
        kept = spawner.get(f"/leases/{lease['id']}").json()
        assert (kept["state"], kept["user"]) == ("released", filed)
        assert spawner.get("/leases", params={"user": "erin"}).json() == []
        again = spawner.delete("/users/erin").json()  # asked twice: nothing left to do
        assert (again["leases_released"], again["records_filed_as"]) == (0, None)
        # held out while the hub retires their account: erin's token still works until the hub drops her, and a
        # job or server started meanwhile would outlive her (from the review)
        assert spawner.delete("/users/erin", params={"hold": True}).status_code == 200
        body = {"profile": "cpu", "owner_kind": "server", "owner_name": "", "user": "erin"}
        held_out = spawner.post("/leases", json=body)
        assert held_out.status_code == 409 and "erin is being deleted" in held_out.text, held_out.text
        assert spawner.delete("/users/erin").status_code == 200  # done: a new erin may come
        assert spawner.post("/leases", json=body).status_code == 201
