"""What a researcher does in a real browser: log in to ``gpupool up``, read the spawn form, start a MIG slice.

Headless Debian Chromium (``/usr/bin/chromium``, which ``make test`` installs) driven by Playwright; never
Playwright's own browser download, which needs its CDN. The spawn form is saved as a screenshot under
``test-artifacts/`` (or ``$GPUPOOL_TEST_ARTIFACTS``), with JupyterLab once it is up and the page where a
failing run stopped, so a reviewer sees what users see.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from browser_harness import artifacts, chromium, log_in
from playwright.sync_api import Page, expect
from up_harness import Up, api_token, extra_config, free_port_family, login, require_proxy, start_up

MIG = "mig-3g"  # Half an H100 (MIG 3g.40gb) in hub_config/profiles.yaml; the demo pool has free slices
AVAILABLE = re.compile(r"(\d+) could start now \(simulated\)")
LAB_TIMEOUT_MS = 120_000  # spawn, OAuth and JupyterLab's first load take ~30-90 s on a 2-core CI box


@contextlib.contextmanager
def running_hub(tmp_path: Path) -> Iterator[Up]:
    require_proxy()
    up = start_up(tmp_path, tmp_path / "state", free_port_family(), extra_config(tmp_path))
    try:
        yield up
    finally:
        up.stop()


class Pool:
    """The gpupool service's REST API as the demo user: the ground truth the form must match."""

    def __init__(self, up: Up) -> None:
        with contextlib.closing(login(up)) as client:
            token = api_token(client)
        self.client = httpx.Client(
            base_url=f"{up.url}/services/gpupool/api/v1",
            headers={"Authorization": f"token {token}"},
            timeout=10,
        )

    def available_now(self, slug: str) -> int:
        response = self.client.get("/profiles")
        assert response.status_code == 200, response.text
        (profile,) = (p for p in response.json() if p["slug"] == slug)
        count: int = profile["available_now"]
        return count

    def close(self) -> None:
        self.client.close()

    def active_leases(self) -> list[dict[str, Any]]:
        response = self.client.get("/leases", params={"active_only": "true"})
        assert response.status_code == 200, response.text
        leases: list[dict[str, Any]] = response.json()
        return leases


def lands_on_the_spawn_form(page: Page) -> None:
    """Without a server, logging in leads straight to the form (the hub's /hub/ sends users to their server)."""
    page.wait_for_url(re.compile(r"/hub/spawn"), timeout=30_000)
    expect(page.locator(".gpupool-form")).to_be_visible(timeout=30_000)


def stop_server(page: Page, up: Up) -> None:
    """Stop the server the way a user does: the Stop My Server button on the hub's home page. The button works
    once the page's scripts have loaded (a click before that does nothing), and it hides itself once the
    server has stopped; the "My Server" button is there either way, so it proves nothing."""
    page.goto(f"{up.url}/hub/home")
    page.wait_for_load_state("networkidle")
    page.click("#stop")
    expect(page.locator("#stop")).to_be_hidden(timeout=60_000)


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def test_a_user_logs_in_sees_live_availability_and_starts_a_mig_slice_in_jupyterlab(tmp_path: Path) -> None:
    """The whole path a researcher takes, checked against the service: the form's count is the service's
    count, and starting the slice really takes one (and stopping gives it back)."""
    with chromium() as browser, running_hub(tmp_path) as hub, contextlib.closing(Pool(hub)) as pool:
        free_before = pool.available_now(MIG)
        assert free_before > 0, "the demo pool should have a free 3g.40gb slice"
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            log_in(page, hub.url, "demo", hub.password, lands=r"/hub/(?!login)")
            lands_on_the_spawn_form(page)

            # the form says the pool is simulated, and how many slices could start now, as the service counts
            expect(page.locator(".gpupool-simulated")).to_contain_text("Simulated pool")
            row = page.locator(f'.gpupool-profile[data-slug="{MIG}"]')
            expect(row).to_contain_text("Half an H100 (MIG 3g.40gb)")
            shown = AVAILABLE.search(row.inner_text())
            assert shown, f"no availability in the {MIG} row: {row.inner_text()!r}"
            assert int(shown.group(1)) == free_before
            page.screenshot(path=str(artifacts() / "spawn-form.png"), full_page=True)

            page.check(f"#gpupool-profile-{MIG}")
            page.click('form button[type="submit"]')
            page.wait_for_url(re.compile(r"/user/demo/lab"), timeout=LAB_TIMEOUT_MS)
            expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=LAB_TIMEOUT_MS)
            page.screenshot(path=str(artifacts() / "jupyterlab.png"))

            # the server holds a MIG lease, so one slice fewer could start now
            (lease,) = (lease for lease in pool.active_leases() if lease["owner_kind"] == "server")
            assert (lease["user"], lease["profile"], lease["state"]) == ("demo", MIG, "granted")
            assert pool.available_now(MIG) == free_before - 1

            stop_server(page, hub)
            # the spawner releases it at once; if that call fails (a busy first run), reconciliation releases
            # it: a pass a minute, and a lease is released on the second pass that finds its server gone
            assert wait_until(lambda: not pool.active_leases(), 130), (
                f"the lease outlived its server: {pool.active_leases()}\n{hub.gpupool_lines()}"
            )
            assert pool.available_now(MIG) == free_before
        except BaseException:  # pytest.fail too: a picture of where it stopped
            with contextlib.suppress(Exception):
                page.screenshot(path=str(artifacts() / "browser-failure.png"), full_page=True)
            raise
        finally:
            page.close()
