"""The README's training example, as written, from a notebook on ``gpupool up`` (what ``make run`` starts).

A researcher's first day: they log in with the printed demo password, get a CPU server, upload
``examples/train_with_checkpoints.py`` as ``train.py`` and run the README's cell in JupyterLab. The job must
find the notebook's ``python`` and NumPy (as root the servers and jobs run as the user's own ``gp-<name>`` with
a Python every account can run), run in the notebook's home, and leave its log and checkpoints where JupyterLab's file
browser opens them, ``~/.gpupool/jobs/<id>/``: before, a hidden folder the server refused to list. The file
browser on that folder is saved as ``training-example-files.png`` under ``test-artifacts/``. Then, as the
README says, ``gpupool jobs`` in JupyterLab's terminal lists the job (a trial's terminal had lost the server's
``PATH`` to Debian's ``/etc/profile``: "gpupool: command not found").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from pathlib import Path

import httpx
import nbformat
from browser_harness import LAB_TIMEOUT_MS, artifacts, chromium, log_in, run_first_cell, screenshot_on_failure
from playwright.sync_api import Page, expect
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect
from up_harness import Up, api_token, extra_config, free_port_family, login, require_proxy, start_up

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TRAIN = ROOT / "examples" / "train_with_checkpoints.py"


def readme_training_cell() -> str:
    """The Python block of the README's "Training jobs" section, unchanged."""
    section = README.read_text().split("## Training jobs", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's Training jobs section has no Python block"
    return match.group(1)


def test_the_readmes_training_cell_runs_from_a_notebook_and_its_files_show_in_jupyterlab(
    tmp_path: Path,
) -> None:
    require_proxy()
    up = start_up(tmp_path, tmp_path / "state", free_port_family(), extra_config(tmp_path))
    try:
        with contextlib.closing(login(up)) as hub_session:
            token = api_token(hub_session)
        hub = httpx.Client(
            base_url=f"{up.url}/hub/api", headers={"Authorization": f"token {token}"}, timeout=30
        )
        _start_cpu_server(up, hub)
        contents = httpx.Client(
            base_url=f"{up.url}/user/demo/api/contents",
            headers={"Authorization": f"token {token}"},
            timeout=30,
        )
        _upload(contents, "train.py", TRAIN.read_text())  # as JupyterLab's upload button does
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(readme_training_cell())])
        notebook.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        _upload(contents, "training.ipynb", nbformat.writes(notebook), kind="notebook")
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            with screenshot_on_failure(page, "training-example-failed.png"):
                log_in(page, up.url, "demo", up.password, lands=r"/hub/(spawn|home)|/user/demo/")
                cell_output = _run_readme_cell(page, up)
                ended = re.search(r"^(\S+) (succeeded|failed|cancelled|timed-out)$", cell_output, re.M)
                assert ended and ended.group(2) == "succeeded", cell_output
                assert "step 200/200" in cell_output, cell_output  # follow() printed the training's log
                _see_job_files(page, up, ended.group(1))
        listed = asyncio.run(_in_a_terminal(up, token, "gpupool jobs", until=ended.group(1)))
        assert re.search(rf"^{re.escape(ended.group(1))}\tdemo\t.*\tsucceeded\t", listed, re.M), listed
        hub.delete("/users/demo/server")
    finally:
        up.stop()


def _start_cpu_server(up: Up, hub: httpx.Client) -> None:
    started = hub.post("/users/demo/server", json={"profile": "cpu"})
    assert started.status_code in (201, 202), started.text
    deadline = time.monotonic() + 120
    while not hub.get("/users/demo").json()["servers"].get("", {}).get("ready"):
        assert time.monotonic() < deadline, f"the server did not start:\n{up.log_tail()}"
        time.sleep(0.3)


def _upload(contents: httpx.Client, name: str, text: str, kind: str = "file") -> None:
    body = {"type": kind, "format": "text", "content": text}
    if kind == "notebook":
        body = {"type": "notebook", "format": "json", "content": nbformat.reads(text, as_version=4)}
    answer = contents.put(f"/{name}", json=body)
    assert answer.status_code in (200, 201), answer.text


def _run_readme_cell(page: Page, up: Up) -> str:
    """Run the notebook's one cell; it ends by showing a JobPanel. Returns the cell's printed output."""
    run_first_cell(page, f"{up.url}/user/demo/lab/tree/training.ipynb", ".gpupool-job-panel")
    output = page.locator(".jp-Notebook .jp-CodeCell").first.locator(".jp-OutputArea")
    expect(output).to_contain_text("succeeded", timeout=LAB_TIMEOUT_MS)
    return output.inner_text()


def _see_job_files(page: Page, up: Up, job_id: str) -> None:
    """JupyterLab's file browser on the job's folder lists its log and its checkpoint folder (opened too)."""
    page.goto(f"{up.url}/user/demo/lab/tree/.gpupool/jobs/{job_id}")
    listing = page.locator(".jp-DirListing-content")
    for name in ("output.log", "checkpoint"):
        expect(listing.get_by_text(name, exact=True)).to_be_visible(timeout=LAB_TIMEOUT_MS)
    page.screenshot(path=str(artifacts() / "training-example-files.png"))
    page.goto(f"{up.url}/user/demo/lab/tree/.gpupool/jobs/{job_id}/checkpoint")
    expect(listing.get_by_text("train.npz", exact=True)).to_be_visible(timeout=LAB_TIMEOUT_MS)


async def _in_a_terminal(up: Up, token: str, command: str, until: str, timeout: float = 60) -> str:
    """Type ``command`` into a new JupyterLab terminal; what it printed, once ``until`` shows (or time is up)."""
    headers = {"Authorization": f"token {token}"}
    made = httpx.post(f"{up.url}/user/demo/api/terminals", headers=headers, timeout=30)
    assert made.status_code == 200, made.text
    url = f"{up.url}/user/demo/terminals/websocket/{made.json()['name']}".replace("http", "ws", 1)
    connection = await websocket_connect(HTTPRequest(url, headers=headers))
    await connection.write_message(json.dumps(["stdin", f"{command}\r"]))
    printed, deadline = "", time.monotonic() + timeout
    try:
        while until not in printed.split(command, 1)[-1] and time.monotonic() < deadline:
            with contextlib.suppress(asyncio.TimeoutError):
                message = await asyncio.wait_for(connection.read_message(), 1)
                if message is None:
                    break
                kind, *content = json.loads(message)
                printed += content[0] if kind == "stdout" else ""
    finally:
        connection.close()
    return printed
