"""``JobPanel`` in a real JupyterLab in headless Chromium: it renders, submits a job and shows it succeed.

``test_job_panel`` checks what the panel builds without a browser; only a browser shows that the widgets
really render in JupyterLab (the ipywidgets extension is there), that the kernel finds the service from the
spawned server's environment (``GPUPOOL_SERVICE_URL`` and the server's own token, which the hub's ``server``
role lets call the service), and that the background refresh reaches the page. A real hub spawns the user's
``cpu`` server with the GPU spawner; the gpupool service runs as its managed service on the demo pool and, as
root, runs the job as the user's system account (``job_user``), so the hub user is that account. The panel
with the succeeded job is saved as ``job-panel.png`` under ``test-artifacts/`` (or ``$GPUPOOL_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import nbformat
import pytest
from browser_harness import LAB_TIMEOUT_MS, artifacts, chromium, log_in, run_first_cell, screenshot_on_failure
from hub_harness import GPU_SPAWNER, SERVICE, RunningHub, free_ports, write_hub_config
from job_user import clean_home, job_user
from playwright.sync_api import Page, expect
from up_harness import require_proxy

from gpupool.spawner.backends.simulated import DEMO_POOL

ADMIN_TOKEN = "test-admin-token-panel-0123456789abcdef"
HUB_CLIENT_TOKEN = "test-hub-client-token-panel-0123456789abcdef"
ADMIN_SCOPES = (
    "admin:users",
    "admin:servers",
    "tokens",
    "custom:gpupool:admin",
    f"access:services!service={SERVICE}",
)
# JupyterHub's own server scopes, plus the service: the kernel calls it with the server's token
SERVER_ROLE = {
    "name": "server",
    "scopes": ["users:activity!user", "access:servers!server", f"access:services!service={SERVICE}"],
}
CELL = "from gpupool.widgets import JobPanel\npanel = JobPanel(refresh=1)\npanel"
COMMAND = 'sh -c "echo panel job on $CUDA_VISIBLE_DEVICES; sleep 1"'
JOB_TIMEOUT_MS = 60_000


def start_cpu_server(page: Page, hub: RunningHub, user: str) -> None:
    """Log in (any password does) and start the ``cpu`` profile from the spawn form, into JupyterLab."""
    log_in(page, hub.url, user)
    page.wait_for_url(re.compile(r"/hub/spawn"), timeout=30_000)
    expect(page.locator(".gpupool-form")).to_be_visible(timeout=30_000)
    page.check("#gpupool-profile-cpu")
    page.click('form button[type="submit"]')
    page.wait_for_url(re.compile(rf"/user/{user}/lab"), timeout=LAB_TIMEOUT_MS)
    server = hub.api("GET", f"users/{user}").json()["servers"][""]
    hub.pids.add(int(server["state"]["pid"]))  # killed at the end should the hub leave it


def put_notebook(hub: RunningHub, user: str) -> None:
    """``panel.ipynb`` with the one cell, through the server's contents API as the user."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    put = httpx.put(
        f"{hub.url}/user/{user}/api/contents/panel.ipynb",
        json={"type": "notebook", "format": "json", "content": notebook},
        headers={"Authorization": f"token {hub.tokens[user]}"},
        timeout=30,
    )
    assert put.status_code in (200, 201), put.text


def test_the_job_panel_renders_in_jupyterlab_submits_a_job_and_shows_it_succeed(tmp_path: Path) -> None:
    """The panel a researcher uses from a notebook, end to end, checked against the service's own record."""
    require_proxy()
    user = job_user()
    ports = free_ports()
    service_env = {"GPUPOOL_POOL": str(DEMO_POOL), "GPUPOOL_DB_URL": f"sqlite:///{tmp_path}/gpupool.sqlite"}
    write_hub_config(
        tmp_path,
        ports,
        admin_token=ADMIN_TOKEN,
        admin_scopes=ADMIN_SCOPES,
        pool_file=DEMO_POOL,
        service_env=service_env,
        hub_client_token=HUB_CLIENT_TOKEN,
        spawner_class=GPU_SPAWNER,
        spawn_timeout=120,
        extra_config=[f"c.JupyterHub.load_roles.append({SERVER_ROLE!r})"],
    )
    try:
        with (
            chromium() as browser,
            RunningHub(tmp_path, ports, ADMIN_TOKEN, service_env=service_env, fail=pytest.fail) as hub,
        ):
            hub.create_user(user)
            hub.token_for(user)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            with screenshot_on_failure(page, "job-panel-failure.png"):
                start_cpu_server(page, hub, user)
                put_notebook(hub, user)
                notebook = f"{hub.url}/user/{user}/lab/tree/panel.ipynb"
                panel = run_first_cell(page, notebook, ".gpupool-job-panel")
                command = panel.locator(".widget-text", has=page.locator("label", has_text="Command"))
                command.locator("input").fill(COMMAND)
                profile = panel.locator(".widget-dropdown", has=page.locator("label", has_text="Profile"))
                cpu = profile.locator("option", has_text="CPU only").first
                expect(cpu).to_be_attached(timeout=30_000)
                # the demo pool is no real GPUs: the panel says so, as GpuMonitor does (a trial missed it)
                expect(panel.locator(".gpupool-simulated")).to_have_text("simulated", timeout=30_000)
                profile.locator("select").select_option(label=cpu.inner_text())
                panel.locator("button", has_text="Submit").click()

                expect(panel).to_contain_text("Submitted job", timeout=JOB_TIMEOUT_MS)
                expect(panel.locator("table.gpupool-jobs")).to_contain_text(
                    "succeeded", timeout=JOB_TIMEOUT_MS
                )
                expect(panel.locator("textarea")).to_have_value(
                    re.compile("panel job"), timeout=JOB_TIMEOUT_MS
                )
                panel.scroll_into_view_if_needed()
                page.screenshot(path=str(artifacts() / "job-panel.png"))

                with hub.admin() as admin:
                    answer = admin.get(f"{hub.service_api}/jobs", params={"user": user})
                assert answer.status_code == 200, answer.text
                (job,) = answer.json()
                assert (job["user"], job["profile"], job["state"]) == (user, "cpu", "succeeded"), job
                assert job["command"] == ["sh", "-c", "echo panel job on $CUDA_VISIBLE_DEVICES; sleep 1"]
                assert job["id"] in panel.locator("table.gpupool-jobs").inner_text()

                page.goto(f"{hub.url}/hub/home")  # stop the server as a user does
                page.wait_for_load_state("networkidle")  # the button works once the scripts run
                page.click("#stop")
                expect(page.locator("#stop")).to_be_hidden(timeout=60_000)
            page.close()
    finally:
        clean_home(user)
