"""One service owns the pool: two real service processes on one database (SQLite, then a real PostgreSQL), the
second refusing with a clear message, and the database free again once the first is killed with -9."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from hub_harness import free_port, service_command, wait_for

from gpupool.spawner.backends.simulated import DEMO_POOL


def _environment(db_url: str, port: int) -> dict[str, str]:
    return os.environ | {
        "GPUPOOL_DB_URL": db_url,
        "GPUPOOL_POOL": str(DEMO_POOL),
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
        "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",  # never asked: no request needs a token here
        "GPUPOOL_RECONCILE_SECONDS": "0",
        "GPUPOOL_SAMPLE_SECONDS": "0",
    }


@contextmanager
def running_service(db_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A service on ``db_url`` that answers; killed with SIGKILL at the end, as a crash would end it."""
    port = free_port()
    log = tmp_path / f"service-{port}.log"
    with log.open("wb") as out:
        service = subprocess.Popen(
            service_command(), env=_environment(db_url, port), cwd=tmp_path, stdout=out, stderr=out
        )
    try:
        url = f"http://127.0.0.1:{port}/services/gpupool/api/v1/openapi.json"
        wait_for(
            lambda: httpx.get(url, timeout=2).status_code == 200,
            "the service answers",
            log,
            60,
            process=service,
        )
        yield service
    finally:
        service.kill()
        service.wait()


def test_a_second_service_on_the_same_database_refuses_and_the_first_serves_on(
    db_url: str, tmp_path: Path
) -> None:
    with running_service(db_url, tmp_path):
        second = subprocess.run(
            service_command(),
            env=_environment(db_url, free_port()),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert "another gpupool service" in second.stderr and "owns the lease database" in second.stderr, (
            second.stderr
        )
        assert "Traceback" not in second.stderr
    # the first one was killed with -9: its claim went with it, and a new service starts on the database
    with running_service(db_url, tmp_path):
        pass
