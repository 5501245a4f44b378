"""``GpuMonitor`` and the dashboard against a real hub, proxy and gpupool service on the simulated demo pool.

One hub for the module, with the GPU spawner and telemetry sampled every half second. A real kernel (nbclient)
runs ``GpuMonitor`` with what a spawned server's environment gives it (the service's URL, a token acting as
the user, ``GPUPOOL_LEASE_ID``, and ``CUDA_VISIBLE_DEVICES``, by which the simulated sampler sees the
kernel's CPU use as the GPU's); headless Chromium loads the admin dashboard through the proxy and a
JupyterLab that runs ``GpuMonitor`` on a spawned ``h100`` server; an admin logged in to the hub reaches the
dashboard through the hub's OAuth, and a user's pending cull warning shows on the hub's home page (the
template in ``hub_config/templates``). Screenshots go to ``test-artifacts/`` (``dashboard.png``,
``gpu-monitor.png``, ``home-cull-warning.png``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import nbformat
import pytest
from browser_harness import (
    LAB_TIMEOUT_MS,
    artifacts,
    chromium,
    log_in,
    run_first_cell,
    screenshot_on_failure,
)
from hub_harness import GPU_SPAWNER, SERVICE, RunningHub, free_ports, write_hub_config
from nbclient import NotebookClient
from playwright.sync_api import expect
from test_job_panel_browser import SERVER_ROLE
from up_harness import require_proxy

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.hub.up import templates
from gpupool.widgets import Connection, GpuMonitor

ADMIN_TOKEN = "test-admin-token-monitor-0123456789abcdef"
HUB_CLIENT_TOKEN = "test-hub-client-token-monitor-0123456789ab"
ADMIN_SCOPES = (
    "admin:users",
    "admin:servers",
    "tokens",
    "custom:gpupool:admin",
    f"access:services!service={SERVICE}",
)
USER = "mona"
ADMIN_USER = "ada"  # a hub user with the gpupool admin scope, who logs in with a browser
ADMINS_ROLE = {
    "name": "gpupool-admins",
    "scopes": ["custom:gpupool:admin", f"access:services!service={SERVICE}"],
    "users": [ADMIN_USER],
}
VALUE = r'<th>{}</th><td class="gpupool-value">{}</td>'
# the cell awaits (never time.sleep: the monitor refreshes on the kernel's event loop, which an await leaves
# free) until the monitor shows a utilisation and a power reading
WAIT_CELL = """\
import asyncio, re, time
from gpupool.widgets import GpuMonitor
monitor = GpuMonitor(refresh=0.5)
deadline = time.monotonic() + 60
shown = lambda: re.search(r'Utilisation</th><td class="gpupool-value">\\d+%', monitor.view.value) and \\
    re.search(r'Power</th><td class="gpupool-value">\\d+ W', monitor.view.value)
while not shown() and time.monotonic() < deadline:
    await asyncio.sleep(0.1)
print(monitor.view.value)
monitor
"""
LAB_CELL = "from gpupool.widgets import GpuMonitor\nGpuMonitor(refresh=1)"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningHub]:
    require_proxy()
    tmp = tmp_path_factory.mktemp("monitor-hub")
    ports = free_ports()
    service_env = {
        "GPUPOOL_POOL": str(DEMO_POOL),
        "GPUPOOL_DB_URL": f"sqlite:///{tmp}/gpupool.sqlite",
        "GPUPOOL_SAMPLE_SECONDS": "0.5",
    }
    write_hub_config(
        tmp,
        ports,
        admin_token=ADMIN_TOKEN,
        admin_scopes=ADMIN_SCOPES,
        pool_file=DEMO_POOL,
        service_env=service_env,
        hub_client_token=HUB_CLIENT_TOKEN,
        spawner_class=GPU_SPAWNER,
        spawn_timeout=120,
        extra_config=[
            f"c.JupyterHub.load_roles.append({SERVER_ROLE!r})",
            f"c.JupyterHub.load_roles.append({ADMINS_ROLE!r})",
            f"c.JupyterHub.template_paths = [{str(templates())!r}]",
        ],
    )
    with RunningHub(tmp, ports, ADMIN_TOKEN, service_env=service_env, fail=pytest.fail) as running:
        running.create_user(USER)
        running.token_for(USER)
        running.token_for(ADMIN_USER)
        yield running


def lease_for(hub: RunningHub, user: str, profile: str, name: str) -> dict[str, Any]:
    """A lease for ``user``'s server ``name``, made as the hub's spawner makes it."""
    body = {"profile": profile, "owner_kind": "server", "owner_name": name, "user": user}
    with httpx.Client(headers={"Authorization": f"token {HUB_CLIENT_TOKEN}"}, timeout=10) as spawner:
        answer = spawner.post(f"{hub.service_api}/leases", json=body)
    assert answer.status_code == 201, answer.text
    lease: dict[str, Any] = answer.json()
    assert lease["state"] == "granted", lease
    return lease


def test_a_notebook_shows_gpu_monitor_with_live_values_for_its_leased_gpu(
    hub: RunningHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    lease = lease_for(hub, USER, "h100", "monitor")
    (device,) = lease["devices"]
    monkeypatch.setenv("GPUPOOL_SERVICE_URL", f"{hub.url}/services/{SERVICE}/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.tokens[USER])
    monkeypatch.setenv("GPUPOOL_LEASE_ID", lease["id"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", device["uuid"])
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(WAIT_CELL)])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    outputs = notebook.cells[0].outputs
    shown = "".join(o.get("text", "") for o in outputs if o.get("name") == "stdout")
    assert device["uuid"] in shown and "simulated" in shown
    assert re.search(VALUE.format("Utilisation", r"\d+%"), shown), shown
    assert re.search(VALUE.format("Memory", r"[\d.]+ / 80\.0 GiB"), shown), shown
    assert re.search(VALUE.format("Temperature", r"\d+ °C"), shown), shown
    assert re.search(VALUE.format("Power", r"\d+ W / \d+ W"), shown), shown
    assert "Pool free now:" in shown and shown.count('class="gpupool-card-title"') == 1
    # the profile's CPU and memory; no server runs on this lease, so no use is known ("–")
    assert re.search(r"CPU – of 16 cores · memory – of 128\.0 GiB", shown), shown
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)


def test_a_researcher_whose_gpu_an_admin_marks_failed_reads_it_on_the_monitor(hub: RunningHub) -> None:
    """A failure trial: the admin's fault named the server running on the GPU, and its researcher, whose server
    keeps running there, saw nothing in GpuMonitor, the lease or the hub's pages."""
    lease = lease_for(hub, USER, "h100", "failing")
    (device,) = lease["devices"]
    where = next(
        {"node": node["name"], "gpu_index": gpu["index"]}
        for node in httpx.get(f"{hub.service_api}/pool", headers=_auth(hub, USER)).json()["nodes"]
        for gpu in node["gpus"]
        if gpu["uuid"] == device["uuid"]
    )
    monitor = GpuMonitor(Connection(f"{hub.url}/services/{SERVICE}/", hub.tokens[USER]), lease_id=lease["id"])
    try:
        asyncio.run(monitor.update())
        assert "marked failed" not in monitor.view.value
        marked = httpx.post(f"{hub.service_api}/admin/faults", json=where, headers=_auth(hub, ADMIN_USER))
        assert marked.status_code == 200 and marked.json()["servers"] == [lease["id"]], marked.text
        asyncio.run(monitor.update())
        card = monitor.view.value
        assert "This GPU was marked failed" in card and "restart your server" in card, card
    finally:
        monitor.close()
        httpx.post(f"{hub.service_api}/admin/repair", json=where, headers=_auth(hub, ADMIN_USER))
        with httpx.Client(headers={"Authorization": f"token {HUB_CLIENT_TOKEN}"}) as spawner:
            spawner.delete(f"{hub.service_api}/leases/{lease['id']}")


def _auth(hub: RunningHub, user: str) -> dict[str, str]:
    return {"Authorization": f"token {hub.tokens[user]}"}


def test_the_admin_dashboard_renders_live_values_in_chromium(hub: RunningHub) -> None:
    lease = lease_for(hub, USER, "mig-3g", "dashboard")
    (device,) = lease["devices"]
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        with screenshot_on_failure(page, "dashboard-failure.png"):
            log_in(page, hub.url, ADMIN_USER)
            page.goto(f"{hub.url}/services/{SERVICE}/")  # no token: the hub's OAuth lets the browser in
            page.wait_for_url(f"{hub.url}/services/{SERVICE}/", timeout=30_000)
            expect(page.locator("h1")).to_contain_text("gpupool — pool")  # the admin's view
            expect(page.locator("h1")).to_contain_text("simulated")
            cell = page.locator(f'.hm[data-uuid="{device["uuid"]}"]')
            expect(cell).to_have_text(re.compile(r"^\d+%$"), timeout=30_000)  # a sample, not "N/A"
            expect(page.locator("#pool")).to_contain_text(f"{USER}/dashboard")
            # the page refreshes itself: mark what is shown, and wait for a fresh copy to replace it
            page.evaluate("document.getElementById('gpupool-dashboard').dataset.old = '1'")
            expect(page.locator("#gpupool-dashboard:not([data-old])")).to_be_attached(timeout=30_000)
            page.screenshot(path=str(artifacts() / "dashboard.png"), full_page=True)
        page.close()
    mine = httpx.get(f"{hub.url}/services/{SERVICE}/", params={"token": hub.tokens[USER]}, timeout=20)
    assert mine.status_code == 200 and f"gpupool — {USER}" in mine.text and device["uuid"] in mine.text


def test_gpu_monitor_renders_in_jupyterlab_on_a_spawned_h100_server(hub: RunningHub) -> None:
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        with screenshot_on_failure(page, "gpu-monitor-failure.png"):
            page.goto(f"{hub.url}/hub/login")
            page.fill("#username_input", USER)
            page.fill("#password_input", "any")
            page.click("#login_submit")
            page.wait_for_url(re.compile(r"/hub/spawn"), timeout=30_000)
            page.check("#gpupool-profile-h100")
            page.click('form button[type="submit"]')
            page.wait_for_url(re.compile(rf"/user/{USER}/lab"), timeout=LAB_TIMEOUT_MS)
            server = hub.api("GET", f"users/{USER}").json()["servers"][""]
            hub.pids.add(int(server["state"]["pid"]))
            notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(LAB_CELL)])
            notebook.metadata["kernelspec"] = {
                "name": "python3",
                "display_name": "Python 3",
                "language": "python",
            }
            put = httpx.put(
                f"{hub.url}/user/{USER}/api/contents/monitor.ipynb",
                json={"type": "notebook", "format": "json", "content": notebook},
                headers={"Authorization": f"token {hub.tokens[USER]}"},
                timeout=30,
            )
            assert put.status_code in (200, 201), put.text
            monitor = run_first_cell(
                page, f"{hub.url}/user/{USER}/lab/tree/monitor.ipynb", ".gpupool-gpu-monitor"
            )
            expect(monitor.locator(".gpupool-card")).to_have_count(1, timeout=30_000)
            expect(monitor).to_contain_text(re.compile(r"Utilisation\s*\d+%"), timeout=30_000)
            expect(monitor).to_contain_text("simulated")
            monitor.scroll_into_view_if_needed()
            page.screenshot(path=str(artifacts() / "gpu-monitor.png"))
            page.goto(f"{hub.url}/hub/home")
            page.wait_for_load_state("networkidle")  # the button works once the scripts run
            page.click("#stop")
            expect(page.locator("#stop")).to_be_hidden(timeout=60_000)
        page.close()


def test_a_pending_cull_warning_shows_on_the_users_hub_home_page(hub: RunningHub) -> None:
    lease = lease_for(hub, ADMIN_USER, "mig-3g", "")
    reason = "its GPUs have been idle (at most 10% utilisation) for 30m, the limit of profile mig-3g"
    warning = {"user": ADMIN_USER, "lease_id": lease["id"], "cull_at": time.time() + 600, "reason": reason}
    cpu_only = lease_for(hub, ADMIN_USER, "cpu", "notes")  # a named server with no GPU: "its CPUs and memory"
    notes = warning | {"lease_id": cpu_only["id"], "server": "notes", "reason": "it has been inactive for 1h"}
    with hub.as_user("admin") as admin:  # the culler's part: the admin service token may record warnings
        assert admin.post("/warnings", json=warning).status_code == 201
        assert admin.post("/warnings", json=notes).status_code == 201
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        with screenshot_on_failure(page, "home-cull-warning-failure.png"):
            log_in(page, hub.url, ADMIN_USER)
            page.goto(f"{hub.url}/hub/home")
            shown = page.locator(".gpupool-cull-warning").filter(has_text="Your server will be stopped in")
            expect(shown).to_contain_text(reason, timeout=30_000)
            expect(shown).to_contain_text("and its GPUs returned to the pool")
            notes_shown = page.locator(".gpupool-cull-warning").filter(has_text="Your server “notes” will be")
            expect(notes_shown).to_contain_text("and its CPUs and memory returned to the pool")
            page.screenshot(path=str(artifacts() / "home-cull-warning.png"), full_page=True)
        page.close()
    with hub.as_user("admin") as admin:
        assert admin.delete(f"/leases/{lease['id']}").status_code == 200
        assert admin.delete(f"/leases/{cpu_only['id']}").status_code == 200
    # mona has no warning: the page's source for it answers her an empty list
    mine = httpx.get(
        f"{hub.url}/services/{SERVICE}/my/warnings", params={"token": hub.tokens[USER]}, timeout=20
    )
    assert mine.status_code == 200 and mine.json() == []


def test_a_login_callback_without_this_browsers_state_is_refused(hub: RunningHub) -> None:
    answer = httpx.get(
        f"{hub.url}/services/{SERVICE}/oauth_callback", params={"code": "c", "state": "forged"}, timeout=20
    )
    assert answer.status_code == 400 and "state" in answer.text
    # and a browser with no login at all is sent to the hub to log in, not shown anything
    page = httpx.get(f"{hub.url}/services/{SERVICE}/", timeout=20)
    assert page.status_code == 302 and "/hub/api/oauth2/authorize" in page.headers["location"]
