"""The README's "One server", command for command: a lab admin installs gpupool from a clone, a system user logs
in with PAM in a real browser, gets a MIG server and runs a job, both as that user inside their profile's
memory limit, and the server outlives a hub restart; then the admin uninstalls it.

As root only (it writes /opt/gpupool, /etc/gpupool, /var/lib/gpupool and makes a system user); CI runs as
root. The installed hub listens on its production ports (8000, 8001, 8081, 10101), which no other test uses.
This machine has no GPU and no systemd: the install serves the simulated pool (``SIMULATED=1``, which the
README says is for such machines) and the hub starts through the launcher the unit runs.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_harness import LAB_TIMEOUT_MS, chromium, screenshot_on_failure
from hub_harness import log_tail
from playwright.sync_api import Page, expect
from polling import until

from gpupool.spawner.files.profiles_file import load_profiles
from gpupool.spawner.hub.install_files import Layout

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="installs into /opt, /etc and /var/lib: root only")

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = Layout()
URL = "http://127.0.0.1:8000"
PORTS = (8000, 8001, 8081, 10101)  # the proxy, its API, the hub, the gpupool service
USER, PASSWORD = "ada", "first-day-on-the-gpus"
SERVER_PROFILE, JOB_PROFILE = "mig-1g", "cpu"
# What the job prints: who it runs as, and the memory limit of its own control group (v1 or v2).
JOB = """
import os, pwd
print("user", pwd.getpwuid(os.getuid()).pw_name)
groups = dict(line.strip().split(":", 2)[1:] for line in open("/proc/self/cgroup"))
if "memory" in groups:
    limit = open("/sys/fs/cgroup/memory" + groups["memory"] + "/memory.limit_in_bytes").read()
else:
    limit = open("/sys/fs/cgroup" + groups[""] + "/memory.max").read()
print("memory limit", limit.strip())
"""


def sh(*command: str) -> None:
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


class Hub:
    """The installed hub, started as its unit starts it: the launcher, as root, in a session of its own."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        for port in PORTS:  # the production configuration's own ports: say so if something holds one
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    pytest.fail(
                        f"port {port} is taken (a `make run` of yours?): the installed hub listens there"
                    )
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(LAYOUT.launcher)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as systemd leaves it
            )
        until(
            lambda: _answers(f"{URL}/hub/login"),
            f"the installed hub did not answer:\n{log_tail(self.log)}",
            90,
        )

    def stop(self) -> None:
        """SIGTERM, as ``systemctl stop`` sends it (KillMode=process: to the hub alone)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[Hub]:
    """``make install SIMULATED=1`` and the user ``ada`` in ``gpu-users``; afterwards, whatever the test did,
    nothing of either is left."""
    _remove_user()
    hub = Hub(tmp_path / "hub.log")
    try:
        sh("make", "install", "SIMULATED=1")
        sh("useradd", "--create-home", "--groups", "gpu-users", USER)
        subprocess.run(["chpasswd"], input=f"{USER}:{PASSWORD}", text=True, check=True)
        yield hub
    finally:
        hub.stop()
        for pid in _processes_of(USER):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["make", "uninstall", "PURGE=1"], cwd=ROOT, capture_output=True)
        _remove_user()


def test_install_log_in_with_pam_run_a_mig_server_and_a_job_restart_the_hub_and_uninstall(
    installed: Hub,
) -> None:
    hub = installed
    assert LAYOUT.unit.read_text().count(f"ExecStart={LAYOUT.launcher}") == 1
    # a lab trial's settings in the environment file (a database URL with its password, root's alone) never
    # reached the service: the hub hands the service its own settings and little else
    # (a `$` in it: a trial's database password lost its `$cdef9` to the shell that read the file)
    environment, store = LAYOUT.config / "environment", LAYOUT.state / "leases-$from-the-environment.sqlite"
    settings = environment.read_text()
    # a value the service refuses stops the start, naming it, and the proxy goes too (a trial found it left)
    environment.write_text(f"{settings}GPUPOOL_SAMPLE_SECONDS=-5\n")
    failed = subprocess.run([str(LAYOUT.launcher)], capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0 and "GPUPOOL_SAMPLE_SECONDS" in failed.stderr, failed.stderr[-3000:]
    assert not _proxies()
    environment.write_text(f'{settings}GPUPOOL_DB_URL="sqlite:///{store}"\n')
    hub.start()
    profiles = {p.slug: p for p in load_profiles(LAYOUT.config / "profiles.yaml")}

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        with screenshot_on_failure(page, "one-server-failure.png"):
            _log_in_and_start(page, SERVER_PROFILE)
            (server_pid,) = _servers_of(USER)
            assert _memory_limit(server_pid) == profiles[SERVER_PROFILE].memory_mib * 1024**2
            token = _request_token(page)
            service = httpx.Client(
                base_url=f"{URL}/services/gpupool/api/v1",
                headers={"Authorization": f"token {token}"},
                timeout=30,
            )
            (lease,) = [lease for lease in service.get("/leases").json() if lease["owner_kind"] == "server"]
            assert (lease["profile"], lease["state"]) == (SERVER_PROFILE, "granted")
            assert store.is_file() and not (LAYOUT.state / "gpupool.sqlite").exists()
            assert f"lease store {store}: 0 active leases" in hub.log.read_text()  # as it started

            # the launcher run again by mistake: refused, and the running hub's proxy left alone
            proxy_pid = (LAYOUT.state / "jupyterhub-proxy.pid").read_text()
            second = subprocess.run([str(LAYOUT.launcher)], capture_output=True, text=True, timeout=60)
            assert second.returncode != 0 and "a hub already runs from /var/lib/gpupool" in second.stderr, (
                second.stderr[-2000:]
            )
            assert (LAYOUT.state / "jupyterhub-proxy.pid").read_text() == proxy_pid
            assert _answers(f"{URL}/hub/login")

            log = _run_job(service)
            assert f"user {USER}\n" in log
            assert f"memory limit {profiles[JOB_PROFILE].memory_mib * 1024**2}\n" in log

            hub.stop()  # a restart, as systemctl restart does it
            assert _alive(server_pid), "the hub's stop took the user's server along"
            hub.start()
            page.goto(f"{URL}/user/{USER}/lab")
            expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=LAB_TIMEOUT_MS)
            assert _servers_of(USER) == [server_pid]
            (after,) = [lease for lease in service.get("/leases").json() if lease["owner_kind"] == "server"]
            assert (after["id"], after["state"]) == (lease["id"], "granted")

            refused = subprocess.run(
                ["make", "uninstall", "PURGE=1"], cwd=ROOT, capture_output=True, text=True
            )
            assert refused.returncode != 0 and f"({USER})" in refused.stderr, (
                refused.stderr
            )  # her server runs
            assert LAYOUT.env.is_dir() and LAYOUT.state.is_dir()  # and nothing was removed
            stopped = httpx.delete(f"{URL}/hub/api/users/{USER}/server", headers=service.headers, timeout=60)
            assert stopped.status_code in (202, 204), stopped.text
            until(lambda: not _servers_of(USER), "the server did not stop", 60)
    hub.stop()
    sh("make", "uninstall", "PURGE=1")
    leftovers = [  # /opt/gpupool itself too: a trial found the environment's lock file left in it
        p for p in (LAYOUT.prefix, LAYOUT.unit, LAYOUT.config, LAYOUT.state) if p.exists()
    ]
    assert not leftovers


def _log_in_and_start(page: Page, profile: str) -> None:
    """PAM login with the system password, the spawn form (labelled simulated), the MIG profile, JupyterLab."""
    page.goto(f"{URL}/hub/login")
    page.fill("#username_input", USER)
    page.fill("#password_input", PASSWORD)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r"/hub/spawn"), timeout=30_000)
    expect(page.locator(".gpupool-simulated")).to_contain_text("Simulated pool")
    page.check(f"#gpupool-profile-{profile}")
    page.click('form button[type="submit"]')
    page.wait_for_url(re.compile(rf"/user/{USER}/lab"), timeout=LAB_TIMEOUT_MS)
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=LAB_TIMEOUT_MS)


def _request_token(page: Page) -> str:
    """A token from the hub's token page, as a user makes one for scripts and the ``gpupool`` command."""
    page.goto(f"{URL}/hub/token")
    # The form works once the page's scripts run: a click before that submits it as a plain GET (seen once,
    # leaving /hub/token? and no token), so wait for them as a user waits for the page to load.
    page.wait_for_load_state("networkidle")
    page.click('#request-token-form button[type="submit"]')
    result = page.locator("#token-result")
    expect(result).not_to_be_empty(timeout=30_000)
    return result.inner_text().strip()


def _run_job(service: httpx.Client) -> str:
    submitted = service.post("/jobs", json={"profile": JOB_PROFILE, "command": ["python", "-c", JOB]})
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]
    job: dict[str, Any] = {}

    def finished() -> bool:
        job.update(service.get(f"/jobs/{job_id}").json())
        return job["state"] not in ("queued", "running", "requeued")

    until(finished, "the job did not finish", 120)
    log = service.get(f"/jobs/{job_id}/logs").text
    assert job["state"] == "succeeded", (job["reason"], log)
    return log


def _servers_of(user: str) -> list[int]:
    return [pid for pid in _processes_of(user) if b"jupyterhub-singleuser" in _cmdline(pid)]


def _processes_of(user: str) -> list[int]:
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and entry.stat().st_uid == uid and _alive(int(entry.name)):
                found.append(int(entry.name))
    return sorted(found)


def _proxies() -> list[int]:
    """The configurable-http-proxy processes of the installed hub."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and str(LAYOUT.node).encode() in _cmdline(int(entry.name)):
            found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def _alive(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def _memory_limit(pid: int) -> int:
    """The memory limit of ``pid``'s control group, read as root from the cgroup files."""
    groups = dict(line.split(":", 2)[1:] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines())
    if "memory" in groups:
        return int(Path("/sys/fs/cgroup/memory" + groups["memory"], "memory.limit_in_bytes").read_text())
    return int(Path("/sys/fs/cgroup" + groups[""], "memory.max").read_text())


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _remove_user() -> None:
    with contextlib.suppress(KeyError):
        pwd.getpwnam(USER)
        subprocess.run(["userdel", "--remove", USER], capture_output=True)
