"""``gpupool up`` end to end: the real command starts JupyterHub, the proxy, the gpupool service and the culler.

Each hub runs as a subprocess (``up_harness``: own process group, state in a tmp folder, free ports) and is
stopped with SIGTERM, which JupyterHub passes on to the proxy and the services it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from hub_harness import environ_of
from jupyterhub.app import JupyterHub
from polling import until
from traitlets.config import Config, PyFileConfigLoader
from up_harness import (
    api_token,
    demo_hub_api,
    extra_config,
    free_port_family,
    login,
    require_proxy,
    start_demo_server,
    start_up,
    up_command,
)

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.client import GpupoolError
from gpupool.spawner.hub.spawner import LocalGPUSpawner, SimpleLocalGPUSpawner
from gpupool.spawner.hub.up import ENV, demo_password, embedded_config, prepare, spawner_token
from gpupool.spawner.service.jobs.processes import find_leader
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url
from gpupool.spawner.user_accounts import DEFAULT_HOMES, account_name
from gpupool.widgets import Connection, submit

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def start(tmp_path: Path) -> tuple[Path, int]:
    """A tmp folder and a free port family; each test stops the hubs it starts."""
    require_proxy()
    return tmp_path, free_port_family()


def test_the_demo_user_logs_in_with_the_printed_password(start: tuple[Path, int]) -> None:
    tmp, port = start
    up = start_up(tmp, tmp / "state", port, extra_config(tmp))
    try:
        assert up.url == f"http://127.0.0.1:{port}"
        with contextlib.closing(login(up)) as client:
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
    up = start_up(tmp, tmp / "state", port, extra_config(tmp))
    try:
        assert "simulated" in up.log.read_text().split("Log in at")[0]  # the start-up line says so
        with contextlib.closing(login(up)) as client:
            token = api_token(client)
        api = f"{up.url}/services/gpupool/api/v1"
        pool = httpx.get(f"{api}/pool", headers={"Authorization": f"token {token}"}, timeout=10)
        assert pool.status_code == 200, f"{pool.text}\n{up.log_tail()}"
        assert pool.json()["backend"] == "simulated"
    finally:
        up.stop()


def test_a_notebook_server_reaches_the_service_with_its_own_token(start: tuple[Path, int]) -> None:
    """What ``gpupool.widgets`` relies on: the server's environment names the service, and the server's own
    token (acting as its user) may call it."""
    tmp, port = start
    up = start_up(tmp, tmp / "state", port, extra_config(tmp))
    try:
        with contextlib.closing(demo_hub_api(up)) as hub:
            server = start_demo_server(up, hub)
            environ = environ_of(int(server["state"]["pid"]))
            connection = Connection(environ=environ)
            try:
                profiles = connection.call("GET", "profiles")
                assert "cpu" in {p["slug"] for p in profiles}
                assert connection.call("GET", "leases")[0]["id"] == environ["GPUPOOL_LEASE_ID"]
            finally:
                connection.close()
            assert hub.delete("/users/demo/server").status_code in (202, 204)
    finally:
        up.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: gpupool up then makes an account for each user")
def test_as_root_each_users_server_and_jobs_run_as_an_account_of_their_own(start: tuple[Path, int]) -> None:
    """Finding 7 of the first hostile-user review: under ``gpupool up`` as root every server ran as root. Then
    every user's code ran as one account, ``gpupool-demo``, and the second review's job read another user's
    hub token from their server's ``/proc/<pid>/environ`` and their files, and acted as them. Now each user
    runs as ``gp-<name>``, and another user's job is refused both."""
    tmp, port = start
    up = start_up(tmp, tmp / "state", port, extra_config(tmp))
    try:
        with contextlib.closing(demo_hub_api(up)) as hub:
            pid = int(start_demo_server(up, hub)["state"]["pid"])  # the account is made at the first start
            demo = pwd.getpwnam(account_name("demo"))
            assert _uids(pid) == {demo.pw_uid}
            assert b"--allow-root" not in Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = environ_of(pid)
            home = Path(environ["HOME"])
            assert (home, home.stat().st_uid, home.stat().st_mode & 0o777) == (
                Path(DEFAULT_HOMES, "demo"),
                demo.pw_uid,
                0o700,
            )
            assert (Path(DEFAULT_HOMES).stat().st_uid, Path(DEFAULT_HOMES).stat().st_mode & 0o777) == (
                0,
                0o711,
            )
            assert "run as a system account of their own" in up.log.read_text()  # the log says so
            (home / "secret.txt").write_text("demo's")

            # the first submit() from the notebook: `python` is the notebook's, the job's home is the notebook's
            code = "import os, gpupool.widgets; print(os.getuid(), os.getcwd())"
            job = submit(["python", "-c", code], "cpu", connection=Connection(environ=environ))
            assert job.wait(timeout=60, poll=0.2) == "succeeded", job.model()
            assert job.logs().split() == [str(demo.pw_uid), str(home)]
            assert (home / ".gpupool" / "jobs" / job.id / "output.log").is_file()

            # another user's job reaches neither the demo server's token nor the demo user's files
            assert hub.post("/users/mallory").status_code == 201
            made = hub.post("/users/mallory/tokens", json={"scopes": ["access:services!service=gpupool"]})
            assert made.status_code == 201, made.text
            mallory = Connection(f"{up.url}/services/gpupool/", made.json()["token"])
            peek = f"cat /proc/{pid}/environ; cat {home}/secret.txt; ls {home}; id -u"
            job = submit(["sh", "-c", peek], "cpu", connection=mallory)
            assert job.wait(timeout=60, poll=0.2) == "succeeded", job.model()  # `id -u` ends it
            log = job.logs()
            assert "JUPYTERHUB_API_TOKEN" not in log and "demo's" not in log, log
            assert log.count("Permission denied") == 3, log
            assert log.split()[-1] == str(pwd.getpwnam(account_name("mallory")).pw_uid)
            assert hub.delete("/users/demo/server").status_code in (202, 204)

            # mallory only ever ran jobs; deleting her takes her account and home too, so that a newcomer
            # let in under her name starts with nothing of hers. A hostile-user trial deleted a user whose
            # job still ran: it ran on, and the newcomer listed it, read its env and ran as its uid.
            uid = pwd.getpwnam(account_name("mallory")).pw_uid
            secret = {"WANDB_API_KEY": "mallory's own"}
            running = submit(["sleep", "600"], "cpu", connection=mallory, env=secret)
            until(lambda: running.model()["state"] == "running", "mallory's job to run")
            assert _processes_of(uid)
            assert hub.delete("/users/mallory").status_code == 204
            assert not _processes_of(uid)  # cancelled before her account went
            with pytest.raises(KeyError):
                pwd.getpwnam(account_name("mallory"))
            assert not Path(DEFAULT_HOMES, "mallory").exists()
            retired = pwd.getpwuid(uid).pw_name  # kept, so that no later account gets her uid
            assert retired == f"gp-retired.{uid}"
            scopes = ["custom:gpupool:admin", "access:services!service=gpupool"]
            demo = hub.post("/users/demo/tokens", json={"scopes": scopes})
            assert demo.status_code == 201, demo.text
            admin = Connection(f"{up.url}/services/gpupool/", demo.json()["token"])
            kept = admin.call("GET", f"jobs/{running.id}")
            assert kept["state"] == "cancelled" and kept["user"].startswith("mallory/deleted ")
            assert kept["reason"] == "cancelled by the hub: the user was deleted"

            assert hub.post("/users/mallory").status_code == 201  # a newcomer under her name
            made = hub.post("/users/mallory/tokens", json={"scopes": ["access:services!service=gpupool"]})
            newcomer = Connection(f"{up.url}/services/gpupool/", made.json()["token"])
            assert newcomer.call("GET", "jobs") == []
            with pytest.raises(GpupoolError) as refused:
                newcomer.call("GET", f"jobs/{running.id}")
            assert refused.value.status == 403
            job = submit(["id", "-u"], "cpu", connection=newcomer)
            assert job.wait(timeout=60, poll=0.2) == "succeeded", job.model()
            newcomers_uid = int(job.logs())
            assert newcomers_uid != uid
            assert hub.delete("/users/mallory").status_code == 204
            for left in (uid, newcomers_uid):  # the test's own clean-up of the retired accounts
                name = pwd.getpwuid(left).pw_name
                subprocess.run(["userdel", name], check=True)
                subprocess.run(["groupdel", name], check=False)
    finally:
        up.stop()


def _job_uid(user: str) -> int:
    """The uid ``user``'s jobs run as under ``gpupool up``: their own account as root, else the hub's."""
    return pwd.getpwnam(account_name(user)).pw_uid if os.geteuid() == 0 else os.geteuid()


def _processes_of(uid: int) -> list[int]:
    """The processes running as ``uid`` (a zombie runs nothing: it waits for its parent to read its status)."""
    pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    return [pid for pid in pids if uid in _uids_or_none(pid) and not _zombie(pid)]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True  # gone meanwhile


def _uids_or_none(pid: int) -> set[int]:
    try:
        return _uids(pid)
    except (OSError, ValueError):  # it ended meanwhile
        return set()


def _uids(pid: int) -> set[int]:
    """The real, effective, saved and filesystem user ids of process ``pid``."""
    (line,) = (
        line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:")
    )
    return {int(uid) for uid in line.split()[1:]}


def test_the_admin_starts_a_profile_kept_for_a_group_as_the_spawn_form_offers_it(
    start: tuple[Path, int],
) -> None:
    """A trial found the form offering the demo admin "Two NVLinked A100s" (for gpu-users) and every start of
    it refused by the service with 403: the hub's spawner sent the user's groups but not that they are admin."""
    tmp, port = start
    up = start_up(tmp, tmp / "state", port, extra_config(tmp))
    try:
        with contextlib.closing(demo_hub_api(up)) as hub:
            assert "gpu-users" not in hub.get("/users/demo").json()["groups"]
            server = start_demo_server(up, hub, "a100-pair")
            assert environ_of(int(server["state"]["pid"]))["CUDA_VISIBLE_DEVICES"].count("GPU-") == 2
            assert hub.delete("/users/demo/server").status_code in (202, 204)
            # and a job, from a token that carries no gpupool admin scope (a notebook's), as the form offers it
            made = hub.post("/users/demo/tokens", json={"scopes": ["access:services!service=gpupool"]})
            assert made.status_code == 201, made.text
            api = f"{up.url}/services/gpupool/api/v1"
            notebook = {"Authorization": f"token {made.json()['token']}"}
            job = {"command": ["sleep", "30"], "profile": "h100-x4"}
            submitted = httpx.post(f"{api}/jobs", json=job, headers=notebook, timeout=30)
            assert submitted.status_code == 201, submitted.text  # was 403: "only members of training"
            httpx.delete(f"{api}/jobs/{submitted.json()['id']}", headers=notebook, timeout=30)
    finally:
        up.stop()


def test_a_stopped_hub_returns_its_servers_leases_before_its_service_goes_and_names_the_jobs_left(
    start: tuple[Path, int],
) -> None:
    """JupyterHub stops its services before its servers; ``gpupool up`` stops the servers first, so each lease
    goes back to the pool at once instead of failing and lingering until the next start. Jobs run on, by
    design: a first-day trial stopped the hub with five running and was told nothing of them."""
    tmp, port = start
    up = start_up(tmp, tmp / "state", port, extra_config(tmp))
    overnight = None
    try:
        with contextlib.closing(demo_hub_api(up)) as hub:
            lease_id = start_demo_server(up, hub)["state"]["gpupool_lease_id"]
            made = hub.post("/users/demo/tokens", json={"scopes": ["access:services!service=gpupool"]})
            demo = Connection(f"{up.url}/services/gpupool/", made.json()["token"])
            overnight = submit(["sleep", "600"], "cpu", connection=demo, name="overnight")
            until(lambda: overnight.model()["state"] == "running", "the job to run")
        up.process.send_signal(signal.SIGTERM)
        assert up.process.wait(timeout=30) == 0, up.log_tail()
    finally:
        up.stop()
        found = overnight and find_leader(overnight.id, 1, _job_uid("demo"))
        if found:  # the test's own clean-up: the job outlives the hub
            os.killpg(found[0], signal.SIGKILL)
    store = LeaseStore(sqlite_url(str(tmp / "state" / "gpupool.sqlite")))
    try:
        assert lease_id not in {lease.id for lease in store.active()}
    finally:
        store.close()
    log = up.log.read_text()
    assert "Stopping 1 single-user servers before the services" in log
    assert "cannot reach the gpupool service" not in log
    assert overnight is not None and found, "the job was not running when the hub stopped"
    left = (
        f"gpupool: left running: 1 training job running on its devices: {overnight.id} (demo's overnight). "
    )
    assert left + f"`gpupool up --state-dir {tmp / 'state'}` takes them back" in log, up.log_tail()


def test_gpupool_pool_where_gpupool_up_runs_shows_the_live_pool(start: tuple[Path, int]) -> None:
    """Not the pool file: the running service's pool, found through the state folder, with the demo user's
    H100 held (one whole GPU fewer free than the file has)."""
    tmp, port = start
    up = start_up(tmp, tmp / "state", port, extra_config(tmp))
    try:
        with contextlib.closing(demo_hub_api(up)) as hub:
            started = hub.post("/users/demo/server", json={"profile": "h100"})
            assert started.status_code in (201, 202), started.text
            deadline = time.monotonic() + 90
            while not hub.get("/users/demo").json()["servers"].get("", {}).get("ready"):
                assert time.monotonic() < deadline, up.log_tail()
                time.sleep(0.2)

            def pool(*args: str) -> subprocess.CompletedProcess[str]:
                return gpupool_in(tmp, "pool", *args)

            live = json.loads(pool("--state-dir", "state", "--json").stdout)
            on_file = json.loads(pool("--pool", str(DEMO_POOL), "--json").stdout)
            assert live["summary"]["whole_gpus_free"] == on_file["summary"]["whole_gpus_free"] - 1
            text = pool("--state-dir", "state")
            assert text.stdout.startswith("Live, from the gpupool service at http://127.0.0.1:"), text.stdout
            api, spawner = (
                f"{up.url}/services/gpupool/api/v1",
                {"Authorization": f"token {spawner_token(tmp / 'state')}"},
            )
            (lease,) = httpx.get(
                f"{api}/leases", params={"active_only": True}, headers=spawner, timeout=10
            ).json()
            assert f"held by demo's server ({lease['id']})" in text.stdout, text.stdout  # who, not only an id
            assert "Waiting: none that this token may see." in text.stdout, text.stdout
            # three users ask for the box's four A100s in pairs: the third waits, and the admin sees who
            asked = [
                httpx.post(
                    f"{api}/leases",
                    json={"profile": "a100-pair", "owner_kind": "server", "owner_name": "", "user": user}
                    | {"groups": ["gpu-users"]},
                    headers=spawner,
                    timeout=10,
                ).json()
                for user in ("ann", "ben", "cy")
            ]
            assert [a["state"] for a in asked] == ["granted", "granted", "queued"], asked
            text = pool("--state-dir", "state")
            waits = f"#1  cy's server ({asked[2]['id']})  a100-pair  since "
            assert "Waiting: 1 that this token may see, next first" in text.stdout, text.stdout
            assert waits in text.stdout and "; expected to start by " in text.stdout, text.stdout
            for made in asked:
                httpx.delete(f"{api}/leases/{made['id']}", headers=spawner, timeout=10).raise_for_status()
            elsewhere = pool("--state-dir", "nowhere")  # no gpupool up there: the devices, and it says so
            looked = f"no running gpupool service found from {tmp / 'nowhere'}/"
            assert f"not the live pool ({looked})" in elsewhere.stderr
            assert elsewhere.stdout.startswith(f"Not the live pool ({looked})")
            # the other service commands find it the same way (a trial got "unrecognized arguments")
            drain = gpupool_in(tmp, "drain", "a100-box", "--state-dir", "state")
            assert "service gpupool-hub may not drain: it needs custom:gpupool:admin" in drain.stderr, (
                drain.stderr
            )
            nowhere = gpupool_in(tmp, "jobs", "--state-dir", "nowhere")
            assert "run this where gpupool up keeps its state (nowhere/)" in nowhere.stderr, nowhere.stderr
            assert hub.delete("/users/demo/server").status_code in (202, 204)
    finally:
        up.stop()


def gpupool_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``gpupool`` command run in ``folder``, with no service or token in its environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUPOOL_SERVICE_URL", "JUPYTERHUB_API_TOKEN")}
    command = [sys.executable, "-m", "gpupool.spawner.cli", *args]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=60)


def test_ctrl_c_as_soon_as_the_login_page_answers_leaves_no_proxy_behind(start: tuple[Path, int]) -> None:
    """The login page answers while the hub still starts its services; a Ctrl-C then (SIGINT, as a terminal
    sends it to ``make run``) used to end the hub without its cleanup, leaving the proxy on the port."""
    tmp, port = start
    up = start_up(tmp, tmp / "state", port, extra_config(tmp))
    proxies = [pid for pid, line in _children(up.process.pid).items() if "configurable-http-proxy" in line]
    assert proxies, _children(up.process.pid)
    up.process.send_signal(signal.SIGINT)
    up.process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in proxies) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert not any(_alive(pid) for pid in proxies), up.log_tail()
    finally:
        for pid in proxies:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("moment", ["in its imports", "after its first line"])
def test_ctrl_c_while_gpupool_up_starts_ends_it_in_one_line(start: tuple[Path, int], moment: str) -> None:
    """A Ctrl-C before the hub is up (``make run`` started in the wrong folder, say) printed a traceback of
    30–50 lines from wherever start-up was: JupyterHub's imports, the users' environment, JupyterHub's start."""
    tmp, port = start
    log = tmp / "up.log"
    command = Path(sys.executable).with_name("gpupool")  # the installed command, as a user runs it
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(command),
                "up",
                "--port",
                str(port),
                "--pool",
                str(DEMO_POOL),
                "--state-dir",
                str(tmp / "st"),
            ],
            cwd=tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal leaves it
        )
    try:
        deadline = time.monotonic() + (60 if moment == "after its first line" else 0.3)
        while time.monotonic() < deadline and not (moment == "after its first line" and log.stat().st_size):
            time.sleep(0.02)
        os.killpg(process.pid, signal.SIGINT)  # as Ctrl-C does: to the terminal's whole foreground group
        code = process.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    output = log.read_text(errors="replace")
    assert "Traceback" not in output, output
    # The guard says so and exits 130; a Ctrl-C before Python's own handler is in ends the process at once
    # (−2, nothing printed), and once JupyterHub's handlers are in it stops as it always does (0).
    assert code in (130, -signal.SIGINT, 0), output
    if code == 130:
        assert output.splitlines()[-1] == "gpupool: interrupted (Ctrl-C)", output


def test_a_restart_keeps_the_password_and_both_databases(start: tuple[Path, int]) -> None:
    tmp, port = start
    state = tmp / "state"
    extra = extra_config(tmp)
    first = start_up(tmp, state, port, extra)
    try:
        with contextlib.closing(login(first)) as client:
            token = api_token(client)
        headers = {"Authorization": f"token {token}"}
        api = f"{first.url}/services/gpupool/api/v1"
        # a lease as the spawners make one, with their token from the state folder
        spawner = {"Authorization": f"token {spawner_token(state)}"}
        body = {"profile": "mig-3g", "owner_kind": "server", "owner_name": "", "user": "demo"}
        lease = httpx.post(f"{api}/leases", json=body, headers=spawner, timeout=10)
        assert lease.status_code == 201, lease.text
        lease_id = lease.json()["id"]
    finally:
        first.stop()
    assert (state / "jupyterhub.sqlite").is_file() and (state / "gpupool.sqlite").is_file()
    second = start_up(tmp, state, port, extra)
    try:
        assert second.password == first.password
        login(second).close()
        # the token lives in the hub's database, the lease in the service's: both survived
        again = httpx.get(f"{api}/leases/{lease_id}", headers=headers, timeout=10)
        assert again.status_code == 200, f"{again.text}\n{second.log_tail()}"
        assert again.json()["user"] == "demo"
    finally:
        second.stop()


def test_a_bad_culler_pass_in_the_environment_stops_gpupool_up_naming_it(tmp_path: Path) -> None:
    env = os.environ | {"GPUPOOL_CULL_EVERY_SECONDS": "soon"}
    result = subprocess.run(
        up_command("--state-dir", str(tmp_path / "state")),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "GPUPOOL_CULL_EVERY_SECONDS: expected whole seconds, 1 or more, got 'soon'" in result.stderr


def test_the_demo_login_is_refused_on_a_public_address(tmp_path: Path) -> None:
    result = subprocess.run(
        up_command("--ip", "0.0.0.0", "--pool", str(DEMO_POOL), "--state-dir", str(tmp_path / "state")),
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


def _spawner_class(config: Any) -> type:
    """The class JupyterHub makes of the configured name (an entry point such as "gpupool", or a dotted path)."""
    hub = JupyterHub()
    hub.spawner_class = config.JupyterHub.spawner_class
    found: type = hub.spawner_class
    return found


def test_the_production_config_loads_and_names_only_real_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # it keeps its state in the working directory
    monkeypatch.setenv("GPUPOOL_POOL", str(DEMO_POOL))  # a simulated pool on purpose: no GPU here
    # the files gpupool install puts in /etc/gpupool, where this test cannot look
    monkeypatch.setenv("GPUPOOL_PROFILES", str(ROOT / "hub_config" / "profiles.yaml"))
    monkeypatch.setenv("GPUPOOL_QUOTAS", str(ROOT / "hub_config" / "quotas.yaml"))
    config = _load(ROOT / "hub_config" / "jupyterhub_config.py")
    _assert_every_option_exists(config)
    assert _spawner_class(config) is LocalGPUSpawner
    assert config.JupyterHub.cleanup_servers is False  # a hub restart leaves the servers running
    (service,) = (s for s in config.JupyterHub.services if s["name"] == "gpupool")
    assert service["environment"]["GPUPOOL_POOL"] == str(DEMO_POOL)
    assert config.JupyterHub.authenticator_class == "pam"
    token = (tmp_path / "gpupool-hub-token").read_text().strip()
    assert config.LocalGPUSpawner.service_api_token == token
    assert {"name": "gpupool-hub", "api_token": token} in config.JupyterHub.services


def test_the_production_config_without_a_driver_stops_the_hub_with_nvmls_error(tmp_path: Path) -> None:
    """No NVIDIA driver on the test machines: the hub must not start and serve a pool that is not there."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUPOOL_POOL", "GPUPOOL_SIMULATED_FALLBACK")}
    result = _start_production_hub(tmp_path, env)
    assert result.returncode != 0
    assert "NVML" in result.stderr and "GPUPOOL_SIMULATED_FALLBACK=1" in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "jupyterhub.sqlite").exists()  # it stopped before starting anything


def test_the_production_config_stops_on_a_bad_profiles_file_in_one_line(tmp_path: Path) -> None:
    """A lab trial's typo stopped the installed hub with the one line that names it after a 100-line
    traceback."""
    (tmp_path / "profiles.yaml").write_text(
        "profiles:\n  - {slug: cpu, display_name: CPU, cpu: 1, memroy: 1GiB}\n"
    )
    env = {**os.environ, "GPUPOOL_POOL": str(DEMO_POOL), "GPUPOOL_PROFILES": str(tmp_path / "profiles.yaml")}
    result = _start_production_hub(tmp_path, env)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "profile cpu: unknown field 'memroy' (did you mean 'memory'?)" in result.stderr.splitlines()[-1]


def _start_production_hub(state: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """JupyterHub on the production configuration, in ``state``, for tests whose start must fail."""
    config = ROOT / "hub_config" / "jupyterhub_config.py"
    return subprocess.run(
        [sys.executable, "-m", "jupyterhub", "-f", str(config)],
        cwd=state,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_embedded_config_loads_and_names_only_real_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = prepare(state_dir=tmp_path / "state", pool=str(DEMO_POOL))
    monkeypatch.setenv(ENV, prepared.env[ENV])
    config = _load(embedded_config())
    _assert_every_option_exists(config)
    assert _spawner_class(config) is SimpleLocalGPUSpawner
    assert config.SharedPasswordAuthenticator.admin_password == demo_password(tmp_path / "state")
    (service,) = (s for s in config.JupyterHub.services if s["name"] == "gpupool")
    assert service["environment"]["GPUPOOL_POOL"] == str(DEMO_POOL.resolve())
    assert config.Spawner.start_timeout == 600  # a queue of one once gave up after JupyterHub's 60 s


def test_the_state_folder_is_closed_to_other_accounts_even_one_made_before(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)  # as an earlier release, or an admin's mkdir, left it
    prepare(state_dir=state, pool=str(DEMO_POOL))
    assert state.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("variable", ["GPUPOOL_PROFILES", "GPUPOOL_QUOTAS"])
def test_a_broken_profiles_or_quotas_file_stops_gpupool_up_on_the_terminal_before_anything_starts(
    tmp_path: Path, variable: str
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "profiles: [{slug: Not A Slug}]\\n" if variable == "GPUPOOL_PROFILES" else "users: 7\\n"
    )
    port = free_port_family()
    result = subprocess.run(
        up_command("--port", str(port), "--pool", str(DEMO_POOL), "--state-dir", str(tmp_path / "state")),
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {variable: str(broken)},
    )
    assert result.returncode != 0 and str(broken) in result.stderr, result.stderr
    with pytest.raises(httpx.ConnectError):  # no proxy (or anything else) left listening
        httpx.get(f"http://127.0.0.1:{port}/hub/login", timeout=2)


def _up_with_f_file(tmp_path: Path, lines: str) -> tuple[subprocess.CompletedProcess[str], Path, int]:
    """``gpupool up -f lab.py`` with ``lines`` after ``get_config()``, expected to stop at start: what it said,
    the file and the port it was given."""
    extra = tmp_path / "lab.py"
    extra.write_text(f"c = get_config()  # noqa\n{lines}\n")
    port = free_port_family()
    result = subprocess.run(
        up_command(
            "--port",
            str(port),
            "--pool",
            str(DEMO_POOL),
            "--state-dir",
            str(tmp_path / "s"),
            "-f",
            str(extra),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0, result.stderr
    assert "Starting proxy" not in result.stderr + result.stdout and "Log in at" not in result.stdout
    return result, extra, port


def test_a_broken_quotas_file_named_in_an_f_file_stops_gpupool_up_before_the_hub_starts(
    tmp_path: Path,
) -> None:
    """A course's trial set ``c.ServiceSettings.quotas_file`` in an -f file: its typo was found by the service,
    after the hub and proxy were up, where the same typo in GPUPOOL_QUOTAS stops gpupool up at once."""
    broken = tmp_path / "course-quotas.yaml"
    broken.write_text("per_group:\n  students: {mig_slice: 1}\n")
    result, _, port = _up_with_f_file(tmp_path, f"c.ServiceSettings.quotas_file = {str(broken)!r}")
    assert f"{broken}: per_group.students: unknown field 'mig_slice'" in result.stderr, result.stderr[-3000:]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/hub/login", timeout=2)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            "c.Spawner.start_timout = 60",
            "c.Spawner.start_timout: Spawner has no such setting; did you mean start_timeout?",
        ),
        (
            "c.SharedPasswordAuthenticator.user_pasword = 'lab-users-share-this'",
            "c.SharedPasswordAuthenticator.user_pasword: SharedPasswordAuthenticator has no such setting; did you "
            "mean user_password?",
        ),
    ],
)
def test_a_misspelt_jupyterhub_setting_in_an_f_file_stops_gpupool_up_naming_it(
    tmp_path: Path, line: str, said: str
) -> None:
    """A first-day trial's ``c.Spawner.start_timout = 60`` started the hub without a word (traitlets warns only
    when it makes a spawner, in the hub's log), where a misspelt gpupool setting stops the start. A setting for
    a class the hub does not run with (the Kubernetes spawner's, here) is left alone."""
    result, _, _ = _up_with_f_file(tmp_path, f"{line}\nc.KubeGPUSpawner.namespace = 'a-cluster-setting'")
    assert f"gpupool: {said}" in result.stderr, result.stderr[-3000:]


def test_a_syntax_error_in_an_f_file_is_one_line_naming_the_file_and_line(tmp_path: Path) -> None:
    """A first-day trial's unclosed bracket printed JupyterHub's thirty-line traceback."""
    result, extra, _ = _up_with_f_file(tmp_path, "c.Spawner.start_timeout = (60")
    assert f"gpupool: -f {extra}, line 2: '(' was never closed" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def test_a_second_gpupool_up_is_refused_and_leaves_the_running_hub_alone(start: tuple[Path, int]) -> None:
    """A trial ran ``make run`` twice in one clone: the second start stopped the first one's proxy (port 8000
    dead for 5 s), printed a login line, then died with a traceback and left its own pid in the pid file."""
    tmp, port = start
    up = start_up(tmp, tmp / "state", port, extra_config(tmp))
    try:
        proxy_pid = (tmp / "state" / "jupyterhub-proxy.pid").read_text()
        hub_pid = (tmp / "state" / "jupyterhub.pid").read_text()
        same_folder = ("--port", str(port + 5), "--state-dir", str(tmp / "state"))
        same_port = ("--port", str(port), "--state-dir", str(tmp / "other"))
        for args, said in (
            (same_folder, f"a hub already runs from {tmp / 'state'} (pid {up.process.pid})"),
            (same_port, f"--port {port}: something already listens on 127.0.0.1:{port}"),
        ):
            second = subprocess.run(
                up_command(*args, "--pool", str(DEMO_POOL)), capture_output=True, text=True, timeout=60
            )
            assert second.returncode == 2 and said in second.stderr, second.stderr
            assert "Log in at" not in second.stdout + second.stderr and "Traceback" not in second.stderr
        assert (tmp / "state" / "jupyterhub-proxy.pid").read_text() == proxy_pid
        assert (tmp / "state" / "jupyterhub.pid").read_text() == hub_pid
        assert httpx.get(f"{up.url}/hub/login", timeout=5).status_code == 200
        assert not (tmp / "other").exists()  # refused before anything was written
    finally:
        up.stop()


def test_a_config_file_that_raises_stops_gpupool_up_before_anyone_is_invited_to_log_in(
    tmp_path: Path,
) -> None:
    """A trial found the login line and password printed above the traceback of an ``-f`` file that raised."""
    config = tmp_path / "typo_config.py"
    config.write_text("c = get_config()  # noqa\nc.JupyterHub.log_level = DEBUG\n")  # a name, not a string
    result = _up_that_stops(tmp_path, config)
    said = result.stdout + result.stderr
    assert result.returncode != 0 and "name 'DEBUG' is not defined" in said, said
    assert "gpupool: state in" in result.stdout  # the lines before the start are still there
    assert "Log in at" not in said and "password" not in said


def _up_that_stops(tmp_path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """``gpupool up -f config`` on the demo pool, run to its end (a start that should stop before the hub)."""
    return subprocess.run(
        up_command(
            *("--port", str(free_port_family()), "--pool", str(DEMO_POOL)),
            *("--state-dir", str(tmp_path / "state"), "-f", str(config)),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``, with their command lines."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found[int(stat.parent.name)] = (
                    (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                )
    return found


def test_a_hub_killed_with_minus_9_takes_its_service_and_culler_along(start: tuple[Path, int]) -> None:
    tmp, port = start
    up = start_up(tmp, tmp / "state", port, extra_config(tmp))
    proxies: list[int] = []
    try:

        def managed() -> set[int]:
            lines = _children(up.process.pid).items()
            return {pid for pid, line in lines if "gpupool.spawner.service" in line or "idle_culler" in line}

        deadline = time.monotonic() + 30
        while len(managed()) < 2 and time.monotonic() < deadline:  # the culler starts after the login page
            time.sleep(0.2)
        started = managed()
        children = _children(up.process.pid)
        assert len(started) == 2, children
        proxies = [pid for pid, line in children.items() if "configurable-http-proxy" in line]
        up.process.kill()  # no shutdown: the hub cannot stop its services itself
        up.process.wait()
        deadline = time.monotonic() + 20
        while started and time.monotonic() < deadline:
            started = {pid for pid in started if _alive(pid)}
            time.sleep(0.2)
        assert not started, f"still running after the hub was killed: {started}"
    finally:
        up.stop()
        for pid in proxies:  # the proxy outlives a killed hub by design (a restarted hub takes it over)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that is gone."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def test_each_internal_port_is_settable_and_named_in_help(start: tuple[Path, int]) -> None:
    """Finding 9 of the researcher's-day review: ``--port`` silently took port+1, +81 and +2101, which the
    README never named and nothing could move."""
    tmp, port = start
    help_text = subprocess.run(up_command("--help"), capture_output=True, text=True, check=True).stdout
    for flag in ("--proxy-api-port", "--hub-port", "--service-port"):
        assert flag in help_text
    hub_port, service_port, api_port = free_port_family(), free_port_family(), free_port_family()
    clash = subprocess.run(
        up_command("--port", str(port), "--hub-port", str(port), "--state-dir", str(tmp / "clash")),
        capture_output=True,
        text=True,
    )
    assert clash.returncode != 0 and f"--hub-port {port}: --port uses that port already" in clash.stderr
    ports = (
        "--hub-port",
        str(hub_port),
        "--service-port",
        str(service_port),
        "--proxy-api-port",
        str(api_port),
    )
    up = start_up(tmp, tmp / "state", port, extra_config(tmp), args=ports)
    try:
        assert httpx.get(f"http://127.0.0.1:{hub_port}/hub/api/").status_code == 200  # the hub itself
        assert (
            httpx.get(f"http://127.0.0.1:{service_port}/services/gpupool/api/v1/openapi.json").status_code
            == 200
        )
        assert httpx.get(f"http://127.0.0.1:{api_port}/api/routes").status_code == 403  # the proxy's API
    finally:
        up.stop()


def test_a_shared_password_too_short_stops_gpupool_up_in_one_line(tmp_path: Path) -> None:
    """An admin's trial set a 5-character shared password in an ``-f`` file: the hub stopped with JupyterHub's
    60-line traceback, the reason on its last line."""
    config = tmp_path / "users.py"
    config.write_text(
        "c = get_config()  # noqa\n"
        "c.SharedPasswordAuthenticator.user_password = 'short'\n"
        "c.Authenticator.allow_all = True\n"
    )
    result = _up_that_stops(tmp_path, config)
    said = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in said, said
    assert "gpupool: SharedPasswordAuthenticator.user_password must be at least 8 characters long" in said
    assert "Log in at" not in said
