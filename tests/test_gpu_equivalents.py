"""One GPU-equivalent everywhere: a whole GPU is 1, a share its milli, a MIG slice its compute slices over its
GPU's; an hour held on each reads the same in ``GET usage``, on the user's page and in ``/metrics``."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_telemetry_api import USERS, Client, Service, metrics
from token_hub import token_hub

from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES, load_profiles
from gpupool.spawner.pool import gpu_equivalents
from gpupool.spawner.service.api.telemetry_routes import render_metrics


def test_a_devices_weight_is_the_part_of_a_gpu_it_takes(tmp_path: Path) -> None:
    assert gpu_equivalents.mig_instance_milli("H100-80GB", "3g.40gb") == 429  # 3 of 7 compute slices
    assert gpu_equivalents.mig_instance_milli("A30-24GB", "1g.6gb") == 250  # 1 of the A30's 4
    assert gpu_equivalents.mig_instance_milli("H100-80GB", "7g.80gb") == 1000


@pytest.fixture(scope="module")
def hub_api() -> Iterator[str]:
    with token_hub(USERS) as url:
        yield url


def test_an_hour_on_a_slice_a_share_and_a_whole_gpu_reads_the_same_in_usage_the_page_and_metrics(
    tmp_path: Path, hub_api: str
) -> None:
    service = Service(tmp_path, hub_api)  # alice holds a 3g.40gb slice, bob a whole H100
    quarter = next(p for p in load_profiles(EXAMPLE_PROFILES) if p.slug == "l4-quarter")
    service.manager.request_lease("alice", [], "server", "alice2", quarter.slug, quarter.request())
    usage = service.parts.usage
    start = (time.time() // 60 + 1) * 60  # a minute boundary after every grant
    later = start + 7200  # the test's clock once the hour below has passed
    service.parts.clock = lambda: later
    for step in range(0, 3600 + 60, 10):  # an hour and a minute of samples: sixty closed minutes
        service.telemetry.record(service.telemetry.sampler.sample(start + step))
    expected = {("alice", "mig-3g"): 3 / 7, ("alice", "l4-quarter"): 0.25, ("bob", "h100"): 1.0}
    expected[("carol", "h100-x4")] = 4.0  # her first request was granted; she has no page of her own here

    with Client(service.app) as client:
        api = client.get(f"api/v1/usage?since=0&until={later}", "admin-token").json()
        pages = {user: client.get("", f"{user}-token").text for user in ("alice", "bob")}
    from_api = {(row["user"], row["profile"]): row["gpu_hours_held"] for row in api}
    from_pages = {
        (user, profile): float(held)
        for user, page in pages.items()
        for profile, held in re.findall(
            r"<tr><td>([\w-]+)</td><td>([\d.]+)</td>", page[page.index('id="usage"') :]
        )
    }
    exported = metrics(render_metrics(service.manager, service.telemetry, now=later, usage=usage).decode())
    from_metrics = {
        (labels["user"], labels["profile"]): value
        for labels, value in exported["gpupool_gpu_hours_held_total"]
    }
    assert set(from_api) == set(from_metrics) == set(expected)
    # the unknown hours too, so that a dashboard's idle share is the API's (a trial's Grafana counted them idle)
    unknown = {(row["user"], row["profile"]): row["gpu_hours_unknown"] for row in api}
    exported_unknown = {(x["user"], x["profile"]): v for x, v in exported["gpupool_gpu_hours_unknown_total"]}
    assert exported_unknown == pytest.approx(unknown, abs=1e-4)
    assert set(from_pages) == {key for key in expected if key[0] != "carol"}
    for key, hours in expected.items():
        assert from_api[key] == pytest.approx(hours, rel=0.01), key
        assert from_metrics[key] == pytest.approx(from_api[key], abs=1e-4), key
        if key in from_pages:
            assert from_pages[key] == round(from_api[key], 2), key
