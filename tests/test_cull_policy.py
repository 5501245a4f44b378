"""The culling policy without a hub: GPU activity from samples, and the arbiter's verdicts on a lease's activity."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.spawner.hub.cull import CullConfigError, CullSettings, judge
from gpupool.spawner.telemetry.activity import ActivityTracker, GpuState
from gpupool.spawner.telemetry.samples import Sample


def _sample(uuid: str, at: float, util: float | None) -> Sample:
    return Sample(uuid=uuid, node="n", gpu_index=0, mig_profile=None, time=at, gpu_utilization=util)


def _tracker(readings: dict[str, list[float | None]], start: float = 100.0) -> ActivityTracker:
    tracker = ActivityTracker(10.0)
    for uuid, values in readings.items():
        for i, util in enumerate(values):
            tracker.observe(_sample(uuid, start + i, util))
    return tracker


def test_a_gpu_is_idle_since_it_was_last_above_the_threshold() -> None:
    tracker = _tracker({"g": [50, 50, 5, 10, 0, 0]})  # busy until t=101
    activity = tracker.activity(["g"], since=0, now=106, stale_after=10)
    assert activity.state is GpuState.IDLE and activity.idle_seconds == 5 and activity.last_busy_at == 101


def test_idleness_counts_from_the_grant_not_from_before_it() -> None:
    tracker = _tracker({"g": [0] * 10})
    assert tracker.activity(["g"], since=105, now=110, stale_after=10).idle_seconds == 5


def test_one_busy_device_makes_the_lease_busy() -> None:
    tracker = _tracker({"a": [0, 0, 0], "b": [0, 0, 80]})
    assert tracker.activity(["a", "b"], since=0, now=103, stale_after=10).state is GpuState.BUSY


@pytest.mark.parametrize(
    ("readings", "now"),
    [
        ({"g": [0, 0, None]}, 103),  # "not available" now
        ({"g": [0, 0, 0]}, 200),  # the sampler stopped: the last reading is stale
        ({}, 103),  # never sampled
    ],
)
def test_a_gpu_without_fresh_readings_is_unknown_never_idle(
    readings: dict[str, list[Any]], now: float
) -> None:
    activity = _tracker(readings).activity(["g"], since=0, now=now, stale_after=10)
    assert activity.state is GpuState.UNKNOWN and activity.idle_seconds is None


def test_a_gap_in_readings_restarts_the_idle_count() -> None:
    tracker = _tracker({"g": [0, 0, None, 0, 0]})
    assert tracker.activity(["g"], since=0, now=104, stale_after=10).idle_seconds == 1  # since t=103


def test_history_folds_in_once() -> None:
    from gpupool.spawner.telemetry.history import SampleHistory
    from gpupool.spawner.telemetry.samples import Snapshot

    history = SampleHistory(60, 1)
    tracker = ActivityTracker()
    history.add(Snapshot(100, (_sample("g", 100, 90),), simulated=True, backend="simulated"))
    tracker.fold(history)
    history.add(Snapshot(101, (_sample("g", 101, 0),), simulated=True, backend="simulated"))
    tracker.fold(history)
    tracker.fold(history)
    assert tracker.activity(["g"], since=0, now=103, stale_after=10).idle_seconds == 3


def _activity(gpu_state: str = "idle", idle: float | None = 0, **limits: int | None) -> dict[str, Any]:
    base = {"idle_timeout": None, "gpu_idle_timeout": None, "max_lifetime": None}
    return {
        "profile": "p",
        "limits": base | limits,
        "gpu": {"state": gpu_state, "idle_seconds": idle, "threshold_percent": 10},
    }


def _judge(activity: dict[str, Any], inactive: float = 0, age: float | None = 10, limit: float = 3600) -> Any:
    return judge(activity, inactive=inactive, inactive_limit=limit, age=age, now=1000, warn_ahead=60)


def test_busy_gpus_are_never_culled_for_inactivity() -> None:
    assert _judge(_activity("busy", 0, idle_timeout=100), inactive=10_000) is None


def test_idle_gpus_are_culled_even_with_a_recent_browser() -> None:
    verdict = _judge(_activity("idle", 1800, gpu_idle_timeout=1800), inactive=1)
    assert verdict is not None and "GPUs have been idle" in verdict.reason and verdict.due_at == 1000


def test_the_warning_comes_ahead_of_the_limit() -> None:
    verdict = _judge(_activity("idle", 1750, gpu_idle_timeout=1800))
    assert verdict is not None and verdict.due_at == 1050
    assert _judge(_activity("idle", 1700, gpu_idle_timeout=1800)) is None  # more than warn_ahead away


def test_unknown_gpus_are_not_idle_but_the_browser_rule_still_holds() -> None:
    assert _judge(_activity("unknown", None, gpu_idle_timeout=10), inactive=5) is None
    verdict = _judge(_activity("unknown", None, idle_timeout=100), inactive=200)
    assert verdict is not None and "inactive" in verdict.reason


def test_gpu_use_counts_as_activity() -> None:
    assert _judge(_activity("idle", 30, idle_timeout=100), inactive=500) is None


def test_the_profile_idle_timeout_replaces_the_global_one() -> None:
    assert _judge(_activity("none", None, idle_timeout=100), inactive=200, limit=3600) is not None
    assert _judge(_activity("none", None), inactive=200, limit=3600) is None


def test_max_lifetime_culls_a_busy_server() -> None:
    verdict = _judge(_activity("busy", 0, max_lifetime=500), age=520)
    assert verdict is not None and "maximum lifetime" in verdict.reason and verdict.due_at == 980


def test_settings_fail_at_start_up_naming_the_variable() -> None:
    ok = {"GPUPOOL_SERVICE_URL": "http://127.0.0.1:1/services/gpupool", "JUPYTERHUB_API_TOKEN": "t"}
    assert CullSettings.from_env(ok).service_url.endswith("/gpupool/")
    with pytest.raises(CullConfigError, match="GPUPOOL_SERVICE_URL"):
        CullSettings.from_env({"JUPYTERHUB_API_TOKEN": "t"})
    with pytest.raises(CullConfigError, match="GPUPOOL_CULL_WARNING_SECONDS"):
        CullSettings.from_env(ok | {"GPUPOOL_CULL_WARNING_SECONDS": "-1"})
