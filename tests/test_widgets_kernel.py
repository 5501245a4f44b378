"""``GpuMonitor`` and ``JobPanel`` in a real kernel (nbclient + ipykernel) against a real HTTP service that is
slow, down, or fine: the widgets never hold up the kernel, say what they are waiting for, and a cell run
again leaves one poller per kind of widget, not two.

The service is a stand-in (``http.server`` in a thread of the test) answering what the widgets ask for:
one leased GPU with a sample, the pool, no warnings, one profile, one job and its log. The kernel finds it
as a spawned server would, from ``GPUPOOL_SERVICE_URL``, ``JUPYTERHUB_API_TOKEN`` and ``GPUPOOL_LEASE_ID``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from gpupool.spawner.names import API_PATH, SERVICE_PREFIX

pytestmark = pytest.mark.e2e  # starts a kernel

SLOW = 10.0  # seconds the slow service takes to answer each request
API = f"{SERVICE_PREFIX}{API_PATH}/"
SAMPLE = {
    "time": 1000.0,
    "gpu_utilization": 55.0,
    "memory_used_mib": 2048.0,
    "memory_total_mib": 81920.0,
    "temperature_c": 41.0,
    "power_w": 300.0,
    "power_limit_w": 700.0,
}
DEVICE = {"uuid": "GPU-5", "node": "node-a", "gpu": 5, "mig_profile": None, "memory_mib": 81920}
ANSWERS: dict[str, Any] = {
    "leases/L1": {"id": "L1", "state": "granted", "devices": [DEVICE | {"milli": 1000}]},
    "telemetry": {"simulated": True, "devices": [DEVICE | {"samples": [SAMPLE]}]},
    "pool": {"summary": {"whole_gpus_free": 3, "mig_slices_free": {}, "shared_milli_free": 0}},
    "warnings": [],
    "quota": {"user": "ada", "limits": [], "summary": "Your quota: no limits"},
    "profiles": [
        {"slug": "cpu", "display_name": "CPU only", "available_now": 64, "queued": 0, "never_fits": None}
    ],
    "jobs": [
        {
            "id": "j1",
            "name": "train",
            "profile": "cpu",
            "state": "running",
            "reason": "started",
            "devices": [],
            "position": None,
            "submitted_at": 1.0,
        },
        {
            "id": "j2",
            "name": "finetune",
            "profile": "cpu",
            "state": "queued",
            "reason": "waiting",
            "devices": [],
            "position": 0,
            "submitted_at": 2.0,
        },
    ],
}
LOG = "epoch 1 of 10\n"
NEWEST_LOG = "waiting for a device\n"  # j2's, the newest job: what the panel shows before any choice


class StandIn(ThreadingHTTPServer):
    """The service's answers, each ``delay`` seconds after its request came; ``answered`` holds the wall
    time of every answer sent."""

    daemon_threads = True
    block_on_close = False  # a closing test does not wait for answers still sleeping

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.answered: list[float] = []
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: StandIn

    def do_GET(self) -> None:
        time.sleep(self.server.delay)
        path = self.path.split("?")[0].removeprefix(API)
        if path in ("jobs/j1/logs", "jobs/j2/logs"):
            body, kind, status = (LOG if "j1" in path else NEWEST_LOG).encode(), "text/plain", 200
        elif path in ANSWERS:
            body, kind, status = json.dumps(ANSWERS[path]).encode(), "application/json", 200
        else:
            body, kind, status = b'{"error": "not_found", "detail": "no such path"}', "application/json", 404
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the kernel is gone (the test is over)
            return
        self.server.answered.append(time.time())

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


def serve(delay: float, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    server = StandIn(delay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    monkeypatch.setenv("GPUPOOL_SERVICE_URL", f"http://{host!s}:{port}{SERVICE_PREFIX}")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "a-token-acting-as-the-user")
    monkeypatch.setenv("GPUPOOL_LEASE_ID", "L1")
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def slow_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    yield from serve(SLOW, monkeypatch)


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    yield from serve(0.0, monkeypatch)


def run_cells(*cells: str) -> list[dict[str, Any]]:
    """Run the cells in a fresh kernel; each cell's last printed line, read as JSON."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    printed = [
        "".join(o.get("text", "") for o in c.outputs if o.get("name") == "stdout") for c in notebook.cells
    ]
    return [json.loads(text.strip().splitlines()[-1]) for text in printed]


MAKE = """\
import json, time
from gpupool.widgets import GpuMonitor, JobPanel
began = time.monotonic()
monitor = GpuMonitor(refresh=0.5)
panel = JobPanel(refresh=0.5)
took = time.monotonic() - began
print(json.dumps({"took": took, "returned": time.time(), "monitor": monitor.view.value,
                  "panel": panel.message.value}))
"""
# a cell that waits for a widget awaits: the widgets refresh on the kernel's loop, which `await` leaves free
AWAIT_DATA = """\
import asyncio
deadline = time.monotonic() + 90
while time.monotonic() < deadline and not ("55%" in monitor.view.value and "train" in panel.table.value):
    await asyncio.sleep(0.2)
print(json.dumps({"monitor": monitor.view.value, "table": panel.table.value, "message": panel.message.value,
                  "profiles": [label for label, _ in panel.profile.options], "log": panel.log_view.value}))
"""


def test_widgets_return_at_once_from_a_slow_service_say_they_wait_then_show_its_answers(
    slow_service: StandIn,
) -> None:
    made, shown = run_cells(MAKE, AWAIT_DATA)
    assert made["took"] < SLOW / 2, made  # made without waiting for the service
    assert made["returned"] < min(slow_service.answered), "the widgets were made only after an answer came"
    assert "waiting for the gpupool service…" in made["monitor"]
    assert "waiting for the gpupool service…" in made["panel"]
    assert "55%" in shown["monitor"] and "300 W / 700 W" in shown["monitor"], shown["monitor"]
    assert "Pool free now: 3 whole GPUs" in shown["monitor"] and "waiting" not in shown["monitor"]
    assert "train" in shown["table"] and "running" in shown["table"]
    assert shown["profiles"] == ["CPU only — 64 free now"]
    assert shown["message"] == ""


def test_widgets_of_a_service_that_is_down_say_they_cannot_reach_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setenv("GPUPOOL_SERVICE_URL", f"http://127.0.0.1:{port}{SERVICE_PREFIX}")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "a-token-acting-as-the-user")
    monkeypatch.setenv("GPUPOOL_LEASE_ID", "L1")
    await_failure = AWAIT_DATA.replace(
        '("55%" in monitor.view.value and "train" in panel.table.value)',
        '("cannot reach" in monitor.view.value and "cannot reach" in panel.message.value)',
    )
    made, shown = run_cells(MAKE, await_failure)
    assert made["took"] < SLOW / 2
    assert f"cannot reach the gpupool service at http://127.0.0.1:{port}" in shown["monitor"], shown
    assert "cannot reach the gpupool service" in shown["message"]
    assert 'class="gpupool-card"' not in shown["monitor"] and "No jobs" not in shown["table"]


REPLACE = """\
before = {"monitor": monitor, "panel": panel}
"""
COUNT = """\
import asyncio
updates = (before["monitor"].updates, monitor.updates)
await asyncio.sleep(2)
pollers = sorted(t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("gpupool-"))
print(json.dumps({"pollers": pollers, "old_monitor": before["monitor"].view.value,
                  "old_panel": before["panel"].message.value, "new_monitor": monitor.view.value,
                  "old_updates": [updates[0], before["monitor"].updates],
                  "new_updates": [updates[1], monitor.updates]}))
"""


def test_running_the_cell_again_leaves_one_poller_per_widget_not_two(service: StandIn) -> None:
    *_, counted = run_cells(MAKE, REPLACE + "print('{}')", MAKE, COUNT)
    assert counted["pollers"] == ["gpupool-gpu-monitor", "gpupool-job-panel"]
    old_before, old_after = counted["old_updates"]
    new_before, new_after = counted["new_updates"]
    assert old_after == old_before and new_after > new_before  # the old one stopped, the new one refreshes
    assert "replaced by a newer GpuMonitor" in counted["old_monitor"]
    assert "replaced by a newer JobPanel" in counted["old_panel"]
    assert "55%" in counted["new_monitor"]


CHOOSE = """\
import asyncio, json, time
from gpupool.widgets import JobPanel
panel = JobPanel(refresh=3600)  # nothing but the choice makes it refresh again
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not ("train" in panel.table.value and panel.log_view.value):
    await asyncio.sleep(0.1)
before = panel.log_view.value
panel.chosen.value = "j1"
while time.monotonic() < deadline and panel.log_view.value == before:
    await asyncio.sleep(0.1)
print(json.dumps({"before": before, "log": panel.log_view.value}))
"""


def test_choosing_a_job_in_the_panel_shows_its_log_at_once(service: StandIn) -> None:
    (shown,) = run_cells(CHOOSE)
    assert shown == {"before": NEWEST_LOG, "log": LOG}  # the newest job's log at once, then the chosen one
