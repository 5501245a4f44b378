"""The gpupool service's HTTP API, through a real JupyterHub, its proxy and hub-issued tokens.

One hub for the module: JupyterHub (DummyAuthenticator, sqlite in tmp), configurable-http-proxy from
``.node/`` (``make test`` installs it), and the service as a managed JupyterHub service on the demo pool.
Users and their tokens are made through the hub's REST API with an admin service token from the config.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.spawner.backends.simulated import DEMO_POOL

ROOT = Path(__file__).resolve().parent.parent
CHP_BIN = ROOT / ".node" / "node_modules" / ".bin"
ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
HUB_CLIENT_TOKEN = "test-hub-client-token-0123456789abcdef"
SERVICE = "gpupool"

HUB_CONFIG = """
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {proxy_port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.JupyterHub.db_url = "sqlite:///{tmp}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/cookie_secret"
c.JupyterHub.pid_file = "{tmp}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = "{tmp}/proxy.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.cleanup_servers = True
c.JupyterHub.custom_scopes = {{
    "custom:gpupool:leases": {{"description": "Create and release gpupool leases for any user"}},
    "custom:gpupool:admin": {{"description": "Read and release every gpupool lease"}},
}}
c.JupyterHub.services = [
    {{
        "name": "{service}",
        "url": "http://127.0.0.1:{service_port}",
        "command": {command!r},
        "environment": {environment!r},
    }},
    {{"name": "test-admin", "api_token": "{admin_token}"}},
    {{"name": "hub-client", "api_token": "{hub_client_token}"}},
]
c.JupyterHub.load_roles = [
    {{"name": "user", "scopes": ["self", "access:services!service={service}"]}},
    {{
        "name": "test-admin",
        "scopes": ["admin:users", "tokens", "custom:gpupool:admin", "access:services!service={service}"],
        "services": ["test-admin"],
    }},
    {{
        "name": "gpupool-hub",
        "scopes": ["custom:gpupool:leases", "access:services!service={service}"],
        "services": ["hub-client"],
    }},
]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Hub:
    url: str  # the proxy's public URL
    hub_api: str
    service_env: dict[str, str]
    tmp: Path
    log: Path
    tokens: dict[str, str]
    extra: list[subprocess.Popen[bytes]]

    @property
    def api(self) -> str:
        return f"{self.url}/services/{SERVICE}/api/v1"

    def as_user(self, name: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.api, headers={"Authorization": f"token {self.tokens[name]}"}, timeout=10
        )

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _wait_for(url: str, hub_log: Path, what: str, timeout: float = 30, **kw: Any) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2, **kw).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"{what} did not answer at {url} within {timeout}s; log:\n{hub_log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    chp = shutil.which("configurable-http-proxy", path=str(CHP_BIN))
    if chp is None:
        pytest.fail(f"configurable-http-proxy is not in {CHP_BIN}; run `make test` (it installs it with npm)")
    tmp = tmp_path_factory.mktemp("hub")
    ports = {name: _free_port() for name in ("proxy_port", "proxy_api_port", "hub_port", "service_port")}
    service_env = {
        "GPUPOOL_POOL": str(DEMO_POOL),
        "GPUPOOL_DB_URL": f"sqlite:///{tmp}/gpupool.sqlite",
    }
    config = HUB_CONFIG.format(
        tmp=tmp,
        service=SERVICE,
        command=[sys.executable, "-m", "gpupool.spawner.service"],
        environment=service_env,
        admin_token=ADMIN_TOKEN,
        hub_client_token=HUB_CLIENT_TOKEN,
        **ports,
    )
    (tmp / "jupyterhub_config.py").write_text(config)
    log = tmp / "hub.log"
    env = os.environ | {"PATH": f"{CHP_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(tmp / "jupyterhub_config.py")],
            cwd=tmp,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{ports['proxy_port']}"
    hub = Hub(
        url=url,
        hub_api=f"{url}/hub/api",
        service_env=service_env
        | {
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{ports['service_port']}",
            "JUPYTERHUB_API_URL": f"http://127.0.0.1:{ports['hub_port']}/hub/api",
            "JUPYTERHUB_SERVICE_PREFIX": f"/services/{SERVICE}/",
            "JUPYTERHUB_SERVICE_NAME": SERVICE,
        },
        tmp=tmp,
        log=log,
        tokens={"admin": ADMIN_TOKEN, "hub-client": HUB_CLIENT_TOKEN},
        extra=[],
    )
    try:
        _wait_for(f"{hub.hub_api}/", log, "JupyterHub")
        _wait_for(f"{hub.api}/openapi.json", log, "the gpupool service")
        admin = {"Authorization": f"token {ADMIN_TOKEN}"}
        for name in ("alice", "bob"):
            created = httpx.post(f"{hub.hub_api}/users/{name}", headers=admin, timeout=10)
            assert created.status_code == 201, created.text
            token = httpx.post(
                f"{hub.hub_api}/users/{name}/tokens", headers=admin, json={"note": "test"}, timeout=10
            )
            assert token.status_code == 201, token.text
            hub.tokens[name] = token.json()["token"]
        yield hub
    finally:
        for extra in hub.extra:
            extra.kill()
            extra.wait()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _mig_instance(pool: dict[str, Any], uuid: str) -> dict[str, Any]:
    return next(m for n in pool["nodes"] for g in n["gpus"] for m in g["mig"] if m["uuid"] == uuid)


def _new_lease(client: httpx.Client, profile: str = "mig-3g", **body: Any) -> dict[str, Any]:
    response = client.post(
        "/leases", json={"profile": profile, "owner_kind": "server", "owner_name": ""} | body
    )
    assert response.status_code == 201, response.text
    lease: dict[str, Any] = response.json()
    return lease


def test_the_openapi_document_loads_through_the_proxy(hub: Hub) -> None:
    document = httpx.get(f"{hub.api}/openapi.json", timeout=10).json()
    paths = set(document["paths"])
    prefix = f"/services/{SERVICE}/api/v1"
    assert {
        f"{prefix}/pool",
        f"{prefix}/profiles",
        f"{prefix}/leases",
        f"{prefix}/leases/{{lease_id}}",
    } <= paths


def test_a_request_without_a_token_is_401_and_a_bad_token_403(hub: Hub) -> None:
    missing = httpx.get(f"{hub.api}/pool", timeout=10)
    assert missing.status_code == 401
    assert "Authorization: token" in missing.json()["detail"]
    bad = httpx.get(f"{hub.api}/pool", headers={"Authorization": "Bearer not-a-token"}, timeout=10)
    assert bad.status_code == 403
    assert "does not accept this token" in bad.json()["detail"]


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
        lease = _new_lease(alice)
        assert lease["state"] == "granted" and lease["user"] == "alice"
        (device,) = lease["devices"]
        assert device["uuid"].startswith("MIG-") and lease["visible_devices"] == device["uuid"]
        assert not _mig_instance(alice.get("/pool").json(), device["uuid"])["free"]
        assert lease["id"] in {mine["id"] for mine in alice.get("/leases").json()}

        released = alice.delete(f"/leases/{lease['id']}")
        assert released.status_code == 200, released.text
        assert released.json()["state"] == "released"
        assert _mig_instance(alice.get("/pool").json(), device["uuid"])["free"]


def test_bob_can_neither_see_nor_release_alices_lease(hub: Hub) -> None:
    with hub.as_user("alice") as alice, hub.as_user("bob") as bob:
        lease = _new_lease(alice)
        assert bob.get(f"/leases/{lease['id']}").status_code == 404
        assert bob.delete(f"/leases/{lease['id']}").status_code == 404
        assert lease["id"] not in {theirs["id"] for theirs in bob.get("/leases").json()}
        assert alice.get(f"/leases/{lease['id']}").json()["state"] == "granted"
        alice.delete(f"/leases/{lease['id']}")


def test_a_user_cannot_ask_for_another_user_but_the_hub_can(hub: Hub) -> None:
    with hub.as_user("bob") as bob, hub.as_user("hub-client") as spawner, hub.as_user("admin") as admin:
        refused = bob.post(
            "/leases", json={"profile": "cpu", "owner_kind": "server", "owner_name": "", "user": "alice"}
        )
        assert refused.status_code == 403 and refused.json()["fields"] == ["user"]
        lease = _new_lease(spawner, "cpu", user="alice", owner_name="gpu")
        assert lease["user"] == "alice"
        assert lease["id"] in {every["id"] for every in admin.get("/leases").json()}
        assert spawner.delete(f"/leases/{lease['id']}").status_code == 200


def test_an_unknown_profile_is_a_400_listing_the_slugs(hub: Hub) -> None:
    with hub.as_user("alice") as alice:
        response = alice.post("/leases", json={"profile": "nope", "owner_kind": "server", "owner_name": ""})
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "unknown_profile" and body["fields"] == ["profile"]
    assert "mig-3g" in body["detail"] and "cpu" in body["detail"]


def test_a_bad_body_names_the_field(hub: Hub) -> None:
    with hub.as_user("alice") as alice:
        response = alice.post("/leases", json={"profile": "cpu", "owner_kind": "vm", "owner_name": ""})
        missing = alice.post("/leases", json={"profile": "cpu", "owner_kind": "server"})
    assert response.status_code == 400
    assert response.json()["fields"] == ["owner_kind"]
    assert response.json()["detail"].startswith("owner_kind:")
    assert missing.status_code == 400 and missing.json()["fields"] == ["owner_name"]


def _service_pids(db_url: str) -> list[int]:
    """The running service processes on this module's database (the managed one, before it is killed)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"gpupool.spawner.service" in cmdline and f"GPUPOOL_DB_URL={db_url}".encode() in environ:
            pids.append(int(proc.name))
    return pids


def test_a_restarted_service_still_knows_alices_lease(hub: Hub) -> None:
    """Runs last: the hub restarts a dead managed service only on its 30 s poll, so start one ourselves."""
    with hub.as_user("alice") as alice:
        lease = _new_lease(alice)
        pids = _service_pids(hub.service_env["GPUPOOL_DB_URL"])
        assert pids, "the managed gpupool service process was not found"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _service_pids(hub.service_env["GPUPOOL_DB_URL"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        log = (hub.tmp / "service-2.log").open("wb")
        hub.extra.append(
            subprocess.Popen(
                [sys.executable, "-m", "gpupool.spawner.service"],
                env=os.environ | hub.service_env,
                cwd=hub.tmp,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        _wait_for(f"{hub.api}/openapi.json", hub.tmp / "service-2.log", "the restarted service")

        again = alice.get(f"/leases/{lease['id']}")
        assert again.status_code == 200, again.text
        assert again.json()["state"] == "granted" and again.json()["devices"] == lease["devices"]
        (device,) = lease["devices"]
        assert not _mig_instance(alice.get("/pool").json(), device["uuid"])["free"]
