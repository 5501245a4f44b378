"""The simulated sampler follows real processes: a busy one makes its device busy, an idle one leaves it idle."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from builders import gpu, node

from gpupool.spawner.backends.simulated_telemetry import SimulatedSampler, pids_by_visible_devices
from gpupool.spawner.telemetry import Sample, Snapshot

# A parent that only waits, and a child that spins: the child's CPU must count for the lease.
BUSY_CHILD = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"
IDLE = "import time; time.sleep(600)"
POOL = [node("sim", [gpu("sim", 0), gpu("sim", 1, layout=["3g.40gb@0", "3g.40gb@4"])])]


@pytest.fixture
def start() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a Python process in its own session; all of them (and their children) are killed afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def run(code: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, env=env)
        started.append(process)
        return process

    yield run
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its own process group: the spinning child too
        process.wait()


def sample_until(
    sampler: SimulatedSampler, done: Callable[[dict[str, Sample]], bool], deadline_s: float = 30
) -> dict[str, Sample]:
    deadline = time.monotonic() + deadline_s
    while True:
        time.sleep(0.3)
        readings = {s.uuid: s for s in sampler.sample(time.time()).samples}
        if done(readings) or time.monotonic() > deadline:
            return readings


def test_a_busy_child_makes_its_device_busy_and_an_idle_process_leaves_its_device_idle(
    start: Callable[..., subprocess.Popen[bytes]],
) -> None:
    busy, idle = start(BUSY_CHILD), start(IDLE)
    sampler = SimulatedSampler(POOL, lambda: {"GPU-sim-0": {busy.pid}, "MIG-sim-1-4": {idle.pid}})

    def settled(r: dict[str, Sample]) -> bool:
        return (r["GPU-sim-0"].gpu_utilization or 0) >= 50 and r["MIG-sim-1-4"].gpu_utilization is not None

    readings = sample_until(sampler, settled)
    hot, cold = readings["GPU-sim-0"], readings["MIG-sim-1-4"]
    assert hot.gpu_utilization is not None and hot.gpu_utilization >= 50, hot
    assert cold.gpu_utilization is not None and cold.gpu_utilization <= 10, cold
    assert readings["MIG-sim-1-0"].gpu_utilization == 0.0  # nobody holds it
    assert hot.power_w is not None and hot.power_limit_w is not None and hot.power_w > 0.5 * hot.power_limit_w
    assert hot.memory_used_mib is not None and hot.memory_used_mib > 0.2 * (hot.memory_total_mib or 0)
    assert readings["GPU-sim-1"].gpu_utilization is None  # a GPU in MIG mode, as NVML shows it
    assert cold.power_w is None and cold.temperature_c == readings["GPU-sim-1"].temperature_c


def test_a_device_goes_idle_when_its_process_stops(start: Callable[..., subprocess.Popen[bytes]]) -> None:
    busy = start(BUSY_CHILD)
    holders = {"MIG-sim-1-0": {busy.pid}}
    sampler = SimulatedSampler(POOL, lambda: holders)
    sample_until(sampler, lambda r: (r["MIG-sim-1-0"].gpu_utilization or 0) >= 50)
    os.killpg(busy.pid, signal.SIGKILL)
    busy.wait()
    readings = sample_until(sampler, lambda r: r["MIG-sim-1-0"].gpu_utilization == 0.0)
    assert readings["MIG-sim-1-0"].gpu_utilization == 0.0
    holders.clear()  # the lease is released
    readings = sample_until(sampler, lambda r: r["MIG-sim-1-0"].memory_used_mib == 0.0)
    assert readings["MIG-sim-1-0"].memory_used_mib == 0.0


def test_processes_are_found_by_the_devices_they_are_pinned_to(
    start: Callable[..., subprocess.Popen[bytes]],
) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="MIG-sim-1-0,GPU-sim-0")
    pinned, other = start(IDLE, env), start(IDLE, dict(os.environ, CUDA_VISIBLE_DEVICES="GPU-elsewhere"))
    deadline = time.monotonic() + 10
    found: dict[str, set[int]] = {}
    while time.monotonic() < deadline:  # the child's environment is readable once exec is done
        found = pids_by_visible_devices({"MIG-sim-1-0", "GPU-sim-0", "GPU-sim-1"})
        if pinned.pid in found.get("GPU-sim-0", set()):
            break
        time.sleep(0.1)
    assert pinned.pid in found["MIG-sim-1-0"] and pinned.pid in found["GPU-sim-0"]
    assert other.pid not in {pid for pids in found.values() for pid in pids} and "GPU-sim-1" not in found


def test_every_snapshot_says_it_is_simulated_and_covers_every_device() -> None:
    snapshot: Snapshot = SimulatedSampler(POOL, dict).sample(1.0)
    assert snapshot.simulated and snapshot.backend == "simulated"
    assert [s.uuid for s in snapshot.samples] == ["GPU-sim-0", "GPU-sim-1", "MIG-sim-1-0", "MIG-sim-1-4"]
    assert [s.memory_total_mib for s in snapshot.samples] == [81920, 81920, 40960, 40960]
