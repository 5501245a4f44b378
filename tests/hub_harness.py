"""A real JupyterHub for tests and benchmarks: its config with the gpupool service, its process and its REST API.

The hub runs as a subprocess on loopback (DummyAuthenticator, sqlite in a scratch folder), with
configurable-http-proxy from ``.node/`` (``make test`` installs it with npm). ``write_hub_config`` writes the
config; ``RunningHub`` starts it, waits for it (and the gpupool service), makes users and tokens through the
REST API with an admin service token, and stops it with everything it left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import httpx
from polling import pauses
from ports import free_port

from gpupool.spawner.hub.compat import service_start_timeout
from gpupool.spawner.orphans import PARENT_ENV

ROOT = Path(__file__).resolve().parent.parent
CHP_BIN = ROOT / ".node" / "node_modules" / ".bin"
SINGLEUSER = Path(sys.executable).parent / "jupyterhub-singleuser"
SERVICE = "gpupool"
GPU_SPAWNER = "gpupool.spawner.hub.spawner.SimpleLocalGPUSpawner"
PORT_NAMES = ("proxy_port", "proxy_api_port", "hub_port", "service_port")
ADMIN_SCOPES = ("admin:users", "tokens", "custom:gpupool:admin", f"access:services!service={SERVICE}")
CUSTOM_SCOPES = {
    "custom:gpupool:leases": {"description": "Create and release gpupool leases for any user"},
    "custom:gpupool:admin": {"description": "Read and release every gpupool lease"},
}


def free_ports() -> dict[str, int]:
    """One free port for each of the proxy, the proxy's API, the hub and the gpupool service."""
    return {name: free_port() for name in PORT_NAMES}


def service_command() -> list[str]:
    """The command that runs the gpupool service with this interpreter."""
    return [sys.executable, "-m", "gpupool.spawner.service"]


def write_hub_config(
    tmp: Path,
    ports: Mapping[str, int],
    *,
    admin_token: str,
    admin_name: str = "test-admin",
    admin_scopes: Sequence[str] = ADMIN_SCOPES,
    pool_file: Path | None = None,
    service_env: Mapping[str, str] | None = None,
    hub_client_token: str | None = None,
    spawner_class: str | None = None,
    spawn_timeout: int = 30,
    extra_config: Iterable[str] = (),
) -> Path:
    """Write ``tmp/jupyterhub_config.py`` and return its path.

    With ``pool_file`` the gpupool service runs as a managed service on that pool (``GPUPOOL_POOL``, a
    ``GPUPOOL_DB_URL`` in ``tmp``, plus ``service_env``), with a ``hub-client`` service holding
    ``hub_client_token`` and the role the spawner needs. With ``spawner_class`` the hub spawns
    ``jupyterhub-singleuser`` with it (homes under ``tmp/homes``); ``extra_config`` lines go last.
    """
    services: list[dict[str, Any]] = [{"name": admin_name, "api_token": admin_token}]
    roles: list[dict[str, Any]] = [
        {"name": admin_name, "scopes": list(admin_scopes), "services": [admin_name]}
    ]
    lines = [
        "c = get_config()  # noqa",
        'c.JupyterHub.ip = "127.0.0.1"',
        f"c.JupyterHub.port = {ports['proxy_port']}",
        'c.JupyterHub.hub_ip = "127.0.0.1"',
        f"c.JupyterHub.hub_port = {ports['hub_port']}",
        f'c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{ports["proxy_api_port"]}"',
        f'c.JupyterHub.db_url = "sqlite:///{tmp}/jupyterhub.sqlite"',
        f'c.JupyterHub.cookie_secret_file = "{tmp}/cookie_secret"',
        f'c.JupyterHub.pid_file = "{tmp}/jupyterhub.pid"',
        f'c.ConfigurableHTTPProxy.pid_file = "{tmp}/proxy.pid"',
        'c.JupyterHub.authenticator_class = "dummy"',
        "c.Authenticator.allow_all = True",
        "c.JupyterHub.cleanup_servers = True",
        f"c.JupyterHub.custom_scopes = {CUSTOM_SCOPES!r}",
    ]
    if spawner_class is not None:
        (tmp / "homes").mkdir(parents=True, exist_ok=True)
        lines += [
            f"c.JupyterHub.spawner_class = {spawner_class!r}",
            f"c.Spawner.cmd = [{str(SINGLEUSER)!r}]",
            'c.Spawner.args = ["--allow-root"]  # harmless for other users; CI containers often run as root',
            f"c.Spawner.start_timeout = {spawn_timeout}",
            f"c.Spawner.http_timeout = {spawn_timeout}",
        ]
        if spawner_class == GPU_SPAWNER:
            lines += [
                f'c.SimpleLocalGPUSpawner.home_root = "{tmp}/homes"',
                f"c.SimpleLocalGPUSpawner.service_api_token = {hub_client_token!r}",
            ]
    if pool_file is not None:
        environment = {"GPUPOOL_POOL": str(pool_file), "GPUPOOL_DB_URL": f"sqlite:///{tmp}/gpupool.sqlite"}
        services += [
            {
                "name": SERVICE,
                "url": f"http://127.0.0.1:{ports['service_port']}",
                "command": service_command(),
                "environment": environment | dict(service_env or {}),
                # JupyterHub exits if a managed service is not up in time; CI starts cold
                **service_start_timeout(120),
                # as in hub_config: browsers log in to its pages through the hub, admins keep their scope
                "oauth_no_confirm": True,
                "oauth_client_allowed_scopes": ["custom:gpupool:admin"],
            },
            {"name": "hub-client", "api_token": hub_client_token},
        ]
        access = f"access:services!service={SERVICE}"
        roles += [
            {"name": "user", "scopes": ["self", access]},
            {"name": "gpupool-hub", "scopes": ["custom:gpupool:leases", access], "services": ["hub-client"]},
        ]
    lines += [f"c.JupyterHub.services = {services!r}", f"c.JupyterHub.load_roles = {roles!r}", *extra_config]
    path = tmp / "jupyterhub_config.py"
    path.write_text("\n".join(lines) + "\n")
    return path


def log_tail(log: Path, chars: int = 6000) -> str:
    """The end of a log, without the proxy's multi-line connection errors."""
    noise = ("ConfigProxy", "    at ", "  errno", "  code:", "  syscall", "  address", "  port:", "}")
    lines = [line for line in log.read_text(errors="replace").splitlines() if not line.startswith(noise)]
    return "\n".join(lines)[-chars:]


def _raise(message: str) -> NoReturn:
    raise RuntimeError(message)


def wait_for(
    check: Callable[[], bool],
    what: str,
    log: Path,
    timeout: float = 30,
    *,
    process: subprocess.Popen[bytes] | None = None,
    fail: Callable[[str], NoReturn] = _raise,
) -> None:
    """Poll ``check`` (HTTP errors count as no) until true; else ``fail`` with ``what`` and the log's end."""
    for _ in pauses(timeout):
        if process is not None and process.poll() is not None:
            fail(f"{what}: the hub exited; log:\n{log_tail(log)}")
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
    fail(f"{what} within {timeout}s; log:\n{log_tail(log)}")


def answers(url: str) -> Callable[[], bool]:
    """A check that ``url`` answers 200."""
    return lambda: httpx.get(url, timeout=2).status_code == 200


class RunningHub:
    """A JupyterHub subprocess on the config in ``tmp``; a context manager that starts, waits for and stops it.

    ``pids`` collects single-user servers to kill at the end if the hub left them; ``extra`` collects other
    processes (a service started by hand) to kill at the end.
    """

    def __init__(
        self,
        tmp: Path,
        ports: Mapping[str, int],
        admin_token: str,
        *,
        service: bool = True,
        service_env: Mapping[str, str] | None = None,
        fail: Callable[[str], NoReturn] = _raise,
        startup_timeout: float = 60,
        stop_timeout: float = 20,
    ) -> None:
        self.tmp = tmp
        self.ports = dict(ports)
        self.admin_token = admin_token
        self.service = service
        self.fail = fail
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.tokens: dict[str, str] = {"admin": admin_token}
        self.pids: set[int] = set()
        self.extra: list[subprocess.Popen[bytes]] = []
        self.process: subprocess.Popen[bytes] | None = None
        self._service_environ: dict[str, str] | None = None  # of the service kill_service killed first
        self.service_env = {  # what the managed service is run with, to run one by hand
            **(service_env or {}),
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{self.ports['service_port']}",
            "JUPYTERHUB_API_URL": f"http://127.0.0.1:{self.ports['hub_port']}/hub/api",
            "JUPYTERHUB_SERVICE_PREFIX": f"/services/{SERVICE}/",
            "JUPYTERHUB_SERVICE_NAME": SERVICE,
        }

    @property
    def url(self) -> str:
        """The proxy's public URL."""
        return f"http://127.0.0.1:{self.ports['proxy_port']}"

    @property
    def hub_api(self) -> str:
        return f"{self.url}/hub/api"

    @property
    def service_api(self) -> str:
        return f"{self.url}/services/{SERVICE}/api/v1"

    @property
    def log(self) -> Path:
        return self.tmp / "hub.log"

    def log_tail(self) -> str:
        return log_tail(self.log)

    def wait_for(self, check: Callable[[], bool], what: str, timeout: float = 30) -> None:
        """``wait_for`` with this hub's log and failure."""
        wait_for(check, what, self.log, timeout, fail=self.fail)

    def start(self) -> None:
        """Start the hub process (the proxy from ``.node/`` first on its PATH)."""
        if shutil.which("configurable-http-proxy", path=str(CHP_BIN)) is None:
            self.fail(
                f"configurable-http-proxy is not in {CHP_BIN}; run `make test` (it installs it with npm)"
            )
        env = os.environ | {"PATH": f"{CHP_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("GPUPOOL_API_TOKEN", None)
        with self.log.open("ab") as out:  # a restarted hub goes on in the same log
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(self.tmp / "jupyterhub_config.py")],
                cwd=self.tmp,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_up(self) -> None:
        """Wait until the hub's API, and the gpupool service's when it runs one, answer through the proxy."""
        wait_for(
            answers(f"{self.hub_api}/"),
            "JupyterHub did not answer",
            self.log,
            self.startup_timeout,
            process=self.process,
            fail=self.fail,
        )
        if self.service:
            wait_for(
                answers(f"{self.service_api}/openapi.json"),
                "the gpupool service did not answer",
                self.log,
                self.startup_timeout,
                process=self.process,
                fail=self.fail,
            )

    def __enter__(self) -> RunningHub:
        self.start()
        try:
            self.wait_up()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def admin(self, timeout: float = 20) -> httpx.Client:
        """A client with the admin service token."""
        return httpx.Client(headers={"Authorization": f"token {self.admin_token}"}, timeout=timeout)

    def as_user(self, name: str) -> httpx.Client:
        """A client on the gpupool service's API with ``name``'s token (``admin`` and any ``token_for``)."""
        return httpx.Client(
            base_url=self.service_api, headers={"Authorization": f"token {self.tokens[name]}"}, timeout=10
        )

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One call to the hub's REST API (``path`` below ``/hub/api``) as the admin service."""
        headers = {"Authorization": f"token {self.admin_token}"}
        return httpx.request(method, f"{self.hub_api}/{path.lstrip('/')}", headers=headers, timeout=20, **kw)

    def create_user(self, name: str) -> None:
        """Create the hub user ``name``."""
        created = self.api("POST", f"users/{name}")
        if created.status_code != 201:
            self.fail(f"creating {name}: {created.status_code} {created.text}")

    def token_for(self, name: str) -> str:
        """A new API token of user ``name``, kept in ``tokens`` for ``as_user``."""
        token = self.api("POST", f"users/{name}/tokens", json={"note": "test"})
        if token.status_code != 201:
            self.fail(f"a token for {name}: {token.status_code} {token.text}")
        self.tokens[name] = token.json()["token"]
        return self.tokens[name]

    def crash(self) -> None:
        """``kill -9`` the hub process alone, as the kernel's OOM killer would: its proxy and its servers run in
        sessions of their own and live on; its managed service ends with it (see :mod:`gpupool.spawner.orphans`)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def restart(self) -> None:
        """Start the hub again on the same config and database (after :meth:`crash`) and wait for it. It
        stops the proxy it finds in its pid file and starts its own, and a new service, which restores every
        lease and the queue from the store (a service started by hand, not the hub's, would still hold the
        port: the new one then stops and the old one goes on serving)."""
        self.start()
        self.wait_up()

    def service_pids(self) -> list[int]:
        """The gpupool service processes on this hub's store (managed or started by hand)."""
        return service_pids(self.service_env.get("GPUPOOL_DB_URL") or f"sqlite:///{self.tmp}/gpupool.sqlite")

    def kill_service(self) -> None:
        """``kill -9`` every gpupool service process of this hub and wait until they are gone; the environment
        of the one that served is kept for :meth:`start_service`."""
        for pid in self.service_pids():
            with contextlib.suppress(OSError):
                environ = environ_of(pid)
                os.kill(pid, signal.SIGKILL)
                self._service_environ = self._service_environ or environ
        self.wait_for(lambda: not self.service_pids(), "the gpupool service did not die", timeout=10)

    def start_service(self) -> subprocess.Popen[bytes]:
        """Start the gpupool service again by hand, with the command and environment the killed one ran with
        (as an admin would), and wait until it answers through the proxy; it is killed at :meth:`stop`."""
        if self._service_environ is None:
            self.fail("start_service: no killed service to start again (call kill_service first)")
        with (self.tmp / "service-by-hand.log").open("ab") as log:
            # started by hand, it is not the hub's child: without the hub's pid it does not look for it
            by_hand = {k: v for k, v in self._service_environ.items() if k != PARENT_ENV}
            process = subprocess.Popen(
                service_command(),
                env=by_hand,
                cwd=self.tmp,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.extra.append(process)
        self.wait_for(
            answers(f"{self.service_api}/openapi.json"), "the restarted service did not answer", timeout=60
        )
        return process

    def stop(self) -> None:
        """Stop the hub, then kill whatever it left: extra processes, single-user servers, its proxy, and a
        service that outlived a crashed hub."""
        for extra in self.extra:
            extra.kill()
            extra.wait()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._reap_proxy()
        if self.service:
            for pid in self.service_pids():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        for pid in self.pids:  # the hub stops its servers on exit; make sure of it, sparing a reused pid
            with contextlib.suppress(OSError):
                if environ_of(pid).get("HOME", "").startswith(f"{self.tmp}/homes/"):
                    os.killpg(pid, signal.SIGKILL)

    def _reap_proxy(self) -> None:
        """Kill this hub's proxy if it outlived the hub (a hub that exits on a crashed service leaves it)."""
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.tmp / "proxy.pid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if "configurable-http-proxy" in cmdline and f"--port {self.ports['proxy_port']} " in cmdline:
                os.kill(pid, signal.SIGTERM)


def service_pids(db_url: str) -> list[int]:
    """The running gpupool service processes whose store is ``db_url``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"gpupool.spawner.service" in cmdline and f"GPUPOOL_DB_URL={db_url}\0".encode() in environ:
            pids.append(int(proc.name))
    return pids


def environ_of(pid: int) -> dict[str, str]:
    """The environment of process ``pid``."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(): value.decode() for key, value in pairs}
