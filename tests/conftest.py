"""Test helpers live beside the tests (``builders``); make them importable."""

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

from kube_cluster import LocalKube, local_kube
from postgres_server import PostgresMissing, PostgresServer, postgres_server

from gpupool.spawner.service.store.lease_store import sqlite_url

# Property tests: a developer's run draws new examples (how a newline in a pool file was found); CI's run
# (.ci/run sets HYPOTHESIS_PROFILE=repeatable) draws the same ones on every run, so a red CI is the change's doing.
# Neither limits an example's time: two busy cores are not a failure.
settings.register_profile("explore", deadline=None)
settings.register_profile("repeatable", derandomize=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "explore"))


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    """The real control plane with the simulated nodes of ``tests/pools/kube.yaml``: once per test run."""
    with local_kube(tmp_path_factory.mktemp("kube")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server (Debian's package), once per test run (per worker)."""
    try:
        server = postgres_server()
        running = server.__enter__()
    except PostgresMissing as missing:
        pytest.fail(str(missing))
    try:
        yield running
    finally:
        server.__exit__(None, None, None)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database for the service's store: an SQLite file, then a database on the real PostgreSQL."""
    if request.param == "sqlite":
        return sqlite_url(str(tmp_path / "gpupool.sqlite"))
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database()


# Tiers: `make test` runs everything; `make test-fast` leaves out what starts processes, a browser or a cluster.
_HARNESSES = ("hub_harness", "up_harness", "token_hub", "subprocess")
_BROWSER_MODULES = (
    "test_browser",
    "test_gpu_monitor_hub",
    "test_job_panel_browser",
    "test_one_server",
    "test_queue_browser",
    "test_training_example",
)


_starts_processes: dict[str, bool] = {}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark each test with its tier and its pytest-xdist group as it is collected, before any
    ``pytest_collection_modifyitems`` (pytest-xdist's reads the groups). Grouping needs pytest < 9.2
    (pytest-xdist#1386; pinned in pyproject.toml): with 9.2 every module was split over both workers, each
    starting the module's hub (and the control plane) once more."""
    path = Path(str(item.fspath))
    if path.stem not in _starts_processes:
        text = path.read_text()
        _starts_processes[path.stem] = any(
            f"import {h}" in text or f"from {h} import" in text for h in _HARNESSES
        )
    if "kube" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.kube)
    if path.stem in _BROWSER_MODULES:
        item.add_marker(pytest.mark.browser)
    if _starts_processes[path.stem]:
        item.add_marker(pytest.mark.e2e)
    # With workers (pytest -n, --dist loadgroup): a module's tests share one worker and its module-scoped
    # hub, and every test on the control plane shares the one worker that starts it.
    item.add_marker(pytest.mark.xdist_group("kube" if item.get_closest_marker("kube") else path.stem))


# The modules that take minutes (each on one worker), longest first: measured on 2 cores, 2026-12-08 (6.1, 4.0,
# 3.1, 2.2, 2.2 and 1.5 minutes). `make test` passes --no-loadscope-reorder: by default pytest-xdist hands out
# the groups with the most tests first, whatever this order, and test_queue_browser, one test, ran last, alone.
LONGEST_MODULES = (
    "test_gpupool_up",
    "test_crash_recovery",
    "test_queue_browser",
    "test_one_server",
    "test_local_spawner",
    "test_jobs_api",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The control plane, once started, runs until the session ends. In one process its tests run last, so it
    # takes no CPU from the timing-sensitive tests (telemetry from real CPU load) that would follow. With
    # workers the long groups go first (the control plane's, then those that start processes or a browser)
    # and the quick modules fill in behind them, so the two workers finish together.
    if "PYTEST_XDIST_WORKER" not in os.environ:
        items.sort(key=lambda item: item.get_closest_marker("kube") is not None)
        return

    def weight(item: pytest.Item) -> tuple[int, int]:
        if item.get_closest_marker("kube"):
            return 0, 0
        if item.get_closest_marker("e2e") or item.get_closest_marker("browser"):
            # the longest first: test_queue_browser (three minutes) handed out last ended a run alone
            stem = item.path.stem
            return 1, LONGEST_MODULES.index(stem) if stem in LONGEST_MODULES else len(LONGEST_MODULES)
        return 2, 0

    items.sort(key=weight)
