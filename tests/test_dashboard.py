"""The pages at ``/services/gpupool/``: the admin dashboard, a user's own page, and the idle finder behind them.

Pure parts (:func:`held_idle`, the HTML builders) are tested on plain records; the pages over the real app
(lease API, telemetry router and dashboard router) with the stand-in hub of ``test_telemetry_api``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_telemetry_api import USERS, Client, Service
from token_hub import token_hub

from gpupool.spawner.service.api.page_html import (
    IdleDevice,
    duration,
    heat_colour,
    heat_label,
    heat_map,
    idle_line,
    pool_tree,
)
from gpupool.spawner.service.api.pages import HeldDevice, held_idle
from gpupool.spawner.service.leasing.culls import CullWarning
from gpupool.spawner.service.store.cull_store import CullRecord
from gpupool.spawner.telemetry.aggregates import Holder, MinuteAggregate
from gpupool.spawner.telemetry.samples import Sample

HELD = HeldDevice("GPU-5", "H100-80GB #5 (dgx)", "alice", "L1", granted_at=0.0)


class _History:
    def __init__(self, utilizations: dict[float, float | None]) -> None:
        self.samples = [
            Sample("GPU-5", "dgx", 5, None, t, gpu_utilization=u) for t, u in sorted(utilizations.items())
        ]

    def recent(self, uuid: str, since: float | None = None) -> list[Sample]:
        return [s for s in self.samples if uuid == s.uuid and (since is None or s.time > since)]


def _minute(start: float, used: float = 0.0, utilization_max: float | None = 1.0) -> MinuteAggregate:
    holder = Holder("alice", "h100", "L1")
    return MinuteAggregate(
        "GPU-5",
        "dgx",
        5,
        None,
        start,
        holder,
        30,
        60.0,
        60.0,
        used,
        0.0,
        utilization_max,
        utilization_max,
        0,
        0,
    )


def test_a_held_gpu_below_the_threshold_since_some_time_is_idle_for_that_long() -> None:
    history = _History({3000 + 10 * i: (80.0 if i < 3 else 2.0) for i in range(30)})
    (idle,) = held_idle([HELD], history, [], threshold=5, min_seconds=60)
    assert idle.seconds == 290 - 30 and idle.peak == 2.0 and idle.user == "alice"


def test_a_gpu_busy_now_or_that_cannot_say_is_never_idle() -> None:
    busy_now = _History({3000 + 10 * i: (0.0 if i < 29 else 50.0) for i in range(30)})
    unknown = _History({3000 + 10 * i: (0.0 if i < 29 else None) for i in range(30)})
    assert held_idle([HELD], busy_now, []) == [] and held_idle([HELD], unknown, []) == []


def test_idleness_extends_back_through_idle_minutes_of_the_same_lease_until_a_busy_one_or_a_hole() -> None:
    history = _History({3600 + 10 * i: 0.0 for i in range(6)})  # the whole buffer idle, from 3600
    minutes = [_minute(3540), _minute(3480), _minute(3420, used=30, utilization_max=90), _minute(3360)]
    (idle,) = held_idle([HELD], history, minutes, min_seconds=0)
    assert idle.seconds == 3650 - 3480
    holed = [_minute(3540), _minute(3300)]  # nothing between 3360 and 3540: unknown, so it stops there
    (idle,) = held_idle([HELD], history, holed, min_seconds=0)
    assert idle.seconds == 3650 - 3540


def test_idle_on_the_dashboard_is_idle_to_the_culler_at_its_threshold() -> None:
    """The culler calls a GPU idle at or below GPUPOOL_GPU_IDLE_THRESHOLD (10%); so does the dashboard, in the
    recent samples and the stored minutes alike (7% is idle; before, the page's own 5% said it was in use)."""
    history = _History({3600 + 10 * i: 7.0 for i in range(6)})
    minutes = [_minute(3540, used=60, utilization_max=8.0), _minute(3480, used=60, utilization_max=10.0)]
    (idle,) = held_idle([HELD], history, minutes, threshold=10, min_seconds=0)
    assert (idle.seconds, idle.peak) == (3650 - 3480, 10.0)
    assert held_idle([HELD], history, minutes, threshold=5, min_seconds=0) == []


def test_the_dashboard_calls_idle_at_the_cullers_default_threshold_and_never_on_stale_readings() -> None:
    """Without a threshold said, the culler's default (10%), not the "used" one (5%); and a device whose
    latest reading is older than the culler's staleness limit is unknown to the culler, so not idle here."""
    history = _History({3600 + 10 * i: 8.0 for i in range(13)})
    (idle,) = held_idle([HELD], history, [], min_seconds=60)
    assert idle.seconds == 120
    assert held_idle([HELD], history, [], min_seconds=60, now=3720 + 15, stale_after=15) == [idle]
    assert held_idle([HELD], history, [], min_seconds=60, now=3720 + 16, stale_after=15) == []


def test_idleness_never_counts_from_before_the_lease_was_granted() -> None:
    history = _History({3000 + 10 * i: 0.0 for i in range(30)})
    (idle,) = held_idle([HeldDevice("GPU-5", "x", "bob", "L2", granted_at=3100)], history, [], min_seconds=0)
    assert idle.seconds == 3290 - 3100  # from the grant on: earlier samples belong to whoever held it before


def test_the_idle_line_reads_like_a_sentence() -> None:
    assert (
        idle_line(IdleDevice("GPU-5", "H100 #5", "alice", "L1", 3 * 3600 + 59, 0.0))
        == "3 h at 0% on H100 #5, alice"
    )
    assert idle_line(IdleDevice("GPU-5", "H100 #5", "bob", "L1", 90, 3.2)) == "1 min at ≤4% on H100 #5, bob"
    # a trial read "5 min at ≤0%" for a peak of half a percent: a bound that is never below the peak
    assert (
        idle_line(IdleDevice("MIG-1", "3g.40gb", "linus", "L2", 300, 0.5)) == "5 min at ≤1% on 3g.40gb, linus"
    )
    assert [duration(s) for s in (5, 600, 3600 * 26)] == ["5 s", "10 min", "1 d 2 h"]


def test_a_heat_map_square_is_labelled_for_people_and_screen_readers_alike() -> None:
    """Colour alone said nothing; each square names the device, its use and its holders, in ``title`` and
    ``aria-label`` both (escaped: holders are users' names)."""
    whole = {"index": 3, "uuid": "GPU-3", "product": "H100-80GB", "health": "healthy", "holders": ["L1"]}
    shared = {"index": 4, "uuid": "GPU-4", "product": "L4", "health": "drained", "holders": ["L2", "L3"]}
    node = {"name": "dgx", "health": "healthy", "gpus": [whole | {"mig": []}, shared | {"mig": []}]}
    holders = {"L1": "alice's server", "L2": "<b>eve</b>'s job 7", "L3": "bob's server"}
    cells = re.findall(
        r'title="([^"]*)" aria-label="([^"]*)"',
        heat_map({"nodes": [node]}, {"GPU-3": {"gpu_utilization": 42.4}}, holders),
    )
    assert [t for t, label in cells if t == label] == [
        "H100-80GB #3 on dgx: 42% used, held by alice&#x27;s server",
        "L4 #4 on dgx: utilisation not available, held by &lt;b&gt;eve&lt;/b&gt;&#x27;s job 7 and bob&#x27;s server, drained",
    ]
    assert (
        heat_label("MIG 1g.10gb slice of H100 #7 on dgx", 0.0, [])
        == "MIG 1g.10gb slice of H100 #7 on dgx: 0% used, free"
    )


def test_the_heat_map_colour_runs_from_cool_to_hot_and_grey_when_not_available() -> None:
    assert heat_colour(None) == "#c8c8c8"
    assert heat_colour(0) == "hsl(210, 75%, 88%)" and heat_colour(100) == "hsl(0, 75%, 50%)"
    assert heat_colour(250) == heat_colour(100)


@pytest.fixture(scope="module")
def hub_api() -> Iterator[str]:
    with token_hub(USERS) as url:
        yield url


def _service(tmp: Path, hub_api: str) -> Service:
    service = Service(tmp, hub_api)
    service.parts.idle_after = 60
    start = time.time() + 1  # after every grant
    for i in range(13):  # two minutes of samples; nobody runs anything, so every held device is idle
        service.telemetry.record(service.telemetry.sampler.sample(start + 10 * i))
    return service


def test_the_admin_dashboard_shows_the_pool_tree_heat_map_queue_and_idle_devices(
    tmp_path: Path, hub_api: str
) -> None:
    service = _service(tmp_path, hub_api)
    with Client(service.app) as client:
        response = client.get("", "admin-token")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "simulated" in page and "dgx-h100-01" in page and "MIG 3g.40gb" in page
    bob_gpu = service.bob.devices[0].uuid
    # the heat map has its latest reading, and says whose it is
    assert re.search(rf'data-uuid="{bob_gpu}" title="[^"]*: 0% used, held by bob&#x27;s server bob"', page)
    queue = page[page.index('id="queue"') : page.index('id="pool"')]
    assert "carol" in queue and service.carol[1].id in queue
    idle = page[page.index('id="idle"') : page.index('id="queue"')]
    assert re.search(r"2 min at 0% on H100-80GB #\d \(dgx-h100-01\), bob", idle), idle
    assert "alice" in idle  # her MIG slice is idle too


def test_the_admin_dashboard_lists_servers_warned_of_culling_and_the_culls_kept(
    tmp_path: Path, hub_api: str
) -> None:
    """An admin's trial found pending warnings only one user at a time, and past culls only in the hub's log."""
    service = _service(tmp_path, hub_api)
    now = service.parts.clock()
    culls = service.parts.culls
    culls.put(CullWarning("bob", "", service.bob.id, now + 600, "its GPUs have been idle for 30m", now))
    culls.record(CullRecord(now - 3600, "dave", "", "L9", "gpu_idle_timeout", "its GPUs were idle for 1h"))
    culls.record(CullRecord(now - 8 * 86400, "erin", "", "L8", "max_lifetime", "it ran for 2d"))  # too old
    with Client(service.app) as client:
        page = client.get("", "admin-token").text
        mine = client.get("?token=alice-token", None).text
    listed = page[page.index('id="culls"') : page.index("</section>", page.index('id="culls"'))]
    assert re.search(r"bob&#x27;s server stops at \d\d:\d\d UTC \(in about 10 min\): its GPUs have", listed)
    assert "dave&#x27;s server culled (gpu_idle_timeout): its GPUs were idle for 1h" in listed
    assert "erin" not in listed and 'id="culls"' not in mine


def test_a_user_sees_only_their_own_page_and_a_token_is_needed(tmp_path: Path, hub_api: str) -> None:
    service = _service(tmp_path, hub_api)
    with Client(service.app) as client:
        mine = client.get("?token=alice-token", None)
        assert client.get("", None).status_code == 401
        assert client.get("?token=nobody", None).status_code == 403
    assert mine.status_code == 200
    assert "gpupool — alice" in mine.text and service.alice.devices[0].uuid in mine.text
    assert service.bob.devices[0].uuid not in mine.text and "carol" not in mine.text
    assert 'id="queue"' not in mine.text


def test_the_pool_tree_names_holders_health_and_never_calls_a_mig_gpu_free() -> None:
    slice_ = {"uuid": "MIG-1", "profile": "3g.40gb", "start": 0, "free": False, "holders": ["L1"]}
    gpus = [
        {
            "index": 0,
            "uuid": "GPU-0",
            "product": "H100",
            "mode": "mig",
            "health": "healthy",
            "free_milli": None,
        }
        | {"holders": [], "mig": [slice_]},
        {"index": 1, "uuid": "GPU-1", "product": "H100", "mode": "whole", "health": "unhealthy"}
        | {"free_milli": 1000, "holders": [], "mig": []},
    ]
    node = {"name": "dgx", "health": "healthy", "cpu_milli": 8000, "cpu_free_milli": 4000, "gpus": gpus}
    board = {"temperature_c": 47.9, "power_w": 359.8, "power_limit_w": 700.0}
    tree = pool_tree({"nodes": [node]}, {"L1": "alice"}, {"MIG-1": {"gpu_utilization": 40.0}, "GPU-0": board})
    parent, slice_line, broken = re.findall(r'<div class="dev[^"]*"[^>]*>(.*?)</div>', tree)
    assert "split into MIG slices" in parent and "free" not in parent
    assert "mem N/A · 48 °C · 360/700 W" in parent  # a trial found temperature and power on no page
    assert "°C" not in slice_line and " W<" not in slice_line
    assert "alice" in slice_line and "util 40%" in slice_line and heat_colour(40.0) in slice_line
    assert "unhealthy" in broken and "util N/A" in broken
    assert "free" not in broken  # a trial read "free unhealthy": out of the pool is not free to anyone


def test_slices_of_a_gpu_out_of_the_pool_are_not_free_and_its_squares_are_outlined() -> None:
    slices = [
        {"uuid": f"MIG-{i}", "profile": "3g.40gb", "start": 4 * i, "free": True, "holders": []}
        for i in (0, 1)
    ]
    gpu = {
        "index": 0,
        "uuid": "GPU-0",
        "product": "H100",
        "mode": "mig",
        "health": "drained",
        "free_milli": None,
    }
    node = {"name": "dgx", "health": "healthy", "cpu_milli": 8000, "cpu_free_milli": 8000}
    pool = {"nodes": [node | {"gpus": [gpu | {"holders": [], "mig": slices}]}]}
    lines = re.findall(r'<div class="dev[^"]*"[^>]*>(.*?)</div>', pool_tree(pool, {}, {}))
    assert len(lines) == 3 and all("drained" in line and "free" not in line for line in lines), lines
    squares = re.findall(r'<span class="(hm[^"]*)"[^>]*aria-label="([^"]*)"', heat_map(pool, {}, {}))
    assert [c for c, _ in squares] == ["hm out", "hm out"]
    assert squares[0][1] == "MIG 3g.40gb slice of H100 #0 on dgx: utilisation not available, drained"
