"""``gpupool up`` as a subprocess for end-to-end tests: start it on free ports, log in as demo, stop it.

Each hub runs in its own process group with its state in a tmp folder, on a free port whose derived internal
ports (``+1``, ``+81``, ``+2101``) are free too; it is stopped with SIGTERM, which JupyterHub passes on to the
proxy and the services it started. ``test_gpupool_up`` and ``test_browser`` share it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from ports import free_port

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.hub.up import find_proxy
from gpupool.spawner.names import API_PATH, SERVICE_PREFIX

LOGIN_LINE = re.compile(r"Log in at (\S+) as demo with password (\S+)")
XSRF_FIELD = re.compile(r'name="_xsrf"\s+value="([^"]+)"')


def free_port_family() -> int:
    """A port that is free together with the ``+1``, ``+81`` and ``+2101`` ports ``gpupool up`` derives."""
    return free_port((0, 1, 81, 2101))


def require_proxy() -> None:
    """Fail (not skip) without configurable-http-proxy: ``make test`` installs it, so missing is a bug."""
    try:
        find_proxy()
    except RuntimeError as error:
        pytest.fail(str(error))


@dataclass
class Up:
    """A running ``gpupool up``: its process, its log, where it listens and the demo password it printed."""

    process: subprocess.Popen[bytes]
    log: Path
    url: str
    password: str

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def gpupool_lines(self) -> str:
        """The log's lines from gpupool's spawner and service (leases asked for, granted, released), whatever
        the hub's own debug output around them."""
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines if "gpupool" in line and "oauth" not in line.lower())[-6000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # the hub: it stops its proxy and services
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(ProcessLookupError):  # anything the hub left behind in its group
            os.killpg(self.process.pid, signal.SIGKILL)


def up_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpupool.spawner.cli", "up", *args]


READY_PAGES = ("/hub/login", f"{SERVICE_PREFIX}{API_PATH}/openapi.json")


def start_up(
    tmp: Path,
    state: Path,
    port: int,
    extra: Path,
    *,
    timeout: float = 150,
    pool: tuple[str, ...] = ("--pool", str(DEMO_POOL)),
    args: tuple[str, ...] = (),
) -> Up:
    """Start ``gpupool up`` on the demo pool (or what ``pool`` says, e.g. ``("--kubeconfig", path)``) and
    return once /hub/login and the service's API answer 200; fail with its log."""
    log = tmp / f"up-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            up_command("--port", str(port), *pool, "--state-dir", str(state), "-f", str(extra), *args),
            cwd=tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    up = Up(process, log, f"http://127.0.0.1:{port}", "")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"gpupool up exited with {process.returncode}:\n{up.log_tail()}")
        match = LOGIN_LINE.search(log.read_text(errors="replace"))
        if match:
            up.password = match.group(2)
            try:
                # the login page answers before the service does (the proxy routes both at once): wait for both
                if all(httpx.get(f"{up.url}{page}", timeout=2).status_code == 200 for page in READY_PAGES):
                    return up
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    up.stop()
    pytest.fail(f"{READY_PAGES} did not answer 200 at {up.url} within {timeout:g}s:\n{up.log_tail()}")


def extra_config(tmp: Path) -> Path:
    """An -f file (proving it loads after the defaults); while the GPU spawner module is not there yet, it
    also swaps in JupyterHub's plain spawner, since the hub imports ``spawner_class`` at start-up."""
    lines = ["c = get_config()  # noqa", "c.JupyterHub.log_level = 'DEBUG'"]
    if importlib.util.find_spec("gpupool.spawner.hub.spawner") is None:
        lines.append("c.JupyterHub.spawner_class = 'simple'")
    extra = tmp / "extra_config.py"
    extra.write_text("\n".join(lines) + "\n")
    return extra


def login(up: Up) -> httpx.Client:
    """A client holding the demo user's cookies, after the _xsrf form flow of /hub/login."""
    client = httpx.Client(base_url=up.url, timeout=10)
    page = client.get("/hub/login")
    assert page.status_code == 200
    field = XSRF_FIELD.search(page.text)
    assert field, page.text[:2000]
    response = client.post(
        "/hub/login", data={"username": "demo", "password": up.password, "_xsrf": field.group(1)}
    )
    assert response.status_code == 302, f"{response.status_code}: {response.text[:500]}\n{up.log_tail()}"
    return client


def api_token(client: httpx.Client) -> str:
    """A new API token of the logged-in demo user, made through the hub's API with the session cookie."""
    xsrf = client.cookies.get("_xsrf") or ""
    response = client.post("/hub/api/users/demo/tokens", json={"note": "test"}, headers={"X-XSRFToken": xsrf})
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


def demo_hub_api(up: Up) -> httpx.Client:
    """A client of the hub's API with a token of the demo user, made after logging in as a browser does."""
    with contextlib.closing(login(up)) as client:
        token = api_token(client)
    return httpx.Client(base_url=f"{up.url}/hub/api", headers={"Authorization": f"token {token}"}, timeout=30)


def start_demo_server(up: Up, hub: httpx.Client, profile: str = "cpu") -> dict[str, Any]:
    """Start the demo user's server (CPU only by default) through the hub's API and wait until it is ready."""
    started = hub.post("/users/demo/server", json={"profile": profile})
    assert started.status_code in (201, 202), started.text
    deadline = time.monotonic() + 90
    while not (server := hub.get("/users/demo").json()["servers"].get("", {})).get("ready"):
        assert time.monotonic() < deadline, f"the server did not start:\n{up.log_tail()}"
        time.sleep(0.2)
    ready: dict[str, Any] = server
    return ready
