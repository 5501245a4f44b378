"""Culls are kept in the service's store: a restarted service still lists them and counts them."""

from __future__ import annotations

from pathlib import Path

from gpupool.spawner.backends.simulated import DEMO_POOL, load_pool_file
from gpupool.spawner.service.leasing.culls import Culls
from gpupool.spawner.service.leasing.lease_manager import LeaseManager
from gpupool.spawner.service.store.cull_store import CullRecord, CullStore
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url


def _culls(db: Path) -> tuple[Culls, LeaseStore]:
    store = LeaseStore(sqlite_url(str(db)))
    return Culls(LeaseManager(load_pool_file(DEMO_POOL), store), CullStore(store.engine)), store


def test_culls_outlive_a_restart_in_the_list_and_the_counts(tmp_path: Path) -> None:
    """An admin's trial: gpupool_culls_total went back to 0 at a restart, and no record said who was culled."""
    culls, store = _culls(tmp_path / "gpupool.sqlite")
    culls.record(CullRecord(1000.0, "ada", "", "L1", "gpu_idle_timeout", "its GPUs were idle for 3m"))
    culls.record(CullRecord(2000.0, "grace", "big", "L2", "max_lifetime", "it ran for 1d"))
    # the hub's stop failed and the next pass orders the same cull again: one cull, not two
    culls.record(CullRecord(2060.0, "grace", "big", "L2", "max_lifetime", "it ran for 1d"))
    assert culls.counts == {"gpu_idle_timeout": 1, "max_lifetime": 1}
    store.close()

    again, store = _culls(tmp_path / "gpupool.sqlite")
    try:
        assert again.counts == {"gpu_idle_timeout": 1, "max_lifetime": 1}
        assert [(c.user, c.server, c.limit) for c in again.since(0)] == [
            ("grace", "big", "max_lifetime"),  # newest first
            ("ada", "", "gpu_idle_timeout"),
        ]
        assert [c.user for c in again.since(0, user="ada")] == ["ada"]
        assert again.since(1500) == again.since(0)[:1]
    finally:
        store.close()
