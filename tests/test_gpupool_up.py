"""``gpupool up`` end to end: the real command starts JupyterHub, the proxy, the gpupool service and the culler.

Each hub runs as a subprocess in its own process group with its state in a tmp folder, on a free port whose
derived internal ports (``+1``, ``+81``, ``+2101``) are free too; it is stopped with SIGTERM, which JupyterHub
passes on to the proxy and the services it started.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from traitlets.config import Config, PyFileConfigLoader

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.hub.up import ENV, demo_password, embedded_config, find_proxy, prepare

ROOT = Path(__file__).resolve().parent.parent

LOGIN_LINE = re.compile(r"Log in at (\S+) as demo with password (\S+)")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port_family() -> int:
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port + 2101 < 65536 and all(_free(port + d) for d in (0, 1, 81, 2101)):
            return port
    pytest.fail("no free port with free +1, +81 and +2101 neighbours")


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    log: Path
    url: str
    password: str

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

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


def _up_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpupool.spawner.cli", "up", *args]


def _start(tmp: Path, state: Path, port: int, extra: Path) -> Up:
    log = tmp / f"up-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            _up_command(
                "--port", str(port), "--pool", str(DEMO_POOL), "--state-dir", str(state), "-f", str(extra)
            ),
            cwd=tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    up = Up(process, log, f"http://127.0.0.1:{port}", "")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"gpupool up exited with {process.returncode}:\n{up.log_tail()}")
        match = LOGIN_LINE.search(log.read_text(errors="replace"))
        if match:
            up.password = match.group(2)
            try:
                if httpx.get(f"{up.url}/hub/login", timeout=2).status_code == 200:
                    return up
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    up.stop()
    pytest.fail(f"/hub/login did not answer 200 at {up.url} within 60s:\n{up.log_tail()}")


def _extra_config(tmp: Path) -> Path:
    """An -f file (proving it loads after the defaults); while the GPU spawner module is not there yet, it
    also swaps in JupyterHub's plain spawner, since the hub imports ``spawner_class`` at start-up."""
    lines = ["c = get_config()  # noqa", "c.JupyterHub.log_level = 'DEBUG'"]
    if importlib.util.find_spec("gpupool.spawner.hub.spawner") is None:
        lines.append("c.JupyterHub.spawner_class = 'simple'")
    extra = tmp / "extra_config.py"
    extra.write_text("\n".join(lines) + "\n")
    return extra


@pytest.fixture
def start(tmp_path: Path) -> tuple[Path, int]:
    """A tmp folder and a free port family; each test stops the hubs it starts."""
    try:
        find_proxy()
    except RuntimeError as error:
        pytest.fail(str(error))
    return tmp_path, _free_port_family()


def _login(up: Up) -> httpx.Client:
    """A client holding the demo user's cookies, after the _xsrf form flow of /hub/login."""
    client = httpx.Client(base_url=up.url, timeout=10)
    page = client.get("/hub/login")
    assert page.status_code == 200
    field = re.search(r'name="_xsrf"\s+value="([^"]+)"', page.text)
    assert field, page.text[:2000]
    response = client.post(
        "/hub/login", data={"username": "demo", "password": up.password, "_xsrf": field.group(1)}
    )
    assert response.status_code == 302, f"{response.status_code}: {response.text[:500]}\n{up.log_tail()}"
    return client


def _token(client: httpx.Client) -> str:
    """A new API token of the logged-in demo user, made through the hub's API with the session cookie."""
    xsrf = client.cookies.get("_xsrf") or ""
    response = client.post("/hub/api/users/demo/tokens", json={"note": "test"}, headers={"X-XSRFToken": xsrf})
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


def test_the_demo_user_logs_in_with_the_printed_password(start: tuple[Path, int]) -> None:
    tmp, port = start
    up = _start(tmp, tmp / "state", port, _extra_config(tmp))
    try:
        assert up.url == f"http://127.0.0.1:{port}"
        with contextlib.closing(_login(up)) as client:
            home = client.get("/hub/home")
            assert home.status_code == 200, home.text[:500]
            assert "demo" in home.text
            # the spawn form asks the service with the spawners' token, and shows the pool is simulated
            form = client.get("/hub/spawn")
            assert form.status_code == 200, form.text[:500]
            assert "simulated" in form.text.lower()
        with httpx.Client(base_url=up.url, timeout=10) as stranger:
            page = stranger.get("/hub/login")
            xsrf = re.search(r'name="_xsrf"\s+value="([^"]+)"', page.text)
            assert xsrf
            wrong = stranger.post(
                "/hub/login", data={"username": "demo", "password": "wrong-password", "_xsrf": xsrf.group(1)}
            )
            assert wrong.status_code == 403
    finally:
        up.stop()


def test_the_pool_api_behind_gpupool_up_says_simulated(start: tuple[Path, int]) -> None:
    tmp, port = start
    up = _start(tmp, tmp / "state", port, _extra_config(tmp))
    try:
        assert "simulated" in up.log.read_text().split("Log in at")[0]  # the start-up line says so
        with contextlib.closing(_login(up)) as client:
            token = _token(client)
        api = f"{up.url}/services/gpupool/api/v1"
        pool = httpx.get(f"{api}/pool", headers={"Authorization": f"token {token}"}, timeout=10)
        assert pool.status_code == 200, f"{pool.text}\n{up.log_tail()}"
        assert pool.json()["backend"] == "simulated"
    finally:
        up.stop()


def test_a_restart_keeps_the_password_and_both_databases(start: tuple[Path, int]) -> None:
    tmp, port = start
    state = tmp / "state"
    extra = _extra_config(tmp)
    first = _start(tmp, state, port, extra)
    try:
        with contextlib.closing(_login(first)) as client:
            token = _token(client)
        headers = {"Authorization": f"token {token}"}
        api = f"{first.url}/services/gpupool/api/v1"
        lease = httpx.post(
            f"{api}/leases",
            json={"profile": "mig-3g", "owner_kind": "server", "owner_name": ""},
            headers=headers,
            timeout=10,
        )
        assert lease.status_code == 201, lease.text
        lease_id = lease.json()["id"]
    finally:
        first.stop()
    assert (state / "jupyterhub.sqlite").is_file() and (state / "gpupool.sqlite").is_file()
    second = _start(tmp, state, port, extra)
    try:
        assert second.password == first.password
        _login(second).close()
        # the token lives in the hub's database, the lease in the service's: both survived
        again = httpx.get(f"{api}/leases/{lease_id}", headers=headers, timeout=10)
        assert again.status_code == 200, f"{again.text}\n{second.log_tail()}"
        assert again.json()["user"] == "demo"
    finally:
        second.stop()


def test_the_demo_login_is_refused_on_a_public_address(tmp_path: Path) -> None:
    result = subprocess.run(
        _up_command("--ip", "0.0.0.0", "--pool", str(DEMO_POOL), "--state-dir", str(tmp_path / "state")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "demo login" in result.stderr and "hub_config/jupyterhub_config.py" in result.stderr
    assert "password" not in result.stdout
    assert not (tmp_path / "state").exists()


def _config_classes() -> dict[str, Any]:
    from jupyterhub.app import JupyterHub
    from jupyterhub.auth import Authenticator, PAMAuthenticator
    from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
    from jupyterhub.proxy import ConfigurableHTTPProxy
    from jupyterhub.spawner import Spawner

    from gpupool.spawner.hub.spawner import LocalGPUSpawner, SimpleLocalGPUSpawner

    classes = (
        JupyterHub,
        ConfigurableHTTPProxy,
        Authenticator,
        PAMAuthenticator,
        SharedPasswordAuthenticator,
        Spawner,
        LocalGPUSpawner,
        SimpleLocalGPUSpawner,
    )
    return {cls.__name__: cls for cls in classes}


def _load(path: Path) -> Config:
    loader = PyFileConfigLoader(path.name, path=str(path.parent))
    return loader.load_config()


def _assert_every_option_exists(config: Config) -> None:
    classes = _config_classes()
    for section, options in config.items():
        cls = classes[section]
        unknown = set(options) - set(cls.class_trait_names(config=True))
        assert not unknown, f"{section} has no options {sorted(unknown)}"


def test_the_production_config_loads_and_names_only_real_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # it keeps its state in the working directory
    config = _load(ROOT / "hub_config" / "jupyterhub_config.py")
    _assert_every_option_exists(config)
    assert config.JupyterHub.spawner_class == "gpupool.spawner.hub.spawner.LocalGPUSpawner"
    assert config.JupyterHub.authenticator_class == "pam"
    token = (tmp_path / "gpupool-hub-token").read_text().strip()
    assert config.LocalGPUSpawner.service_api_token == token
    assert {"name": "gpupool-hub", "api_token": token} in config.JupyterHub.services


def test_the_embedded_config_loads_and_names_only_real_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = prepare(state_dir=tmp_path / "state", pool=str(DEMO_POOL))
    monkeypatch.setenv(ENV, prepared.env[ENV])
    config = _load(embedded_config())
    _assert_every_option_exists(config)
    assert config.JupyterHub.spawner_class == "gpupool.spawner.hub.spawner.SimpleLocalGPUSpawner"
    assert config.SharedPasswordAuthenticator.admin_password == demo_password(tmp_path / "state")
    (service,) = (s for s in config.JupyterHub.services if s["name"] == "gpupool")
    assert service["environment"]["GPUPOOL_POOL"] == str(DEMO_POOL.resolve())
