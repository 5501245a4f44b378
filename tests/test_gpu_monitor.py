"""What ``GpuMonitor`` shows, from the service's answers: cards, sparklines, "N/A", the pool line, warnings.

The rendering functions are pure; the last tests drive the widget itself against a stand-in connection (no
kernel, no service), refreshing by hand (with no event loop running, nothing refreshes by itself).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from gpupool.spawner.client import GpupoolError
from gpupool.widgets.gpu_monitor import (
    NA,
    GpuMonitor,
    device_card,
    device_title,
    monitor_html,
    out_of_pool,
    pool_free_line,
    sparkline_svg,
    warning_lines,
)

MIG = {"uuid": "MIG-1", "node": "node-a", "gpu": 6, "mig_profile": "3g.40gb", "memory_mib": 40960}
GPU = {"uuid": "GPU-5", "node": "node-a", "gpu": 5, "mig_profile": None, "memory_mib": 81920}


def _sample(t: float, **fields: Any) -> dict[str, Any]:
    base = {
        "time": t,
        "gpu_utilization": None,
        "memory_used_mib": None,
        "memory_total_mib": None,
        "temperature_c": None,
        "power_w": None,
        "power_limit_w": None,
    }
    return base | fields


def _points(svg: str) -> list[list[tuple[float, float]]]:
    return [
        [tuple(map(float, p.split(","))) for p in run.split()]  # type: ignore[misc]
        for run in re.findall(r'points="([^"]*)"', svg)
    ]


def test_a_sparkline_spans_ten_minutes_up_to_now_and_scales_to_its_top() -> None:
    svg = sparkline_svg(
        [(400.0, 0.0), (700.0, 50.0), (1000.0, 100.0)], now=1000, top=100, width=100, height=22
    )
    (run,) = _points(svg)
    assert [x for x, _ in run] == [0.0, 50.0, 100.0]
    assert run[0][1] == 21.0 and run[2][1] == 1.0 and run[1][1] == 11.0  # bottom, top, middle
    assert svg.startswith("<svg") and 'width="100"' in svg


def test_a_sparkline_breaks_where_a_value_is_not_available_and_drops_what_is_older_than_the_window() -> None:
    svg = sparkline_svg([(100.0, 5.0), (500.0, 10.0), (600.0, None), (700.0, 20.0)], now=1000, top=100)
    assert [len(run) for run in _points(svg)] == [1, 1]  # 100 is out of the window; None splits the line


def test_a_sparkline_without_values_is_an_empty_frame_not_a_line_at_zero() -> None:
    svg = sparkline_svg([(990.0, None), (995.0, None)], now=1000)
    assert "<polyline" not in svg and "<rect" in svg


def test_a_card_shows_each_metric_and_na_where_the_device_cannot_say_never_zero() -> None:
    samples = [
        _sample(
            990, gpu_utilization=12.0, memory_used_mib=2048.0, memory_total_mib=40960.0, temperature_c=41.0
        ),
        _sample(
            992, gpu_utilization=87.0, memory_used_mib=4096.0, memory_total_mib=40960.0, temperature_c=44.0
        ),
    ]
    card = device_card(MIG, samples, now=992)
    assert "node-a · GPU 6 · MIG 3g.40gb" in card and "MIG-1" in card
    assert "87%" in card and "4.0 / 40.0 GiB" in card and "44 °C" in card
    power_row = re.search(r"<th>Power</th><td[^>]*>([^<]*)</td>", card)
    assert power_row is not None and power_row.group(1) == NA  # a MIG slice has no power reading of its own
    assert "0 W" not in card
    assert card.count("<svg") == 4


def test_a_card_before_any_sample_says_na_with_the_lease_s_memory_size() -> None:
    card = device_card(GPU, [], now=0)
    values = re.findall(r'<td class="gpupool-value[^"]*">([^<]*)</td>', card)
    assert values == [NA, f"{NA} / 80.0 GiB", NA, NA]


def test_a_share_of_a_gpu_says_how_much() -> None:
    assert device_title(GPU | {"milli": 500}) == "node-a · GPU 5 · share 50%"
    assert device_title(GPU | {"milli": 1000}) == "node-a · GPU 5"


def test_the_pool_line_says_what_is_free_now() -> None:
    line = pool_free_line(
        {"whole_gpus_free": 1, "mig_slices_free": {"1g.10gb": 7, "3g.40gb": 1}, "shared_milli_free": 1500}
    )
    assert line == "Pool free now: 1 whole GPU; MIG slices 1g.10gb ×7, 3g.40gb ×1; 1.5 GPUs' worth of shares"
    one = pool_free_line({"whole_gpus_free": 2, "shared_milli_free": 1000})
    assert one == "Pool free now: 2 whole GPUs; MIG slices none; 1 GPU's worth of shares"  # was "1 GPUs'"


def test_a_cull_warning_of_this_server_says_when_and_why_and_others_are_not_shown() -> None:
    warnings = [
        {"user": "alice", "server": "", "lease_id": "L1", "cull_at": 1300.0, "reason": "GPU idle for 2 h"},
        {"user": "alice", "server": "big", "lease_id": "L2", "cull_at": 1010.0, "reason": "other server"},
    ]
    shown = warning_lines(warnings, now=1000.0, lease_id="L1")
    at = time.strftime("%H:%M", time.localtime(1300.0))  # the clock time of the cull, not only "in 5 min"
    assert f"stopped in 5 min (at {at}): GPU idle for 2 h" in shown and "other server" not in shown
    assert warning_lines([], now=0) == ""


def test_a_card_on_a_drained_node_s_mig_slice_says_so_and_a_healthy_one_says_nothing() -> None:
    pool = {  # GET pool's "out": a GPU's own mark or, here, its node's
        "nodes": [
            {"name": "node-a", "gpus": [{"uuid": "GPU-6", "out": "drained", "mig": [MIG]}]},
            {"name": "node-b", "gpus": [{"uuid": "GPU-5", "out": None, "mig": []}]},
        ]
    }
    out = out_of_pool(pool)
    assert out == {"GPU-6": "drained", "MIG-1": "drained"}
    shown = monitor_html([MIG, GPU], {}, now=0.0, simulated=False, out=out)
    assert shown.count("drained for maintenance") == 1 and shown.index("MIG-1") < shown.index(
        "drained"
    ) < shown.index("GPU-5")


def test_the_monitor_labels_simulated_numbers_and_says_when_there_is_no_gpu() -> None:
    html = monitor_html([], {}, now=0, simulated=True, pool_line="Pool free now: …")
    assert "simulated" in html and "holds no GPU" in html and "Pool free now" in html
    assert "simulated" not in monitor_html([GPU], {}, now=0, simulated=False).split("</style>")[1]


class _Service:
    """A stand-in :class:`Connection`: the answers of a service with one leased GPU, no warnings API and a
    server using 2.5 of its 16 cores and 3 of its 128 GiB."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.time = 100.0

    async def acall(self, method: str, path: str, **kwargs: Any) -> Any:
        self.calls.append((path, kwargs.get("params") or {}))
        if path == "leases/L1":
            device = {"kind": "gpu", "uuid": "GPU-5", "gpu_uuid": "GPU-5", "label": "H100 #5", "milli": 1000}
            return {"id": "L1", "state": "granted", "devices": [device | {"memory_mib": 81920}]}
        if path == "telemetry":
            self.time += 2
            sample = _sample(self.time, gpu_utilization=55.0, power_w=300.0, power_limit_w=700.0)
            device = GPU | {"samples": [sample]}
            return {"simulated": True, "devices": [device, MIG | {"samples": [sample]}]}
        if path == "pool":
            return {"summary": {"whole_gpus_free": 3, "mig_slices_free": {}, "shared_milli_free": 0}}
        if path == "warnings":
            raise GpupoolError(404, "not_found", "Not Found")
        if path == "leases/L1/resources":
            return {
                "limits_by": "cgroup",
                "cpu_limit": 16.0,
                "memory_limit_mib": 131072,
                "cpu_used": 2.5,
                "memory_used_mib": 3072.0,
            }
        raise AssertionError(path)

    def close(self) -> None:
        pass


def test_the_widget_shows_only_its_lease_s_device_and_asks_only_for_new_samples() -> None:
    service = _Service()
    monitor = GpuMonitor(service, refresh=3600, lease_id="L1")  # type: ignore[arg-type]
    try:
        assert "waiting for the gpupool service" in monitor.view.value and not service.calls
        asyncio.run(monitor.update())
        asyncio.run(monitor.update())
        html = monitor.view.value
        assert "GPU-5" in html and "MIG-1" not in html
        assert "55%" in html and "300 W / 700 W" in html and "simulated" in html
        assert "3 whole GPUs" in html
        assert "CPU 2.5 of 16 cores · memory 3.0 of 128.0 GiB" in html
        telemetry = [params for path, params in service.calls if path == "telemetry"]
        assert telemetry == [{}, {"since": 102.0}]
        assert len(monitor.samples["GPU-5"]) == 2
    finally:
        monitor.close()


def test_a_monitor_whose_service_cannot_be_reached_says_so_and_shows_no_cards() -> None:
    class Down(_Service):
        async def acall(self, method: str, path: str, **kwargs: Any) -> Any:
            raise GpupoolError(
                0, "unreachable", "cannot reach the gpupool service at http://x/api/v1: refused"
            )

    monitor = GpuMonitor(Down(), refresh=3600, lease_id="L1")  # type: ignore[arg-type]
    try:
        asyncio.run(monitor.update())
        shown = monitor.view.value
        assert "cannot reach the gpupool service" in shown and "waiting" not in shown
        assert 'class="gpupool-card"' not in shown and "holds no GPU" not in shown
    finally:
        monitor.close()


def test_a_followed_lease_still_in_the_queue_shows_its_place_and_expected_start_not_no_gpu() -> None:
    """Finding 1 of the researcher's-day review: GpuMonitor said nothing of when a queued lease would start."""
    said = "Waiting for a free H100-80GB: you are next; expected to start by 14:05 UTC (in about 12 min)"
    html = monitor_html([], {}, now=0.0, simulated=True, waiting=[said])
    assert said in html and "holds no GPU" not in html
