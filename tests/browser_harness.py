"""Headless Debian Chromium for the browser tests, and where they save their screenshots.

``/usr/bin/chromium`` (which ``make test`` installs) driven by Playwright; never Playwright's own browser
download, which needs its CDN. Screenshots go to ``test-artifacts/`` (or ``$GPUPOOL_TEST_ARTIFACTS``), so a
reviewer sees what users see. ``test_browser`` and ``test_job_panel_browser`` share it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # the test machine reaches nothing outside; don't let it try
    "--disable-component-update",
    "--disable-sync",
]


def artifacts() -> Path:
    folder = Path(os.environ.get("GPUPOOL_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's Chromium, headless; missing fails the test (not an error, not a skip): ``make test`` installs
    it."""
    if not CHROMIUM.is_file():
        pytest.fail(
            f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium); "
            "the browser test needs Debian's Chromium, not Playwright's download"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def screenshot_on_failure(page: Page, name: str) -> Iterator[Page]:
    """On any failure (``pytest.fail`` too), save a picture of where the page stopped as ``name``."""
    try:
        yield page
    except BaseException:
        with contextlib.suppress(Exception):
            page.screenshot(path=str(artifacts() / name), full_page=True)
        raise


LAB_TIMEOUT_MS = 120_000  # spawn, OAuth and JupyterLab's first load take ~30-90 s on a 2-core CI box
KERNEL_IDLE = re.compile(r"Python 3 \(ipykernel\) \| Idle")  # the status bar's kernel status


def run_first_cell(page: Page, notebook_url: str, widget: str) -> Locator:
    """Open a notebook in JupyterLab, run its first cell once the kernel is up, and return the widget the
    cell shows (CSS selector ``widget``); a cell that fails fails the test with its traceback."""
    page.goto(notebook_url)
    cell = page.locator(".jp-Notebook .jp-CodeCell").first
    expect(cell).to_be_visible(timeout=LAB_TIMEOUT_MS)
    # run only once the kernel is up: before, JupyterLab asks for a kernel instead of running the cell
    expect(page.get_by_text(KERNEL_IDLE)).to_be_visible(timeout=LAB_TIMEOUT_MS)
    cell.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    shown = page.locator(widget)
    error = cell.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    expect(shown.or_(error)).to_be_visible(timeout=LAB_TIMEOUT_MS)
    if error.is_visible():
        pytest.fail(f"the cell failed:\n{error.inner_text()}")
    return shown


def log_in(
    page: Page, hub_url: str, user: str, password: str = "any", lands: str = r"/hub/(spawn|home)"
) -> None:
    """Log in through the hub's login form, as a user would (the tests' own hubs take any password; the demo
    login of ``gpupool up`` the one it printed), and wait until the hub shows a page matching ``lands``:
    by default the spawn form or the home page."""
    page.goto(f"{hub_url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(lands), timeout=30_000)
