"""The dashboard as an admin's console: the hub's navigation, labelled heat-map squares, servers beside jobs,
buttons that act through the REST API after a confirm(), and an idle list that agrees with the culler.

The service as its composition root builds it, over ASGI with the stand-in hub of ``test_telemetry_api``, for
what a page says and what its buttons' requests do; a real hub, proxy and headless Chromium for an admin who
logs in, clicks Drain, accepts the confirm and sees the node drained, and a user who finds no button.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from browser_harness import artifacts, chromium, log_in, screenshot_on_failure
from hub_harness import SERVICE, RunningHub, free_ports, write_hub_config
from job_user import clean_home, job_user
from playwright.sync_api import Dialog, expect
from test_telemetry_api import ACCESS, PREFIX, Client, Service
from token_hub import token_hub
from up_harness import require_proxy

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.pool.job_states import JobState
from gpupool.spawner.service.api.auth import ADMIN_SCOPE, TOKEN_COOKIE
from gpupool.spawner.service.jobs.submission import Submission

API = f"{PREFIX}api/v1"
CALLERS = {
    "ada-token": {"name": "ada", "kind": "user", "admin": True, "scopes": [ACCESS, ADMIN_SCOPE]},
    "root-token": {"name": "root", "kind": "user", "scopes": [ACCESS, ADMIN_SCOPE]},  # not the hub's admin
    "alice-token": {"name": "alice", "kind": "user", "scopes": [ACCESS]},
}
NODE = "dgx-h100-01"


@pytest.fixture(scope="module")
def hub_api() -> Iterator[str]:
    with token_hub(CALLERS) as url:
        yield url


def _sampled(service: Service, start: float, seconds: int = 120) -> Service:
    """``seconds`` of samples every 10 s from ``start``; nobody runs anything, so every device reads 0%."""
    service.parts.idle_after = 60
    for t in range(0, seconds + 1, 10):
        service.telemetry.record(service.telemetry.sampler.sample(start + t))
    return service


def _as_browser(client: Client, method: str, path: str, cookie: str, **headers: str) -> httpx.Response:
    """A request as a logged-in browser sends it: the login cookie, no Authorization header."""
    headers = {"Cookie": f"{TOKEN_COOKIE}={cookie}", "Content-Type": "application/json"} | headers
    body = headers.pop("body", None)
    return client.runner.run(client.http.request(method, path, headers=headers, content=body))


def _xsrf(page: str) -> str:
    found = re.search(r'id="gpupool-dashboard" data-xsrf="([^"]*)"', page)
    assert found, "the page carries no XSRF token"
    return found.group(1)


def _buttons(page: str) -> list[dict[str, str]]:
    """Every console button as the script reads it: its label and its data attributes, unescaped."""
    found = []
    for attributes, label in re.findall(r'<button type="button" class="act"([^>]*)>([^<]*)</button>', page):
        data = {k: html.unescape(v) for k, v in re.findall(r' data-(\w+)="([^"]*)"', attributes)}
        found.append(data | {"label": html.unescape(label)})
    return found


def test_both_pages_carry_the_hubs_navigation_under_its_base_url_and_admin_only_for_hub_admins(
    tmp_path: Path, hub_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTERHUB_BASE_URL", "/jh/")
    service = Service(tmp_path, hub_api)
    with Client(service.app) as client:
        admin = client.get("", "ada-token").text
        gpupool_admin = client.get("", "root-token").text
        user = client.get("", "alice-token").text
    assert _nav_links(admin) == [
        ("/jh/hub/home", "Home"),
        ("/jh/hub/token", "Token"),
        ("/jh/hub/admin", "Admin"),
        ("/jh/hub/logout", "Logout"),
    ]
    # the hub's admin page is the hub's admins' only; a gpupool admin or a user is not sent to a 403
    assert (
        _nav_links(gpupool_admin)
        == _nav_links(user)
        == [
            ("/jh/hub/home", "Home"),
            ("/jh/hub/token", "Token"),
            ("/jh/hub/logout", "Logout"),
        ]
    )
    assert '<span class="me">alice</span>' in user


def _nav_links(page: str) -> list[tuple[str, str]]:
    """The links of the navigation bar, the first thing in the page's body."""
    found = re.search(r'<body><nav class="hub" aria-label="JupyterHub">(.*?)</nav>', page)
    assert found, "no navigation bar on top"
    return re.findall(r'<a href="([^"]*)">([^<]*)</a>', found.group(1))


def test_every_heat_map_square_says_what_it_is_how_busy_and_who_holds_it(
    tmp_path: Path, hub_api: str
) -> None:
    service = _sampled(Service(tmp_path, hub_api), time.time() - 125)
    with Client(service.app) as client:
        page = client.get("", "root-token").text
    squares = re.findall(
        r'<span class="hm" role="img" data-uuid="([^"]*)" title="([^"]*)" aria-label="([^"]*)"', page
    )
    assert len(squares) == page.count('class="hm"') == 6 + 6 + 4 + 4  # whole H100s, slices, A100s, L4s
    said = {uuid: html.unescape(title) for uuid, title, label in squares if title == label}
    assert len(said) == len(squares)  # every title is the aria-label too
    bob = service.bob.devices[0]
    assert re.fullmatch(rf"H100-80GB #\d on {NODE}: 0% used, held by bob's server bob", said[bob.uuid])
    (alice,) = service.alice.devices
    assert re.fullmatch(
        rf"MIG 3g\.40gb slice of H100-80GB #6 on {NODE}: 0% used, held by alice's server alice",
        said[alice.uuid],
    )
    assert sum(s.endswith(": 0% used, free") for s in said.values()) > 0
    assert all(
        re.search(r": (\d+% used|utilisation not available), (held by .+|free)$", s) for s in said.values()
    )


@pytest.fixture(scope="module")
def runner() -> Iterator[str]:
    """Who submits the jobs: a system account (jobs never run as root)."""
    name = job_user()
    yield name
    clean_home(name)


@contextlib.contextmanager
def _console_with_jobs(tmp_path: Path, hub_api: str, user: str) -> Iterator[tuple[Service, Client, str, str]]:
    """The demo pool's service, serving, with a job of ``user``'s running on two A100s and one queued for four
    H100s (carol holds four of the six and waits for four more); every job is cancelled on the way out (a
    job's process outlives the service, as it must)."""
    service = Service(tmp_path, hub_api, job_grace_seconds=2)
    jobs = service.parts.jobs
    running, _ = jobs.submit(user, [], Submission("a100-pair", ["sleep", "60"], name="train <b>big</b>"))
    queued, _ = jobs.submit(user, [], Submission("h100-x4", ["sleep", "60"], name="next"))
    with Client(service.app) as client:
        try:
            client.wait_for(lambda: jobs.get(running.id).state is not JobState.QUEUED)
            assert jobs.get(running.id).state is JobState.RUNNING, jobs.get(running.id).reason
            yield service, client, running.id, queued.id
        finally:
            for job in (running, queued):
                if not jobs.get(job.id).state.finished:
                    jobs.cancel(job.id, "the test")
            client.wait_for(lambda: all(jobs.get(j.id).state.finished for j in (running, queued)))


def test_the_admin_sees_servers_beside_jobs_and_cancels_one_with_its_button(
    tmp_path: Path, hub_api: str, runner: str
) -> None:
    with _console_with_jobs(tmp_path, hub_api, runner) as (service, client, running, queued):
        page = _as_browser(client, "GET", PREFIX, "root-token").text
        assert page.index('<div class="side">') < page.index('id="servers"') < page.index('id="jobs"')
        servers = page[page.index('id="servers"') : page.index('id="jobs"')]
        listed = page[page.index('id="jobs"') : page.index('id="host"')]
        for lease in (service.alice, service.bob, *service.carol):
            assert lease.id in servers
        assert "<td>carol</td><td>carol</td><td>h100-x4</td><td>queued</td>" in servers
        name = "train &lt;b&gt;big&lt;/b&gt;"  # a user's words, escaped
        assert (
            f"<td>{running}</td><td>{name}</td><td>{runner}</td><td>a100-pair</td><td>running</td>" in listed
        )
        assert f"<td>{queued}</td><td>next</td><td>{runner}</td><td>h100-x4</td><td>queued</td>" in listed
        (cancel,) = [b for b in _buttons(page) if b["url"] == f"{API}/jobs/{running}"]
        assert cancel["label"] == "Cancel" and cancel["method"] == "DELETE"
        assert f"Cancel job train <b>big</b> ({running}) of {runner}?" in cancel["confirm"]
        xsrf = {"X-XSRFToken": _xsrf(page)}
        answer = _as_browser(client, cancel["method"], cancel["url"], "root-token", **xsrf)
        assert answer.status_code == 200 and answer.json()["state"] == "cancelled", answer.text
        assert answer.json()["reason"] == "cancelled by user root"
        page = _as_browser(client, "GET", PREFIX, "root-token").text
        listed = page[page.index('id="jobs"') : page.index('id="host"')]
        assert running not in listed and queued in listed


def test_a_user_sees_no_button_and_the_routes_refuse_what_a_button_would_ask(
    tmp_path: Path, hub_api: str, runner: str
) -> None:
    with _console_with_jobs(tmp_path, hub_api, runner) as (service, client, running, _queued):
        admin = _as_browser(client, "GET", PREFIX, "root-token").text
        mine = _as_browser(client, "GET", PREFIX, "alice-token").text
        assert "<button" not in mine and "X-XSRFToken" not in mine  # no buttons, no console script
        assert 'id="servers"' not in mine and 'id="jobs"' not in mine and running not in mine
        assert {b["label"] for b in _buttons(admin)} == {"Drain", "Release lease", "Cancel", "Requeue"}
        xsrf = {"X-XSRFToken": _xsrf(mine)}
        for button in _buttons(admin):  # alice replays the admin's buttons with her own login
            if button["url"] == f"{API}/leases/{service.alice.id}":
                continue  # her own lease: hers to release, as from the CLI
            body = button.get("body", "")
            refused = _as_browser(client, button["method"], button["url"], "alice-token", body=body, **xsrf)
            assert refused.status_code == 403, (button, refused.text)
        assert service.parts.jobs.get(running).state is JobState.RUNNING
    assert service.manager.health_of(NODE, None) == "healthy"
    assert service.manager.get(service.bob.id).state.value == "granted"


def test_a_login_cookie_changes_nothing_without_the_pages_xsrf_token_from_the_same_origin(
    tmp_path: Path, hub_api: str
) -> None:
    service = Service(tmp_path, hub_api)
    drain = f"{API}/admin/drain"
    body = json.dumps({"node": NODE})
    with Client(service.app) as client:
        page = _as_browser(client, "GET", PREFIX, "root-token").text
        (button,) = [
            b for b in _buttons(page) if b["url"] == drain and b["body"] == json.dumps({"node": NODE})
        ]
        assert "Drain node dgx-h100-01?" in button["confirm"]
        token = _xsrf(page)
        assert _as_browser(client, "POST", drain, "root-token", body=body).status_code == 401
        assert (
            _as_browser(
                client, "POST", drain, "root-token", body=body, **{"X-XSRFToken": "forged"}
            ).status_code
            == 403
        )
        other_site = {"X-XSRFToken": token, "Sec-Fetch-Site": "same-site"}
        assert _as_browser(client, "POST", drain, "root-token", body=body, **other_site).status_code == 403
        alices = _xsrf(_as_browser(client, "GET", PREFIX, "alice-token").text)  # another login's token
        assert (
            _as_browser(client, "POST", drain, "root-token", body=body, **{"X-XSRFToken": alices}).status_code
            == 403
        )
        assert service.manager.health_of(NODE, None) == "healthy"
        same = {"X-XSRFToken": token, "Sec-Fetch-Site": "same-origin"}
        drained = _as_browser(client, "POST", drain, "root-token", body=body, **same)
        assert drained.status_code == 200 and drained.json()["health"] == "drained", drained.text
        page = _as_browser(client, "GET", PREFIX, "root-token").text
        assert any(b["label"] == "Undrain" and b["body"] == body for b in _buttons(page))


def test_an_unhealthy_gpu_has_a_repair_button_that_puts_it_back(tmp_path: Path, hub_api: str) -> None:
    """A trial found no way back from a fault on the dashboard: repair was a curl command."""
    service = Service(tmp_path, hub_api)
    body = json.dumps({"node": NODE, "gpu_index": 2})
    with Client(service.app) as client:
        page = _as_browser(client, "GET", PREFIX, "root-token").text
        xsrf = {"X-XSRFToken": _xsrf(page), "Sec-Fetch-Site": "same-origin"}
        assert not [b for b in _buttons(page) if b["label"] == "Repair"]  # nothing is broken yet
        fault = _as_browser(client, "POST", f"{API}/admin/faults", "root-token", body=body, **xsrf)
        assert fault.status_code == 200 and fault.json()["health"] == "unhealthy", fault.text
        page = _as_browser(client, "GET", PREFIX, "root-token").text
        (repair,) = [b for b in _buttons(page) if b["label"] == "Repair"]
        assert (repair["url"], repair["body"]) == (f"{API}/admin/repair", body)
        assert "Only once it was reset or replaced" in repair["confirm"]
        done = _as_browser(client, repair["method"], repair["url"], "root-token", body=repair["body"], **xsrf)
        assert done.status_code == 200 and service.manager.health_of(NODE, 2) == "healthy", done.text
        page = _as_browser(client, "GET", PREFIX, "root-token").text
        assert not [b for b in _buttons(page) if b["label"] == "Repair"]


def test_held_but_idle_on_the_dashboard_is_what_the_culler_calls_idle(tmp_path: Path, hub_api: str) -> None:
    """Fresh readings at 0%: idle to both. The sampler stopped long ago: the culler cannot say (unknown), so
    the dashboard does not call anything idle either (before, it listed every held device as idle)."""
    service = Service(tmp_path, hub_api)
    start = time.time() + 1  # after every grant; the service's clock is the test's below
    _sampled(service, start)
    service.telemetry.interval = 2.0  # as the service samples (the loop itself stays off: the test feeds it)
    granted = [x for x in (service.alice, service.bob, *service.carol) if x.state.value == "granted"]
    with Client(service.app) as client:
        for now, verdict in ((start + 125, "idle"), (start + 400, "unknown")):
            service.parts.clock = lambda now=now: now
            page = client.get("", "root-token").text
            culler = {
                client.get(f"api/v1/activity/leases/{x.id}", "root-token").json()["gpu"]["state"]
                for x in granted
            }
            assert culler == {verdict}
            idle = page[page.index('id="idle"') : page.index('id="queue"')]
            shown = set(re.findall(r'<li class="idle">[^<]*, (\w+)(?:/\w+)?</li>', idle))
            assert shown == ({"alice", "bob", "carol"} if verdict == "idle" else set()), idle


# ---- a real hub and a browser --------------------------------------------------------------------------------

ADMIN_TOKEN = "test-admin-token-console-0123456789abcdef"
HUB_CLIENT_TOKEN = "test-hub-client-token-console-0123456789"
ADMIN_USER, USER = "ada", "mona"
ADMINS_ROLE = {
    "name": "gpupool-admins",
    "scopes": ["custom:gpupool:admin", f"access:services!service={SERVICE}"],
    "users": [ADMIN_USER],
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningHub]:
    require_proxy()
    tmp = tmp_path_factory.mktemp("console-hub")
    ports = free_ports()
    service_env = {"GPUPOOL_POOL": str(DEMO_POOL), "GPUPOOL_DB_URL": f"sqlite:///{tmp}/gpupool.sqlite"}
    write_hub_config(
        tmp,
        ports,
        admin_token=ADMIN_TOKEN,
        pool_file=DEMO_POOL,
        service_env=service_env,
        hub_client_token=HUB_CLIENT_TOKEN,
        extra_config=[
            f"c.JupyterHub.load_roles.append({ADMINS_ROLE!r})",
            f"c.Authenticator.admin_users = {{{ADMIN_USER!r}}}",
            "c.JupyterHub.redirect_to_server = False  # log in to the home page: no server is ever spawned",
        ],
    )
    with RunningHub(tmp, ports, ADMIN_TOKEN, service_env=service_env, fail=pytest.fail) as running:
        yield running


def _node_health(hub: RunningHub, node: str) -> str:
    with hub.admin() as admin:
        pool = admin.get(f"{hub.service_api}/pool").json()
    (found,) = [n for n in pool["nodes"] if n["name"] == node]
    return str(found["health"])


def test_an_admin_drains_a_node_from_the_console_in_chromium_after_saying_yes(hub: RunningHub) -> None:
    dialogs: list[str] = []
    answer = {"accept": True}

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept() if answer["accept"] else dialog.dismiss()

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        page.on("dialog", on_dialog)
        with screenshot_on_failure(page, "admin-console-failure.png"):
            log_in(page, hub.url, ADMIN_USER)
            page.goto(f"{hub.url}/services/{SERVICE}/")
            page.wait_for_url(f"{hub.url}/services/{SERVICE}/", timeout=30_000)
            nav = page.get_by_role("navigation", name="JupyterHub")
            expect(nav.get_by_role("link", name="Admin")).to_have_attribute("href", "/hub/admin")
            expect(nav.get_by_role("link", name="Logout")).to_have_attribute("href", "/hub/logout")
            square = page.get_by_role("img", name=re.compile(rf"^H100-80GB #0 on {NODE}: .*, free$"))
            expect(square).to_be_visible()
            drain = page.locator(f"#pool button[data-body='{json.dumps({'node': NODE})}']")
            answer["accept"] = False  # say no first: nothing happens
            drain.click()
            assert dialogs == [
                f"Drain node {NODE}? Nothing new is placed there; jobs running there are stopped and requeued; "
                "servers keep running."
            ]
            assert _node_health(hub, NODE) == "healthy"
            answer["accept"] = True
            drain.click()
            expect(page.locator("#gpupool-result")).to_have_text(f"Drained node {NODE}.", timeout=20_000)
            assert _node_health(hub, NODE) == "drained"
            expect(drain).to_have_text("Undrain", timeout=20_000)  # the page refreshed after the action
            drained = re.compile(rf"^H100-80GB #0 on {NODE}: [^,]*, drained$")  # not "free": out of the pool
            expect(page.get_by_role("img", name=drained)).to_be_visible()
            page.screenshot(path=str(artifacts() / "admin-console.png"), full_page=True)
            drain.click()
            expect(page.locator("#gpupool-result")).to_have_text(f"Undrained node {NODE}.", timeout=20_000)
            assert _node_health(hub, NODE) == "healthy"


FORGED_DRAIN = """(body) => fetch('api/v1/admin/drain', {method: 'POST', body, headers: {
    'Content-Type': 'application/json',
    'X-XSRFToken': document.getElementById('gpupool-dashboard').dataset.xsrf}}).then(r => r.status)"""


def test_a_user_finds_no_button_in_chromium_and_a_drain_sent_from_their_page_is_refused(
    hub: RunningHub,
) -> None:
    with chromium() as browser:
        user = browser.new_page(viewport={"width": 1280, "height": 900})
        with screenshot_on_failure(user, "admin-console-user-failure.png"):
            log_in(user, hub.url, USER)
            user.goto(f"{hub.url}/services/{SERVICE}/")
            expect(user.locator("h1")).to_contain_text(f"gpupool — {USER}", timeout=30_000)
            links = user.get_by_role("navigation", name="JupyterHub").get_by_role("link")
            expect(links).to_have_text(["Home", "Token", "Logout"])
            expect(user.locator("button")).to_have_count(0)
            # what a forged Drain button would send, from her own page with her own XSRF token: refused
            assert user.evaluate(FORGED_DRAIN, json.dumps({"node": NODE})) == 403
    assert _node_health(hub, NODE) == "healthy"
