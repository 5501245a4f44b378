"""``gpupool store copy``: a lab's SQLite store copied into the real PostgreSQL (Debian's, started by the tests)
and back, then opened by the lease manager as the service opens it after a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from postgres_server import PostgresServer
from sqlalchemy import text

from gpupool.spawner.backends.simulated import DEMO_POOL, load_pool_file
from gpupool.spawner.cli import main
from gpupool.spawner.pool.devices import Health
from gpupool.spawner.pool.job_states import Job
from gpupool.spawner.pool.leases import LeaseState
from gpupool.spawner.pool.requests import MigSlice, Request
from gpupool.spawner.service.leasing.lease_manager import LeaseManager
from gpupool.spawner.service.store.copy import StoreCopyError, copy_store
from gpupool.spawner.service.store.cull_store import CullRecord, CullStore
from gpupool.spawner.service.store.health_store import HealthStore, StoredMark
from gpupool.spawner.service.store.job_store import JobStore
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url
from gpupool.spawner.service.store.ownership import Claim
from gpupool.spawner.service.store.usage_store import MINUTES

NODES = load_pool_file(DEMO_POOL)
HALF_H100 = Request(4000, 16384, MigSlice("3g.40gb"))  # the demo has two 3g.40gb slices


def _lab_store(path: Path) -> tuple[str, dict[str, LeaseState]]:
    """A lab's SQLite store after a day's use: two granted slices, one request queued behind them, a job and
    its history, a drained GPU, usage minutes, a cull."""
    url = sqlite_url(str(path))
    store = LeaseStore(url)
    try:
        leases = LeaseManager(NODES, store)
        made = [leases.request_lease(u, [], "server", "", "mig-3g", HALF_H100) for u in ("ada", "bo", "cy")]
        job = Job(
            "j1", "ada", "sweep", "mig-3g", ("python", "train.py"), "/home/ada", {}, "batch", 2, 3600.0, 1.0
        )
        JobStore(store.engine).add(job)
        mark = StoredMark("dgx-h100-01", 3, Health.DRAINED, "drained by admin", "admin", 2.0)
        HealthStore(store.engine).add(mark)
        CullStore(store.engine).add(CullRecord(3.0, "bo", "", "l0", "idle_timeout", "inactive for 1h"))
        with store.engine.begin() as connection:
            connection.execute(MINUTES.insert(), [_minute(m) for m in range(3)])
        return url, {lease.id: lease.state for lease in made}
    finally:
        store.close()


def _minute(m: int) -> dict[str, object]:
    return {
        "minute": 60.0 * m, "uuid": "GPU-x", "node": "dgx-h100-01", "gpu_index": 0, "mig_profile": None,
        "user": "ada", "profile": "h100", "lease_id": "l1", "weight": 1.0, "seconds_held": 60.0,
        "seconds_used": 30.0, "seconds_unknown": 0.0, "utilization_mean": 50.0,
    }  # fmt: skip


def test_a_lab_store_copied_into_postgresql_keeps_every_lease_in_place_and_the_queue_in_order(
    tmp_path: Path, postgres: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source, states = _lab_store(tmp_path / "gpupool.sqlite")
    assert sorted(states.values()) == [LeaseState.GRANTED, LeaseState.GRANTED, LeaseState.QUEUED]
    target = postgres.new_database()
    assert main(["store", "copy", "--from", source, "--to", target]) == 0
    said = capsys.readouterr().out
    assert "copied culls 1, health marks 1, jobs 1, leases 3, usage minutes 3, job transitions 1" in said, (
        said
    )
    store = LeaseStore(target)
    try:
        leases = LeaseManager(NODES, store)
        assert {lease.id: lease.state for lease in leases.all_leases()} == states
        before = LeaseManager(NODES, LeaseStore(source))
        assert leases.pool.allocations == before.pool.allocations  # the same slices, held by the same leases
        queued = next(i for i, state in states.items() if state is LeaseState.QUEUED)
        assert leases.position(queued) == 0
        (job,) = JobStore(store.engine).list_all()
        assert job.command == ("python", "train.py") and [t.reason for t in job.history] == ["submitted"]
        assert [m.reason for m in HealthStore(store.engine).all()] == ["drained by admin"]
        later = leases.request_lease("dee", [], "server", "", "cpu", Request(1000, 1024, None))
        assert later.state is LeaseState.GRANTED  # a new lease takes the next arrival number, no clash
        with store.engine.begin() as connection:  # the copied ids did not leave PostgreSQL's sequence behind
            connection.execute(MINUTES.insert(), [_minute(3)])
    finally:
        store.close()
    back = sqlite_url(str(tmp_path / "back.sqlite"))
    copied = dict(copy_store(target, back).rows)  # and back again, with the new rows
    assert (copied["leases"], copied["usage_minutes"], copied["jobs"]) == (4, 4, 1)


def test_a_copy_refuses_a_store_in_use_a_target_with_rows_and_a_bad_url_naming_the_option(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    source, _ = _lab_store(tmp_path / "gpupool.sqlite")
    target = postgres.new_database()
    running = Claim(source)  # the hub's service, still running on the old store
    try:
        with pytest.raises(StoreCopyError, match=r"^--from: another gpupool service .* stop the hub"):
            copy_store(source, target)
    finally:
        running.release()
    copy_store(source, target)
    with pytest.raises(StoreCopyError, match=r"^--to: the database already holds 1 row\(s\) in culls"):
        copy_store(source, target)  # a second copy would duplicate or overwrite: refused, nothing written
    store = LeaseStore(target)
    try:
        assert len(store.list_all()) == 3
    finally:
        store.close()
    with pytest.raises(StoreCopyError, match=r"^--from: there is no SQLite database at"):
        copy_store(sqlite_url(str(tmp_path / "typo.sqlite")), postgres.new_database())
    assert not (tmp_path / "typo.sqlite").exists()  # nothing made where the typo pointed
    with pytest.raises(StoreCopyError, match=r"^--to: expected a database URL such as"):
        copy_store(source, "postgres at db01")
    with pytest.raises(StoreCopyError, match=r"^--to: names the same database as --from"):
        copy_store(source, source)
    # a lab's trial: a driver gpupool does not ship printed a traceback; "postgres" and a slash short, riddles
    with pytest.raises(
        StoreCopyError, match=r"^--to: cannot open the database: .*psycopg2.*: gpupool's .* psycopg"
    ):
        copy_store(source, "postgresql+psycopg2://gpupool@127.0.0.1/gpupool")
    with pytest.raises(StoreCopyError, match=r"the scheme is postgresql\+psycopg://, not postgres$"):
        copy_store(source, "postgres+psycopg://gpupool@127.0.0.1/gpupool")
    with pytest.raises(
        StoreCopyError, match=r"^--to: there is no folder .* four slashes, sqlite:////var/lib/"
    ):
        copy_store(source, "sqlite:///no-such-folder/gpupool.sqlite")
    spelled_otherwise = sqlite_url(str(tmp_path / "." / "gpupool.sqlite"))
    with pytest.raises(StoreCopyError, match=r"^--to: names the same database as --from"):
        copy_store(source, spelled_otherwise)


def test_a_row_the_target_refuses_stops_the_copy_naming_the_table_and_leaves_the_target_empty(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """SQLite keeps a string longer than its column; PostgreSQL refuses it (the review)."""
    source, _ = _lab_store(tmp_path / "gpupool.sqlite")
    store = LeaseStore(source)
    try:
        with store.engine.begin() as connection:
            connection.execute(text("UPDATE leases SET owner_name = :long"), {"long": "x" * 300})
    finally:
        store.close()
    target = postgres.new_database()
    with pytest.raises(StoreCopyError, match=r"^--to: leases: .*value too long.*; nothing was copied"):
        copy_store(source, target)
    emptied = LeaseStore(target)
    try:
        assert emptied.list_all() == [] and JobStore(emptied.engine).list_all() == []
    finally:
        emptied.close()


def test_the_cli_says_a_refusal_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["store", "copy", "--from", "sqlite:///nowhere.sqlite", "--to", "sqlite:///b.sqlite"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "gpupool: --from: there is no SQLite database at 'nowhere.sqlite' (a relative path: an absolute one takes "
        "four slashes, sqlite:////var/lib/…)\n"
    ), err
