"""Where the service's pool comes from when no pool file is given: this host's GPUs through NVML, and without a
driver or GPUs a refusal naming NVML's error, unless a simulated pool was asked for (what ``gpupool up`` does).
A production hub must never serve made-up GPUs by accident."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pynvml as real
import pytest
from fake_pynvml import FakeGpu, fake_pynvml, h100_80gb
from hub_harness import free_port, service_command

from gpupool.spawner.backends.discovery import NoRealGpus, discover_pool


def test_without_a_driver_the_pool_is_refused_naming_nvmls_error() -> None:
    missing = fake_pynvml(init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(
        NoRealGpus, match=r"^No NVIDIA driver found \(libnvidia-ml.so is missing\)"
    ) as refused:
        discover_pool(simulated_fallback=False, nvml=missing)
    assert "GPUPOOL_SIMULATED_FALLBACK=1" in str(refused.value)  # and how to ask for a simulated pool


def test_a_driver_that_sees_no_gpus_is_refused_too() -> None:
    with pytest.raises(NoRealGpus, match=r"^NVML found no GPUs on this host"):
        discover_pool(simulated_fallback=False, nvml=fake_pynvml([]))


def test_asked_for_it_the_simulated_demo_pool_stands_in_and_says_so() -> None:
    shown = discover_pool(
        simulated_fallback=True, nvml=fake_pynvml(init_error=real.NVML_ERROR_DRIVER_NOT_LOADED)
    )
    assert shown.backend == "simulated" and "showing the simulated demo pool instead" in shown.note
    assert shown.note.startswith("The NVIDIA driver is installed but not loaded")


def test_real_gpus_are_used_whatever_the_fallback() -> None:
    gpus: list[FakeGpu] = [h100_80gb()]
    found = discover_pool(simulated_fallback=False, nvml=fake_pynvml(gpus))
    assert found.backend == "nvml" and len(found.nodes[0].gpus) == 1


def test_the_service_on_a_host_without_gpus_stops_at_start_with_nvmls_error(tmp_path: Path) -> None:
    assert discover_pool().backend == "simulated", "this test needs a host without NVIDIA GPUs (CI has none)"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "GPUPOOL_POOL"} | {
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
        "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
        "GPUPOOL_DB_URL": f"sqlite:///{tmp_path}/gpupool.sqlite",
    }
    stopped = subprocess.run(
        service_command(), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert stopped.returncode != 0
    assert (
        "gpupool service: " in stopped.stderr
        and "so the service stops rather than serve made-up ones" in (stopped.stderr)
    ), stopped.stderr
    assert "Traceback" not in stopped.stderr
