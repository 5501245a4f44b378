"""The lease store on real SQLite files: what is written reads back the same, in order, and durably."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpupool.spawner import cli
from gpupool.spawner.pool.leases import new_lease_id
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import Grant
from gpupool.spawner.service.store.lease_store import (
    LeaseNotFound,
    LeaseState,
    LeaseStore,
    NewLease,
    request_from_json,
    request_to_json,
    sqlite_url,
)

H100 = Request(4000, 16384, WholeGpus(2, frozenset({"H100-80GB"}), min_memory_mib=40960))
GRANTS = (
    Grant("gpu", "GPU-a", "GPU-a", "H100-80GB #0", 1000, 81920),
    Grant("gpu", "GPU-b", "GPU-b", "H100-80GB #1", 1000, 81920),
)


def new(user: str = "alice", request: Request = H100, at: float = 100.0, priority: int = 0) -> NewLease:
    return NewLease("server", user, "", "h100x2", request, priority, at)


@pytest.fixture
def store(db_url: str) -> LeaseStore:
    """A store on SQLite, then on PostgreSQL (the db_url fixture)."""
    return LeaseStore(db_url)


def test_wal_is_on_for_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "leases.sqlite"
    store = LeaseStore(sqlite_url(str(path)))
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    store.close()
    with sqlite3.connect(path) as plain:  # WAL is a property of the file: any later reader sees it
        assert plain.execute("PRAGMA journal_mode").fetchone() == ("wal",)


@pytest.mark.parametrize(
    "request_",
    [
        H100,
        Request(2000, 8192, MigSlice("3g.40gb", products=frozenset({"A100-80GB"}))),
        Request(2000, 8192, MigSlice(min_memory_gb=20)),
        Request(1000, 4096, GpuShare(250, memory_mib=6144)),
        Request(500, 1024),
    ],
)
def test_every_kind_of_request_reads_back_equal(request_: Request) -> None:
    assert request_from_json(request_to_json(request_)) == request_


def test_a_granted_lease_reads_back_as_written_after_reopening(db_url: str) -> None:
    url = db_url
    first = LeaseStore(url)
    written = first.add_granted(new(), "dgx", GRANTS)
    first.close()
    read = LeaseStore(url).get(written.id)
    assert read == written
    assert read is not None
    assert (read.state, read.node, read.devices) == (LeaseState.GRANTED, "dgx", GRANTS)
    assert read.granted_at == read.created_at == 100.0
    assert read.visible_devices == "GPU-a,GPU-b"
    assert len(read.id) == 12


def test_leases_come_back_in_arrival_order_even_at_the_same_instant(store: LeaseStore) -> None:
    ids = [store.add_queued(new(user=f"u{i}", at=5.0)).id for i in range(6)]
    assert [lease.id for lease in store.active()] == ids


def test_releasing_twice_keeps_the_first_reason_and_time(store: LeaseStore) -> None:
    lease = store.add_granted(new(), "dgx", GRANTS)
    first = store.mark_released(lease.id, "stopped", 200.0)
    again = store.mark_released(lease.id, "culled", 300.0)
    assert again == first
    assert (again.state, again.release_reason, again.released_at) == (LeaseState.RELEASED, "stopped", 200.0)
    assert store.active() == []


def test_only_a_queued_lease_can_be_granted(store: LeaseStore) -> None:
    queued = store.add_queued(new())
    granted = store.mark_granted(queued.id, "dgx", GRANTS, 150.0)
    assert (granted.state, granted.granted_at, granted.devices) == (LeaseState.GRANTED, 150.0, GRANTS)
    with pytest.raises(ValueError, match="only a queued lease"):
        store.mark_granted(queued.id, "dgx", GRANTS, 160.0)
    with pytest.raises(LeaseNotFound):
        store.mark_released("nope", "stopped", 1.0)
    assert store.get("nope") is None


def test_a_user_sees_only_their_own_leases(store: LeaseStore) -> None:
    mine = store.add_queued(new("alice"))
    store.add_queued(new("bob"))
    done = store.add_queued(new("alice"))
    store.mark_released(done.id, "cancelled", 1.0)
    assert [lease.id for lease in store.list_for_user("alice")] == [mine.id, done.id]
    assert [lease.id for lease in store.list_for_user("alice", active_only=True)] == [mine.id]


def test_an_owner_that_is_neither_server_nor_job_is_refused() -> None:
    with pytest.raises(ValueError, match="owner_kind must be one of server, job"):
        NewLease("notebook", "alice", "", "h100x2", H100, 0, 1.0)  # type: ignore[arg-type]


def test_an_in_memory_database_keeps_its_leases_between_calls() -> None:
    store = LeaseStore("sqlite://")
    lease = store.add_queued(new())
    assert store.get(lease.id) == lease


def test_every_new_id_can_be_typed_after_a_command() -> None:
    """An id starting with ``-`` (one in 64 of URL-safe ids) reads as an option: ``gpupool logs -UYY…`` failed."""
    for _ in range(2_000):
        lease_id = new_lease_id()
        assert len(lease_id) == 12 and not lease_id.startswith("-"), lease_id
        assert cli._parse(["logs", lease_id]).job_id == lease_id
