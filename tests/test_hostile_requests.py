"""What a hostile or careless caller sends the service, refused with a sentence naming the field: numbers
that are not numbers, a service token without the hub's scope, and a pool view that names other users'
leases. The service as ``assemble`` builds it, over ASGI, with a stand-in hub for tokens."""

from __future__ import annotations

import asyncio
import json
import stat
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_telemetry_api import DEMO_POOL, PREFIX, USERS, Client, Service
from token_hub import token_hub

from gpupool.spawner.pool.job_states import Job
from gpupool.spawner.pool.requests import Request
from gpupool.spawner.service.api import job_routes
from gpupool.spawner.service.api.lease_routes import ANOTHER_USER


@pytest.fixture(scope="module")
def hub_api() -> Iterator[str]:
    with token_hub(USERS) as url:
        yield url


JOB = {"command": ["true"], "profile": "cpu"}


@pytest.mark.parametrize(("value", "why"), [("NaN", "finite"), ("Infinity", "finite"), ("true", "true")])
def test_a_max_runtime_that_is_not_a_number_of_seconds_is_refused(
    tmp_path: Path, hub_api: str, value: str, why: str
) -> None:
    service = Service(tmp_path, hub_api)
    body = json.dumps(JOB)[:-1] + f', "max_runtime": {value}}}'
    with Client(service.app) as client:
        answer = client.post("api/v1/jobs", "alice-token", body)
    assert answer.status_code == 400 and answer.json()["fields"] == ["max_runtime"], answer.text
    assert (
        why in answer.json()["detail"] and "Value error" not in answer.json()["detail"]
    )  # no pydantic words
    assert answer.json()["error"] == "invalid_request"
    assert service.parts.jobs.all_jobs() == []  # nothing stored


@pytest.mark.parametrize(
    ("path", "field"),
    [("usage?since=NaN", "since"), ("usage?until=inf", "until"), ("telemetry?since=-Infinity", "since")],
)
def test_a_time_in_a_query_that_is_not_a_number_is_refused(
    tmp_path: Path, hub_api: str, path: str, field: str
) -> None:
    """A trial found ``usage?since=NaN`` answered 200 with nothing in it."""
    service = Service(tmp_path, hub_api)
    with Client(service.app) as client:
        answer = client.get(f"api/v1/{path}", "alice-token")
    assert answer.status_code == 400 and answer.json()["fields"] == [field], answer.text


@pytest.mark.parametrize("value", ["false", "NaN", '"soon"'])
def test_a_cull_warning_without_a_time_is_refused(tmp_path: Path, hub_api: str, value: str) -> None:
    service = Service(tmp_path, hub_api)
    body = f'{{"user": "alice", "reason": "idle", "cull_at": {value}}}'
    with Client(service.app) as client:
        answer = client.post("api/v1/warnings", "hub-token", body)
        assert client.get("api/v1/warnings", "hub-token").json() == []
    assert answer.status_code == 400 and answer.json()["fields"] == ["cull_at"], answer.text


@pytest.mark.parametrize(
    ("path", "body", "scope"),
    [
        ("api/v1/warnings", '{"user": "bob", "cull_at": "soon"}', "custom:gpupool:admin"),
        ("api/v1/culls", '{"limit": "whenever"}', "custom:gpupool:admin"),
        ("api/v1/admin/drain", '{"node": 7}', "custom:gpupool:admin"),
        ("api/v1/admin/undrain", '{"gpu_index": "all"}', "custom:gpupool:admin"),
        ("api/v1/admin/faults", '{"node": "gpu-a", "gpu_index": -1.5}', "custom:gpupool:admin"),
        ("api/v1/admin/repair", "{}", "custom:gpupool:admin"),
        ("api/v1/leases", '{"profile": 5}', "the hub's spawner"),
    ],
)
def test_a_caller_without_the_scope_is_refused_before_their_body_is_read(
    tmp_path: Path, hub_api: str, path: str, body: str, scope: str
) -> None:
    """A trial found alice's malformed cull warning answered 400 naming the fields an admin must send:
    the scope is checked first, so she learns only that she may not."""
    service = Service(tmp_path, hub_api)
    allowed = "hub-token" if path.endswith("leases") else "admin-token"
    with Client(service.app) as client:
        answer = client.post(path, "alice-token", body)
        privileged = client.post(path, allowed, body)
    assert answer.status_code == 403 and scope in answer.json()["detail"], answer.text
    assert answer.json()["fields"] == []  # no field of the body named
    assert privileged.status_code == 400, "a bad body from one who may send it is still named"


def test_a_service_without_the_hubs_scope_can_take_no_lease(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    body = json.dumps({"profile": "h100", "owner_kind": "job", "owner_name": "ghost"})
    with Client(service.app) as client:
        answer = client.post("api/v1/leases", "bare-service-token", body)
        pool = client.get("api/v1/pool", "bare-service-token")
    assert answer.status_code == 403 and "custom:gpupool:leases" in answer.json()["detail"]
    assert pool.status_code == 403
    assert not [lease for lease in service.manager.all_leases() if lease.user == "reporter"]


def test_a_user_sees_which_devices_are_held_but_only_their_own_lease_ids(
    tmp_path: Path, hub_api: str
) -> None:
    service = Service(tmp_path, hub_api)  # alice holds a 3g.40gb slice, bob an H100, carol four H100s
    with Client(service.app) as client:
        mine = client.get("api/v1/pool", "alice-token").json()
        everything = client.get("api/v1/pool", "admin-token").json()

    def holders(pool: dict[str, Any]) -> list[str]:
        found: list[str] = []
        for node in pool["nodes"]:
            for gpu in node["gpus"]:
                found += gpu["holders"] + [h for mig in gpu["mig"] for h in mig["holders"]]
        return found

    others = {service.bob.id, service.carol[0].id}
    assert service.alice.id in holders(mine) and not others & set(holders(mine))
    assert holders(mine).count(ANOTHER_USER) == 1 + 4  # bob's H100 and carol's four: held, not whose
    assert others <= set(holders(everything))
    # which pool file, but not where it lies on the service's host (an admin sees the path)
    assert (mine["source"], everything["source"]) == (DEMO_POOL.name, str(DEMO_POOL))


def test_the_lease_database_is_readable_by_its_owner_only(tmp_path: Path, hub_api: str) -> None:
    Service(tmp_path, hub_api).manager.request_lease(
        "alice", [], "server", "x", "cpu", Request(1000, 1024, None)
    )
    files = [p for p in tmp_path.iterdir() if p.name.startswith("leases.sqlite")]
    assert {p.name for p in files} >= {"leases.sqlite", "leases.sqlite-wal"}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_only_an_admin_marks_a_gpu_unhealthy_and_the_mark_lasts_until_repair(
    tmp_path: Path, hub_api: str
) -> None:
    service = Service(tmp_path, hub_api)
    gpu = json.dumps({"node": "dgx-h100-01", "gpu_index": 7})
    with Client(service.app) as client:
        assert client.post("api/v1/admin/faults", "alice-token", gpu).status_code == 403
        marked = client.post("api/v1/admin/faults", "admin-token", gpu)
        unknown = client.post(
            "api/v1/admin/repair", "admin-token", '{"node": "dgx-h100-01", "gpu_index": 99}'
        )
    assert marked.status_code == 200 and marked.json()["health"] == "unhealthy", marked.text
    assert unknown.status_code == 400 and unknown.json()["fields"] == ["gpu_index"]
    restarted = Service(tmp_path, hub_api)  # the same database: the mark is still there
    assert restarted.manager.health_of("dgx-h100-01", 7).value == "unhealthy"
    with Client(restarted.app) as client:
        repaired = client.post("api/v1/admin/repair", "admin-token", gpu)
    assert repaired.status_code == 200 and repaired.json()["health"] == "healthy", repaired.text


def test_a_revoked_token_changes_nothing_even_while_its_answer_is_cached(tmp_path: Path) -> None:
    tokens = dict(USERS)  # the stand-in hub reads this as it is at each call
    with token_hub(tokens) as api:
        service = Service(tmp_path, api)
        warning = json.dumps({"user": "alice", "reason": "idle", "cull_at": 2e9})
        with Client(service.app) as client:
            assert client.get("api/v1/warnings", "hub-token").status_code == 200  # now cached
            del tokens["hub-token"]  # revoked in the hub
            refused = client.post("api/v1/warnings", "hub-token", warning)
            assert refused.status_code == 403, refused.text
            assert client.get("api/v1/warnings", "admin-token").json() == []


def test_a_body_that_is_not_json_is_refused_as_the_body_not_a_byte_offset(
    tmp_path: Path, hub_api: str
) -> None:
    service = Service(tmp_path, hub_api)
    with Client(service.app) as client:
        answer = client.post("api/v1/jobs", "alice-token", '{"command": ["true"], "profile": ')
    assert answer.status_code == 400 and answer.json()["fields"] == ["body"], answer.text
    assert answer.json()["detail"].startswith("body: not valid JSON")


def test_a_body_that_is_not_utf8_is_refused_naming_the_body(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    with Client(service.app) as client:
        not_utf8 = b'{"command": ["\xff"]}'
        answer = client.post("api/v1/jobs", "alice-token", not_utf8)  # type: ignore[arg-type]
    assert answer.status_code == 400 and answer.json()["fields"] == ["body"], answer.text
    assert answer.json()["detail"] == "body: not valid JSON (it must be UTF-8 text)"


def test_the_openapi_document_promises_the_400_the_service_answers_never_a_422(
    tmp_path: Path, hub_api: str
) -> None:
    service = Service(tmp_path, hub_api)
    with Client(service.app) as client:
        document = client.get("api/v1/openapi.json", None).json()
    operations = [op for path in document["paths"].values() for op in path.values()]
    assert operations and not [op for op in operations if "422" in op["responses"]]
    assert "400" in document["paths"]["/services/gpupool/api/v1/jobs"]["post"]["responses"]
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_a_method_a_path_does_not_take_lists_every_method_it_does(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    with Client(service.app) as client:
        answer = client.runner.run(
            client.http.put("/services/gpupool/api/v1/leases", headers={"Authorization": "token alice-token"})
        )
    assert answer.status_code == 405 and answer.headers["allow"] == "GET, POST", answer.headers


def test_a_body_over_two_mib_is_refused_unread(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    env = {f"V{i}": "x" * 30 for i in range(100_000)}  # 100k variables, about 4 MB of JSON
    with Client(service.app) as client:
        answer = client.post("api/v1/jobs", "alice-token", json.dumps(JOB | {"env": env}))
    assert answer.status_code == 413 and answer.json()["fields"] == ["body"], answer.text
    assert service.parts.jobs.all_jobs() == []


def test_no_one_asks_for_a_job_lease_without_a_job(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    body = json.dumps({"profile": "h100", "owner_kind": "job", "owner_name": "ghost"})
    with Client(service.app) as client:
        answers = [client.post("api/v1/leases", token, body) for token in ("alice-token", "hub-token")]
    assert [a.status_code for a in answers] == [403, 403] and "POST jobs" in answers[0].json()["detail"]
    assert not [lease for lease in service.manager.all_leases() if lease.owner_name == "ghost"]


def test_a_followed_log_ends_once_the_hub_no_longer_accepts_its_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial found a ``follow=true`` stream still sending a job's log 90 s after its token was revoked."""
    monkeypatch.setattr(job_routes, "STREAM_TOKEN_CHECK", 0.2)
    tokens = dict(USERS)  # the stand-in hub reads this as it is at each call
    with token_hub(tokens) as api:
        service = Service(tmp_path, api)  # its loops are not started: alice's job stays queued
        job = Job("alice-job-1", "alice", "train", "cpu", ("python", "train.py"), str(tmp_path), {}, "normal",
                  0, None, time.time())  # fmt: skip
        service.parts.jobs.store.add(replace(job, job_dir=str(tmp_path / "alice-job-1")))

        async def follow(revoke: bool) -> int:
            transport = httpx.ASGITransport(app=service.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://service") as http:
                url = f"{PREFIX}api/v1/jobs/alice-job-1/logs?follow=true"
                streamed = asyncio.create_task(http.get(url, headers={"Authorization": "token alice-token"}))
                await asyncio.sleep(1)
                if revoke:
                    del tokens["alice-token"]  # revoked in the hub
                answer = await asyncio.wait_for(streamed, 5)
                return answer.status_code

        with pytest.raises(TimeoutError):  # accepted, the stream goes on while the job waits
            asyncio.run(follow(revoke=False))
        assert asyncio.run(follow(revoke=True)) == 200  # revoked, it ends


@pytest.mark.parametrize("sent_as", ["application/x-www-form-urlencoded", "text/plain; charset=utf-8"])
def test_json_sent_as_a_form_or_text_is_refused_naming_the_content_type(
    tmp_path: Path, hub_api: str, sent_as: str
) -> None:
    """A trial's ``curl -d '{"command": ["true"], "profile": "cpu"}' …/jobs`` (curl says it is a form) got
    "body: Input should be a valid dictionary", about a body that is one."""
    service = Service(tmp_path, hub_api)
    headers = {"Authorization": "token alice-token", "Content-Type": sent_as}
    with Client(service.app) as client:
        answer = client.runner.run(
            client.http.post(f"{PREFIX}api/v1/jobs", headers=headers, content=json.dumps(JOB))
        )
    assert answer.status_code == 415, answer.text
    assert answer.json()["detail"] == (
        f"body: send JSON with Content-Type: application/json, not {sent_as.split(';')[0]}"
    )
    assert service.parts.jobs.all_jobs() == []


def test_a_token_made_with_fewer_scopes_is_told_how_to_make_one_that_works(tmp_path: Path) -> None:
    """A trial's token, made on /hub/token with its scopes narrowed, was told to ask an administrator for a scope
    the user's role already grants."""
    narrowed = {"narrow-token": {"name": "ada", "kind": "user", "scopes": ["read:users:name!user=ada"]}}
    with token_hub(narrowed) as url:
        service = Service(tmp_path, url)
        with Client(service.app) as client:
            answer = client.get("api/v1/pool", "narrow-token")
    assert answer.status_code == 403, answer.text
    assert "made with only some of your scopes" in answer.json()["detail"]
    assert "access:services!service=gpupool" in answer.json()["detail"]
