"""One service owns the pool: two real service processes on one database (SQLite, then a real PostgreSQL), the
second refusing with a clear message, and the database free again once the first is killed with -9."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
from hub_harness import free_port, service_command, wait_for
from postgres_server import USER, PostgresServer

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.service.store.ownership import ADVISORY_KEY


def _environment(db_url: str, port: int) -> dict[str, str]:
    return os.environ | {
        "GPUPOOL_STORE_CHECK_SECONDS": "0.5",
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


def _second_service(db_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Another service started on ``db_url``, run to its end (a refusal, within a minute)."""
    return subprocess.run(
        service_command(),
        env=_environment(db_url, free_port()),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_service_on_the_same_database_refuses_and_the_first_serves_on(
    db_url: str, tmp_path: Path
) -> None:
    with running_service(db_url, tmp_path):
        second = _second_service(db_url, tmp_path)
        assert second.returncode != 0
        assert "another gpupool service" in second.stderr and "owns the lease database" in second.stderr, (
            second.stderr
        )
        assert "Traceback" not in second.stderr
    # the first one was killed with -9: its claim went with it, and a new service starts on the database
    with running_service(db_url, tmp_path):
        pass


def _lock_holders(postgres: PostgresServer, url: str, *, granted: bool = True) -> list[int]:
    """The sessions (backend pids) holding gpupool's advisory lock (``granted``), or waiting for it."""
    with psycopg.connect(host="127.0.0.1", port=postgres.port, user=USER, dbname=url.rsplit("/", 1)[1]) as db:
        rows = db.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted = %s "
            "AND ((classid::bigint << 32) | objid::bigint) = %s",
            (granted, ADVISORY_KEY),
        ).fetchall()
    return [int(pid) for (pid,) in rows]


def _end_the_lock_session(postgres: PostgresServer, url: str) -> set[int]:
    """End the session holding gpupool's advisory lock, as a PostgreSQL restart ends every session; the
    sessions ended."""
    holders = set(_lock_holders(postgres, url))
    assert holders, "no session holds gpupool's lock"
    with psycopg.connect(host="127.0.0.1", port=postgres.port, user=USER, dbname="postgres") as db:
        for pid in holders:
            db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return holders


def test_the_owner_takes_its_lock_again_after_a_database_restart_and_stops_if_another_took_it(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """A lab's trial restarted PostgreSQL under a running hub: the service went on without its lock, and a
    second service then started on the same database."""
    url = postgres.new_database()
    with running_service(url, tmp_path) as first:
        ended = _end_the_lock_session(postgres, url)
        taken_again = lambda: bool(set(_lock_holders(postgres, url)) - ended)  # noqa: E731
        wait_for(taken_again, "the lock taken again", Path("/dev/null"), 30)
        second = _second_service(url, tmp_path)
        assert second.returncode != 0 and "owns the lease database" in second.stderr, second.stderr
        assert first.poll() is None
        # another service waits for the lock, and gets it the moment the owner's session ends: the owner, finding
        # it taken, stops rather than share the database
        dbname = url.rsplit("/", 1)[1]
        with psycopg.connect(host="127.0.0.1", port=postgres.port, user=USER, dbname=dbname) as other:
            waiting = threading.Thread(
                target=other.execute, args=("SELECT pg_advisory_lock(%s)", (ADVISORY_KEY,))
            )
            waiting.start()
            queued = lambda: bool(_lock_holders(postgres, url, granted=False))  # noqa: E731
            wait_for(queued, "the other service's request in the lock's queue", Path("/dev/null"), 30)
            _end_the_lock_session(postgres, url)
            waiting.join(timeout=30)
            first.wait(timeout=30)
    log = next(tmp_path.glob("service-*.log")).read_text()
    assert "took the database while this one's lock was gone" in log, log[-3000:]
