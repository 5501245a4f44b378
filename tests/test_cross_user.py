"""The cross-user matrix: every route of the API, called by bob (a user) and by a service without the hub's
scope, aimed at alice's lease, job, warning and name. Each call is refused (403, or 404 where the thing is not
theirs to know of), or, on the few routes that show the caller their own view, says nothing of alice's; and
afterwards everything of alice's is as it was. A route added to the API without a row here fails the test.

The service as ``assemble`` builds it on the demo pool, over ASGI, with a stand-in hub for tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from fastapi.routing import APIRoute
from test_telemetry_api import USERS, Client, Service
from token_hub import token_hub

from gpupool.spawner.pool.job_states import Job
from gpupool.spawner.service.api.app import API_ROUTERS
from gpupool.spawner.service.leasing.culls import CullWarning

ATTACKERS = ("bob-token", "bare-service-token")
DEVICE = {"node": "dgx-h100-01", "gpu_index": 0}
# The body each route that takes one gets: aimed at alice wherever the body can name a user.
BODIES = {
    ("POST", "/leases"): {"profile": "cpu", "owner_kind": "server", "owner_name": "", "user": "alice"},
    ("POST", "/jobs"): {"command": ["true"], "profile": "cpu"},
    ("POST", "/admin/drain"): DEVICE,
    ("POST", "/admin/undrain"): DEVICE,
    ("POST", "/admin/faults"): DEVICE,
    ("POST", "/admin/repair"): DEVICE,
    ("POST", "/admin/simulated-xid"): DEVICE | {"xid": 79},
    ("POST", "/warnings"): {"user": "alice", "cull_at": 1e12, "reason": "spite"},
    ("POST", "/culls"): {"user": "alice", "limit": "idle_timeout", "reason": "spite"},
    ("POST", "/jobs/{job_id}/requeue"): {},
}
# Routes that answer a user with their own view (bob's pool, profiles, telemetry), or let them make their own
# job: allowed to succeed for bob, as long as nothing of alice's is in the answer.
OWN_VIEW = {("GET", "/pool"), ("GET", "/profiles"), ("GET", "/telemetry"), ("POST", "/jobs")}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with token_hub(USERS) as hub_api:
        service = Service(tmp_path_factory.mktemp("cross-user"), hub_api)
        now = time.time()
        job = Job("alice-job-1", "alice", "train", "cpu", ("python", "train.py"), "/home/alice", {"SECRET": "x"},
                  "normal", 0, None, now)  # fmt: skip
        service.parts.jobs.store.add(replace(job, job_dir="/home/alice/.gpupool/jobs/alice-job-1"))
        service.parts.culls.put(CullWarning("alice", "", service.alice.id, now + 3600, "idle GPU", now))
        yield service


def _routes() -> list[tuple[str, str]]:
    return sorted(
        (method, route.path)
        for router in API_ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    )


def _url(path: str, service: Service) -> str:
    """The route's path aimed at alice: her lease, her job, her name; ``user=alice`` wherever it is asked."""
    filled = path.format(lease_id=service.alice.id, job_id="alice-job-1", user="alice")
    return f"api/v1{filled}?user=alice"


def _alices(service: Service) -> tuple[object, ...]:
    """Everything of alice's a cross-user call could change."""
    parts = service.parts
    return (
        parts.manager.get(service.alice.id),
        parts.jobs.get("alice-job-1"),
        parts.culls.get("alice", ""),
        tuple(parts.health.store.all()),  # drains and faults
    )


@pytest.mark.parametrize("attacker", ATTACKERS)
def test_no_route_lets_another_caller_read_or_change_alices_things(service: Service, attacker: str) -> None:
    before = _alices(service)
    secrets = (service.alice.id, "alice-job-1", "SECRET", "idle GPU")
    with Client(service.app) as client:
        for method, path in _routes():
            url = _url(path, service)
            if method == "GET":
                answer = client.get(url, attacker)
            elif method == "DELETE":
                answer = client.runner.run(
                    client.http.delete(
                        f"/services/gpupool/{url}", headers={"Authorization": f"token {attacker}"}
                    )
                )
            else:
                assert (method, path) in BODIES, f"{method} {path}: add the body it takes to BODIES"
                answer = client.post(url, attacker, json.dumps(BODIES[method, path]))
            sent = url + json.dumps(BODIES.get((method, path)))  # an id the caller sent may be named back
            where = f"{method} {path} as {attacker}: {answer.status_code} {answer.text[:300]}"
            if (method, path) in OWN_VIEW and attacker == "bob-token":
                assert answer.status_code < 500, where
            else:
                assert answer.status_code in (403, 404), where
            assert not [secret for secret in secrets if secret in answer.text and secret not in sent], where
    assert _alices(service) == before
