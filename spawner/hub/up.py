"""``gpupool up``: JupyterHub, its proxy, the gpupool service and the idle culler, with state in one folder.

:func:`prepare` checks everything a start needs (proxy binary, pool, demo login only on loopback), creates the
state folder and its secrets, and returns the command line and environment of the hub; :func:`run` prints
what the user needs and then *becomes* the hub (JupyterHub runs in this process, in that environment), so
Ctrl-C and SIGTERM reach JupyterHub directly and it stops the proxy and the services it started.

The embedded configuration, ``hub_config/embedded.py``, reads the :class:`UpSettings` from the environment
variable ``GPUPOOL_UP`` (JSON) and derives every port, path and secret from them; ``-f`` files are loaded
after it. Internal ports follow ``--port`` as JupyterHub's defaults do for 8000 (proxy API ``port + 1``, hub
``port + 81``, gpupool service ``port + 2101``) unless ``--proxy-api-port``, ``--hub-port``, ``--service-port``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import orphans
from ..files.quotas_file import EXAMPLE_QUOTAS
from ..names import SERVICE_FILE, SERVICE_NAME, SERVICE_PREFIX
from .compat import service_start_timeout
from .up_checks import UpError as UpError  # the error gpupool up's callers catch
from .up_checks import check_data_files, check_ports, check_request, kubeconfig_namespace
from .up_environment import UP_SETTINGS_ENV, cull_every_seconds, passed_on, user_path
from .up_running import check_not_running

if TYPE_CHECKING:
    from ..backends.discovery import DiscoveredPool

ENV = UP_SETTINGS_ENV
SERVICE = SERVICE_NAME
SPAWNER_CLIENT = "gpupool-hub"  # the token-only service whose token the spawners use
CULLER = "jupyterhub-idle-culler"
DEMO_USER = "demo"
CHP = "configurable-http-proxy"
# With --kubeconfig: where the servers' pods go (unless the kubeconfig's context names a namespace), and the
# image they name. On ``gpupool kube up``'s cluster the image is never pulled: its simulated kubelet runs the
# pod's command from this environment.
KUBE_NAMESPACE = "default"
KUBE_LOCAL_IMAGE = "gpupool-singleuser:local"
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the checkout, for an editable install

CUSTOM_SCOPES = {
    "custom:gpupool:leases": {"description": "Create, read and release gpupool leases for any user"},
    "custom:gpupool:admin": {"description": "Read and release every gpupool lease, use every profile"},
}


@dataclass(frozen=True)
class UpSettings:
    """What ``gpupool up`` was asked for, as the embedded config receives it."""

    state_dir: str
    ip: str = "127.0.0.1"
    port: int = 8000
    # the proxy's API, the hub and the service on loopback; None: derived from port (+1, +81, +2101)
    ports: tuple[int | None, int | None, int | None] = (None, None, None)
    pool: str | None = None  # a pool file; None: the service discovers (NVML, else the demo pool)
    extra_config: tuple[str, ...] = ()
    demo_login: bool = True
    proxy_command: str = CHP
    kubeconfig: str | None = None  # a cluster to spawn on with KubeGPUSpawner (e.g. ``gpupool kube up``'s)
    kube_namespace: str = KUBE_NAMESPACE  # its servers' and jobs' namespace: the kubeconfig context's
    # Started as root: each user's servers and jobs run as an account of their own (see user_accounts), with
    # homes in one folder of root's and Python from an environment every account can run (user_environment).
    own_accounts: bool = False
    homes: str | None = None
    user_bin: str | None = None

    @property
    def state(self) -> Path:
        return Path(self.state_dir)

    @property
    def cull_every(self) -> int:
        return cull_every_seconds()

    @property
    def proxy_api_port(self) -> int:
        return self.ports[0] or self.port + 1

    @property
    def hub_port(self) -> int:
        return self.ports[1] or self.port + 81

    @property
    def service_port(self) -> int:
        return self.ports[2] or self.port + 2101

    @property
    def public_url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"

    @property
    def service_url(self) -> str:
        """Where the hub's spawners reach the service directly, prefix included."""
        return f"http://127.0.0.1:{self.service_port}{SERVICE_PREFIX}"

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> UpSettings:
        """The settings ``gpupool up`` passed; without them (``jupyterhub -f embedded.py``), defaults with
        the state in ``.gpupool/`` of the working directory."""
        text = env.get(ENV)
        if not text:
            return cls(state_dir=str(Path.cwd() / ".gpupool"), proxy_command=find_proxy())
        data = json.loads(text)
        data |= {
            "extra_config": tuple(data.get("extra_config") or ()),
            "ports": tuple(data.get("ports") or (None,) * 3),
        }
        return cls(**data)


def find_proxy(project: Path = PROJECT_ROOT) -> str:
    """configurable-http-proxy from the project's ``.node/`` (``make run`` installs it there), else PATH."""
    for folder in (
        project / ".node" / "node_modules" / ".bin",
        Path.cwd() / ".node" / "node_modules" / ".bin",
    ):
        found = shutil.which(CHP, path=str(folder))
        if found:
            return found
    found = shutil.which(CHP)
    if found:
        return found
    raise UpError(
        f"{CHP} is not installed: run `make run` in the gpupool checkout (it installs it into .node/ with npm), "
        f"or `npm install -g {CHP}`"
    )


def read_or_create_secret(path: Path, nbytes: int = 32) -> str:
    """The secret stored at ``path``, made (URL-safe, readable by the owner only) on first use."""
    if path.exists():
        secret = path.read_text().strip()
        if secret:
            return secret
    secret = secrets.token_urlsafe(nbytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret + "\n")
    return secret


def demo_password(state: Path) -> str:
    """The demo user's password: 32 characters or more, as JupyterHub asks of an admin password."""
    return read_or_create_secret(state / "demo-password", 24)


def spawner_token(state: Path) -> str:
    """The API token the spawners call the service with (the ``gpupool-hub`` service's)."""
    return read_or_create_secret(state / "gpupool-hub-token")


def store_file(state: Path) -> Path:
    """The service's SQLite database in the state folder."""
    return state / "gpupool.sqlite"


def service_environment(settings: UpSettings) -> dict[str, str]:
    """The gpupool service's own settings (see ``python -m gpupool.spawner.service``)."""
    env = passed_on() | {
        "GPUPOOL_DB_URL": f"sqlite:///{store_file(settings.state)}",
        "GPUPOOL_QUOTAS": os.environ.get("GPUPOOL_QUOTAS") or str(EXAMPLE_QUOTAS),
        # a server on GPU devices nobody leased to it is stopped once two passes in a row confirm it
        "GPUPOOL_STOP_UNLEASED": "1",
        # the demo hub: without GPUs it runs on the simulated demo pool, and says so everywhere
        "GPUPOOL_SIMULATED_FALLBACK": "1",
        # jobs find the same homes as the servers (SimpleLocalGPUSpawner.home_root in embedded.py) and run as
        # the same account: the hub's own, or as root the unprivileged one, with its Python first on PATH
        "GPUPOOL_JOB_HOME_ROOT": settings.homes or str(settings.state / "homes"),
    }
    if settings.own_accounts and settings.user_bin:
        env |= {"GPUPOOL_JOB_ACCOUNT_PER_USER": "1", "PATH": user_path(settings.user_bin)}
    if settings.pool:
        env["GPUPOOL_POOL"] = settings.pool
    if settings.kubeconfig:
        env |= {
            "GPUPOOL_BACKEND": "kubernetes",
            "KUBECONFIG": settings.kubeconfig,
            "GPUPOOL_KUBE_NAMESPACE": settings.kube_namespace,
            "GPUPOOL_KUBE_JOB_IMAGE": KUBE_LOCAL_IMAGE,
        }
    return env


def services(settings: UpSettings) -> list[dict[str, object]]:
    """The managed gpupool service, the managed idle culler, and the spawners' token-only service."""
    return [
        {
            "name": SERVICE,
            "url": f"http://127.0.0.1:{settings.service_port}",
            "command": [sys.executable, "-m", "gpupool.spawner.service"],
            "environment": service_environment(settings) | orphans.parent_environment(),
            "cwd": str(settings.state),
            # its pages let logged-in users in through the hub's OAuth without a confirmation page; admins'
            # logins carry the admin scope (JupyterHub drops it for everyone else)
            "oauth_no_confirm": True,
            "oauth_client_allowed_scopes": ["custom:gpupool:admin"],
            # a cold first start (imports from disk, a busy machine) can take longer than the 30 s default,
            # and JupyterHub exits when a managed service is not up in time
            **service_start_timeout(120),
        },
        {
            "name": CULLER,
            "command": culler_command(cull_every=settings.cull_every),
            # the cull arbiter asks the service about GPU activity and records its warnings there
            "environment": passed_on()
            | {"GPUPOOL_SERVICE_URL": settings.service_url, **orphans.parent_environment()},
        },
        {"name": SPAWNER_CLIENT, "api_token": spawner_token(settings.state)},
    ]


def templates() -> Path:
    """``hub_config/templates``: JupyterHub's pages with gpupool's additions (cull warnings on the home page)."""
    return Path(str(resources.files("gpupool.hub_config").joinpath("templates")))


def culler_config() -> Path:
    """``hub_config/idle_culler_config.py``: the culler with gpupool's cull arbiter."""
    return Path(str(resources.files("gpupool.hub_config").joinpath("idle_culler_config.py")))


def culler_command(timeout: int = 3600, cull_every: int = 60) -> list[str]:
    """jupyterhub-idle-culler with gpupool's arbiter: ``timeout`` applies to servers whose profile sets no
    ``idle_timeout``; passes every ``cull_every`` seconds, so GPU limits and warnings hold to about a minute."""
    culler = [
        sys.executable,
        "-m",
        "jupyterhub_idle_culler",
        f"--timeout={timeout}",
        f"--cull-every={cull_every}",
    ]
    return orphans.command([*culler, f"--config={culler_config()}"])  # a killed hub takes its culler along


# the culler reads lease ids from server state, and GPU activity and warnings from the gpupool service
CULLER_SCOPES = (
    "list:users",
    "read:users:activity",
    "read:servers",
    "delete:servers",
    "admin:server_state",
    "custom:gpupool:admin",
    f"access:services!service={SERVICE}",
)


# JupyterHub's own scopes for the server role, which a role of that name replaces rather than extends.
SERVER_SCOPES = ("users:activity!user", "access:servers!server")


def roles(admins: list[str]) -> list[dict[str, object]]:
    """Users may use the service; the spawners' token may lease for anyone; admins see every lease."""
    access = f"access:services!service={SERVICE}"
    return [
        {"name": "user", "scopes": ["self", access]},
        # a server's own token (JUPYTERHUB_API_TOKEN) may call the service too: gpupool.widgets uses it
        {"name": "server", "scopes": [*SERVER_SCOPES, access]},
        {"name": "gpupool-hub", "scopes": ["custom:gpupool:leases", access], "services": [SPAWNER_CLIENT]},
        {"name": "gpupool-admin", "scopes": ["custom:gpupool:admin", access], "users": admins},
        {"name": "idle-culler", "scopes": list(CULLER_SCOPES), "services": [CULLER]},
        # the service reconciles leases with the servers that really run (stopping one without a lease), and
        # checks the group names the profiles and quotas files use
        {
            "name": "gpupool-service",
            "scopes": ["list:users", "read:servers", "delete:servers", "list:groups"],
            "services": [SERVICE],
        },
    ]


@dataclass(frozen=True)
class Prepared:
    """A ready start: JupyterHub's arguments and environment, and the lines to print."""

    hub_args: list[str]
    env: dict[str, str]
    messages: list[str]  # the last (where to log in) once the hub has started: a failed start invites no one

    @property
    def argv(self) -> list[str]:
        """The same start as a command line of its own (``python -m gpupool.spawner.hub.app …``)."""
        return [sys.executable, "-m", "gpupool.spawner.hub.app", *self.hub_args]


def prepare(
    *,
    state_dir: str | Path,
    ip: str = "127.0.0.1",
    port: int = 8000,
    ports: tuple[int | None, int | None, int | None] = (None, None, None),
    pool: str | None = None,
    extra_config: tuple[str, ...] = (),
    demo_login: bool = True,
    kubeconfig: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Prepared:
    """Check the request, create the state folder and its secrets; raise :class:`UpError` saying what to fix."""
    check_request(ip, pool, extra_config, demo_login, kubeconfig)
    state = Path(state_dir).resolve()
    check_not_running(state, ip, check_ports(port, ports))
    check_data_files(environ)
    cull_every_seconds(environ)  # a bad GPUPOOL_CULL_EVERY_SECONDS stops gpupool up here, naming it
    # here, not at the top: the hub's process imports this module too (embedded.py) and discovers nothing
    from ..backends.discovery import discover_pool

    found = None if kubeconfig else discover_pool(pool)
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)  # the databases, the proxy's token and the cookie secret: no one else's to read
    account = None if kubeconfig or os.geteuid() != 0 else _as_root()
    settings = UpSettings(
        state_dir=str(state),
        ip=ip,
        port=port,
        ports=ports,
        pool=str(Path(found.source).resolve()) if found and found.backend == "simulated" else None,
        extra_config=tuple(str(Path(e).resolve()) for e in extra_config),
        demo_login=demo_login,
        proxy_command=find_proxy(),
        kubeconfig=str(Path(kubeconfig).resolve()) if kubeconfig else None,
        kube_namespace=kubeconfig_namespace(kubeconfig) if kubeconfig else KUBE_NAMESPACE,
        **(account or {}),
    )
    spawner_token(state)  # made now: with service.json, the gpupool commands run here find the live service
    (state / SERVICE_FILE).write_text(json.dumps({"url": settings.service_url}))
    messages = _start_messages(settings, found)
    env = dict(environ) | {ENV: settings.to_env()}
    if settings.kubeconfig:
        env["KUBECONFIG"] = settings.kubeconfig  # KubeSpawner's client reads it when first imported
    return Prepared(["-f", str(embedded_config())], env, messages)


def _start_messages(settings: UpSettings, found: DiscoveredPool | None) -> list[str]:
    """What ``gpupool up`` tells the terminal: the pool, the state, and last where to log in."""
    if found is None:
        messages = [
            f"gpupool: pool from the Kubernetes cluster of {settings.kubeconfig}; servers are pods in namespace "
            f"{settings.kube_namespace} (KubeGPUSpawner)"
        ]
    else:
        messages = [*([f"gpupool: {found.note}"] if found.note else []), f"gpupool: {found.summary}"]
    messages.append(f"gpupool: state in {settings.state_dir}")
    if settings.own_accounts:
        messages.append(
            f"gpupool: started as root, so each user's servers and jobs run as a system account of their own "
            f"(gp-<name>, made at their first start), with homes in {settings.homes} and Python from "
            f"{settings.user_bin}"
        )
    messages.append(
        f"Log in at {settings.public_url} as {DEMO_USER} with password {demo_password(Path(settings.state_dir))}"
        if settings.demo_login
        else f"JupyterHub at {settings.public_url}"
    )
    return messages


def _as_root() -> dict[str, Any]:
    """As root: the folder of the users' homes (root's) and an environment every account can run (built when
    missing), as :class:`UpSettings` fields; the users' accounts are made at their first start."""
    from ..user_accounts import DEFAULT_HOMES, AccountError, prepare_homes
    from .user_environment import UserEnvironmentError, ensure_user_environment

    try:
        prepare_homes(DEFAULT_HOMES)
        environment = ensure_user_environment(PROJECT_ROOT, say=lambda line: print(line, flush=True))
    except (AccountError, UserEnvironmentError) as error:
        raise UpError(str(error)) from None
    return {"own_accounts": True, "homes": DEFAULT_HOMES, "user_bin": str(environment.bin)}


def embedded_config() -> Path:
    """``hub_config/embedded.py``, the configuration ``gpupool up`` starts JupyterHub with."""
    return Path(str(resources.files("gpupool.hub_config").joinpath("embedded.py")))


def run(prepared: Prepared) -> None:
    """Print the start-up lines, then run JupyterHub in this process, in the prepared environment, until it
    stops. As ``exec`` of :attr:`Prepared.argv` would, less a second interpreter's start and the imports this
    one has done already (a tenth of a second of the login page's wait)."""
    for line in prepared.messages[:-1]:
        print(line, flush=True)
    sys.stderr.flush()
    os.environ.clear()
    os.environ.update(prepared.env)  # before JupyterHub imports anything that reads it (KUBECONFIG)
    from .app import GpupoolHub
    from .left_running import left_running_message

    GpupoolHub.instance(started_message=prepared.messages[-1])  # the instance launch_instance runs
    GpupoolHub.launch_instance(argv=prepared.hub_args)
    state = UpSettings.from_env(prepared.env).state
    said = left_running_message(store_file(state), state) if store_file(state).is_file() else None
    if said:
        print(said, flush=True)
