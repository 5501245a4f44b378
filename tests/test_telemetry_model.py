"""The telemetry model: samples say "not available" rather than 0, recent history is bounded, and the
per-minute aggregates add up to the GPU-hours held and used that reports quote."""

from __future__ import annotations

import pytest

from gpupool.spawner.telemetry import Holder, MinuteAggregator, Sample, SampleHistory, Snapshot
from gpupool.spawner.telemetry.activity import ActivityTracker, GpuState


def sample(t: float, util: float | None = 50.0, uuid: str = "GPU-a", memory: float | None = 1024.0) -> Sample:
    return Sample(uuid, "node-1", 0, None, t, gpu_utilization=util, memory_used_mib=memory)


def test_a_metric_nobody_read_is_none_not_zero() -> None:
    reading = Sample("MIG-x", "node-1", 3, "1g.10gb", 10.0, memory_used_mib=512.0)
    assert reading.gpu_utilization is None and reading.power_w is None and reading.xid_errors is None
    data = reading.to_json()
    assert data["gpu_utilization"] is None and data["mig_profile"] == "1g.10gb" and reading.is_mig


@pytest.mark.parametrize(
    ("field", "value"),
    [("gpu_utilization", 101.0), ("memory_utilization", -1.0), ("memory_used_mib", -5.0), ("power_w", -1.0)],
)
def test_an_impossible_reading_is_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Sample("GPU-a", "n", 0, None, 0.0, **{field: value})


def test_history_keeps_ten_minutes_at_two_seconds_and_drops_the_oldest() -> None:
    history = SampleHistory(600, 2)
    assert history.capacity == 300
    for i in range(400):
        history.add(Snapshot(float(i * 2), (sample(i * 2.0), sample(i * 2.0, uuid="GPU-b")), False, "nvml"))
    kept = history.recent("GPU-a")
    assert len(kept) == 300 and kept[0].time == 200.0 and kept[-1].time == 798.0
    assert [s.time for s in history.recent("GPU-a", since=794.0)] == [796.0, 798.0]
    assert history.latest("GPU-b") is not None and history.latest("GPU-c") is None
    assert history.devices() == ["GPU-a", "GPU-b"] and history.simulated is False


def test_history_counts_xid_errors_over_time_and_forgets_devices_that_left() -> None:
    history = SampleHistory()
    history.add_sample(Sample("GPU-a", "n", 0, None, 1.0, xid_errors=(79,)))
    history.add_sample(Sample("GPU-a", "n", 0, None, 3.0, xid_errors=(48, 63)))
    history.add_sample(Sample("GPU-b", "n", 1, None, 3.0, xid_errors=()))
    assert history.xid_total("GPU-a") == 3 and history.xid_total("GPU-b") == 0
    history.forget(["GPU-b"])
    assert history.devices() == ["GPU-b"]


def test_a_minute_of_held_samples_splits_into_used_idle_and_unknown_seconds() -> None:
    alice = Holder("alice", "h100", "lease-1")
    aggregator = MinuteAggregator(idle_threshold=5)
    closed = []
    # 0..58 s: 10 s busy, 20 s idle, 10 s not measurable, then nothing held for the rest.
    t = 0.0
    for util, held in [(None, True)] + [(90.0, True)] * 5 + [(1.0, True)] * 10 + [(None, True)] * 5:
        t += 2
        closed += aggregator.add(sample(t, util), [alice] if held else [])
    for _ in range(5):
        t += 2
        closed += aggregator.add(sample(t, 0.0))
    assert closed == []  # the minute is still open
    closed = aggregator.add(sample(61.0, 0.0))
    by_holder = {a.holder: a for a in closed}
    held = by_holder[alice]
    assert (held.minute, held.seconds_held, held.seconds_used, held.seconds_unknown) == (
        0.0,
        40.0,
        10.0,
        10.0,
    )
    assert held.utilization_max == 90.0 and held.utilization_mean == pytest.approx((5 * 90 + 10) / 15)
    free = by_holder[None]
    assert (free.seconds, free.seconds_held, free.seconds_used) == (10.0, 0.0, 0.0)


def test_a_stalled_sampler_does_not_invent_held_time() -> None:
    aggregator = MinuteAggregator(max_gap=10)
    bob = Holder("bob", "mig-1g", "lease-2")
    aggregator.add(sample(0.0, 80.0), [bob])
    aggregator.add(sample(45.0, 80.0), [bob])  # 45 s without a sample: counts 10
    (minute,) = aggregator.flush()
    assert minute.seconds_held == 10.0 and minute.seconds_used == 10.0


def test_each_holder_of_a_shared_gpu_is_charged_the_time_it_held_it() -> None:
    aggregator = MinuteAggregator()
    holders = [Holder("alice", "share", "l1"), Holder("bob", "share", "l2")]
    for t in (0.0, 2.0, 4.0):
        aggregator.add(sample(t, 30.0), holders)
    minutes = aggregator.flush()
    assert sorted((m.holder.user if m.holder else "", m.seconds_held) for m in minutes) == [
        ("alice", 4.0),
        ("bob", 4.0),
    ]


def test_a_sample_from_before_the_previous_one_is_not_counted_twice() -> None:
    aggregator = MinuteAggregator()
    aggregator.add(sample(10.0), [Holder("a", "p", "l")])
    aggregator.add(sample(12.0), [Holder("a", "p", "l")])
    aggregator.add(sample(11.0), [Holder("a", "p", "l")])
    (minute,) = aggregator.flush()
    assert minute.seconds_held == 2.0


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"idle_threshold": 100}, "idle_threshold"), ({"max_gap": 0}, "max_gap")]
)
def test_bad_aggregator_settings_name_the_setting(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        MinuteAggregator(**kwargs)


@pytest.mark.parametrize(("util", "used"), [(6.0, 0.0), (10.0, 0.0), (11.0, 58.0)])
def test_a_gpu_the_idle_list_calls_idle_is_not_counted_used(util: float, used: float) -> None:
    """An admin trial: a job at 6% showed on the admin page as held but idle, and in its usage as 96% used. Both
    now read the one threshold (10% by default): at or below it idle, above it busy and used."""
    alice = Holder("alice", "h100", "lease-1")
    aggregator, tracker = MinuteAggregator(), ActivityTracker()
    for t in range(0, 60, 2):
        aggregator.add(sample(float(t), util), [alice])
        tracker.observe(sample(float(t), util))
    (minute,) = aggregator.add(sample(61.0, util), [alice])
    assert (minute.seconds_held, minute.seconds_used) == (58.0, used)
    state = tracker.activity(["GPU-a"], since=0.0, now=58.0, stale_after=10.0).state
    assert state is (GpuState.BUSY if used else GpuState.IDLE)
