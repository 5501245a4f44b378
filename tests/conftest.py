"""Test helpers live beside the tests (``builders``); make them importable."""

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kube_cluster import LocalKube, local_kube


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    """The real control plane with the simulated nodes of ``tests/pools/kube.yaml``: once per test run."""
    with local_kube(tmp_path_factory.mktemp("kube")) as cluster:
        yield cluster


# Tiers: `make test` runs everything; `make test-fast` leaves out what starts processes, a browser or a cluster.
_HARNESSES = ("hub_harness", "up_harness", "token_hub", "subprocess")
_BROWSER_MODULES = ("test_browser", "test_gpu_monitor_hub", "test_job_panel_browser")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    starts_processes: dict[str, bool] = {}
    for item in items:
        path = Path(str(item.fspath))
        if path.stem not in starts_processes:
            text = path.read_text()
            starts_processes[path.stem] = any(
                f"import {h}" in text or f"from {h} import" in text for h in _HARNESSES
            )
        if "kube" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kube)
        if path.stem in _BROWSER_MODULES:
            item.add_marker(pytest.mark.browser)
        if starts_processes[path.stem]:
            item.add_marker(pytest.mark.e2e)
        # With workers (pytest -n, --dist loadgroup): a module's tests share one worker and its module-scoped
        # hub, and every test on the control plane shares the one worker that starts it.
        item.add_marker(pytest.mark.xdist_group("kube" if item.get_closest_marker("kube") else path.stem))
    # The control plane, once started, runs until the session ends. In one process its tests run last, so it
    # takes no CPU from the timing-sensitive tests (telemetry from real CPU load) that would follow; with
    # workers they go first, so their worker is not left running them alone at the end.
    with_workers = "PYTEST_XDIST_WORKER" in os.environ
    items.sort(key=lambda item: (item.get_closest_marker("kube") is not None) != with_workers)
