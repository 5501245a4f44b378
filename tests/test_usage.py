"""Long-term usage: closed minutes of held devices are stored, and reports add them up into GPU-hours held
against GPU-hours used, per user and profile, across a service restart."""

from __future__ import annotations

import pytest

from gpupool.spawner.service.store.lease_store import LeaseStore
from gpupool.spawner.service.store.usage_store import UsageStore
from gpupool.spawner.telemetry import Holder, MinuteAggregator, Sample

ALICE = Holder("alice", "h100", "lease-1")
BOB = Holder("bob", "mig-1g", "lease-2", gpu_equivalents=1 / 7)  # a 1g slice of an H100


def _hour_of_minutes(aggregator: MinuteAggregator, uuid: str, profile: str | None, util: float, who: Holder):
    """An hour of 2-second samples for one device at a steady utilisation; the minutes that closed."""
    closed = []
    for step in range(0, 3600 + 60, 2):
        reading = Sample(uuid, "dgx", 0, profile, 1_000_020.0 + step, gpu_utilization=util)
        closed += aggregator.add(reading, [who])
    return closed


@pytest.fixture
def usage(db_url: str) -> UsageStore:
    return UsageStore(LeaseStore(db_url).engine)


def test_an_hour_held_busy_and_an_hour_held_idle_read_as_such(usage: UsageStore) -> None:
    aggregator = MinuteAggregator()
    usage.add(_hour_of_minutes(aggregator, "GPU-a", None, 80.0, ALICE))
    usage.add(_hour_of_minutes(aggregator, "MIG-b", "1g.10gb", 0.0, BOB))
    alice, bob = usage.report(0, 2e6)
    assert (alice.user, alice.profile) == ("alice", "h100")
    assert alice.gpu_hours_held == pytest.approx(1.0, abs=0.02)
    assert alice.gpu_hours_used == pytest.approx(alice.gpu_hours_held)
    assert alice.idle_share == pytest.approx(0.0)
    assert bob.gpu_hours_held == pytest.approx(1 / 7, abs=0.01)  # a 1g slice is a seventh of the GPU
    assert bob.gpu_hours_used == 0 and bob.idle_share == pytest.approx(1.0)


def test_minutes_nobody_held_are_not_billed_and_reports_filter_by_user(usage: UsageStore) -> None:
    aggregator = MinuteAggregator()
    idle = [
        aggregator.add(Sample("GPU-c", "dgx", 1, None, 1_000_000.0 + s, gpu_utilization=0.0))
        for s in range(0, 200, 2)
    ]
    usage.add(minute for closed in idle for minute in closed)
    assert usage.report(0, 2e6) == []
    usage.add(_hour_of_minutes(aggregator, "GPU-a", None, 50.0, ALICE))
    assert [row.user for row in usage.report(0, 2e6, user="bob")] == []
    assert [row.user for row in usage.report(0, 2e6, user="alice")] == ["alice"]


def test_the_minutes_outlive_a_restart(db_url: str) -> None:
    first = UsageStore(LeaseStore(db_url).engine)
    first.add(_hour_of_minutes(MinuteAggregator(), "GPU-a", None, 80.0, ALICE))
    again = UsageStore(LeaseStore(db_url).engine)
    (row,) = again.report(0, 2e6)
    assert row.gpu_hours_held == pytest.approx(1.0, abs=0.02)
