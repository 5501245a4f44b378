"""Telemetry over HTTP: Prometheus metrics that match the pool, and recent samples that only the right callers
see. The service as its composition root builds it (a real FastAPI app and LeaseManager on the demo pool in
SQLite, JupyterHub's HubAuth asking a stand-in hub over HTTP), and the real sampler loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_pynvml import a100_80gb, fake_pynvml, h100_80gb
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from token_hub import token_hub

from gpupool.spawner.backends.nvml import discover_node
from gpupool.spawner.backends.nvml_telemetry import NvmlSampler
from gpupool.spawner.backends.simulated import DEMO_POOL, load_pool_file
from gpupool.spawner.backends.simulated_telemetry import SimulatedSampler
from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES
from gpupool.spawner.pool.devices import GpuMode
from gpupool.spawner.pool.leases import Lease, LeaseState
from gpupool.spawner.service.api.auth import ADMIN_SCOPE, LEASES_SCOPE
from gpupool.spawner.service.api.telemetry_routes import render_metrics
from gpupool.spawner.service.assembly import assemble
from gpupool.spawner.service.leasing.lease_manager import LeaseManager
from gpupool.spawner.service.settings import ServiceSettings
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url
from gpupool.spawner.service.telemetry.telemetry_loop import Telemetry, make_sampler

PREFIX = "/services/gpupool/"
ACCESS = "access:services!service=gpupool"
USERS = {
    "admin-token": {"name": "root", "kind": "user", "scopes": [ACCESS, ADMIN_SCOPE]},
    "hub-token": {"name": "hub", "kind": "service", "scopes": [LEASES_SCOPE]},
    "alice-token": {"name": "alice", "kind": "user", "scopes": [ACCESS]},
    "bob-token": {"name": "bob", "kind": "user", "scopes": [ACCESS]},
    "bare-service-token": {"name": "reporter", "kind": "service", "scopes": [ACCESS]},
}
MIB = 2**20
BUSY = "while True: pass"
IDLE = "import time; time.sleep(600)"


@pytest.fixture(scope="module")
def hub_api() -> Iterator[str]:
    with token_hub(USERS) as url:
        yield url


class Service:
    """The service as :func:`assemble` builds it on the demo pool, with leases for alice, bob and carol and a
    simulated sampler that reads the processes ``pids`` names for each device."""

    def __init__(self, tmp: Path, hub_api: str, pids: Mapping[str, set[int]] | None = None, **settings: Any):
        settings.setdefault("sample_seconds", 0)  # most tests feed samples themselves, at times they choose
        if "quotas_file" not in settings:  # carol holds 8 of the pool's 14 whole GPUs, past the default quota
            (tmp / "no-limits.yaml").write_text("# no limits: an admin's empty quotas file\n")
            settings["quotas_file"] = str(tmp / "no-limits.yaml")
        self.service = assemble(
            ServiceSettings(
                pool_file=str(DEMO_POOL),
                profiles_file=str(EXAMPLE_PROFILES),
                db_url=sqlite_url(str(tmp / "leases.sqlite")),
                hub_api_url=hub_api,
                reconcile_seconds=0,
                **settings,
            )
        )
        self.app, self.parts = self.service.app, self.service.parts
        self.manager, self.telemetry, self.auth = self.parts.manager, self.parts.telemetry, self.parts.auth
        self.nodes = tuple(ns.node for ns in self.manager.pool.nodes)
        self.pids: dict[str, set[int]] = dict(pids or {})
        self.telemetry.sampler = SimulatedSampler(self.nodes, lambda: self.pids)
        profiles = {p.slug: p for p in self.parts.profiles}

        def ask(user: str, slug: str) -> Lease:
            return self.manager.request_lease(user, [], "server", user, slug, profiles[slug].request())

        self.alice, self.bob = ask("alice", "mig-3g"), ask("bob", "h100")
        self.carol = [ask("carol", "h100-x4"), ask("carol", "h100-x4")]

    def sample_twice(self) -> None:
        sampler = self.telemetry.sampler
        self.telemetry.record(sampler.sample(1000.0))
        self.telemetry.record(sampler.sample(1002.0))


def metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Metric name -> (labels, value) of every sample, as Prometheus' own parser reads the text."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


class Client:
    """The app over ASGI, its lifespan (and so the sampler loop) running, on one event loop kept between
    calls; background tasks run only while a call is in progress, so waiting is :meth:`wait_for`."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.runner = asyncio.Runner()
        self.lifespan = app.router.lifespan_context(app)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://service")

    def __enter__(self) -> Client:
        self.runner.run(self.lifespan.__aenter__())
        return self

    def __exit__(self, *_exc: object) -> None:
        try:
            self.runner.run(self.http.aclose())
            self.runner.run(self.lifespan.__aexit__(None, None, None))
        finally:
            self.runner.close()

    def get(self, path: str, token: str | None) -> httpx.Response:
        headers = {"Authorization": f"token {token}"} if token else {}
        return self.runner.run(self.http.get(f"{PREFIX}{path}", headers=headers))

    def post(self, path: str, token: str | None, body: str) -> httpx.Response:
        """``body`` as sent, not re-encoded: a test may send what Python's JSON would refuse to write."""
        headers = {"Content-Type": "application/json"} | (
            {"Authorization": f"token {token}"} if token else {}
        )
        return self.runner.run(self.http.post(f"{PREFIX}{path}", headers=headers, content=body))

    def wait_for(self, condition: Callable[[], bool], deadline_s: float = 30) -> None:
        async def poll() -> None:
            deadline = time.monotonic() + deadline_s
            while not condition() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

        self.runner.run(poll())


def get(client: Client, path: str, token: str | None) -> httpx.Response:
    return client.get(path, token)


def test_metrics_parse_and_match_the_pool_its_leases_and_its_queue(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    assert [lease.state for lease in service.carol] == [LeaseState.GRANTED, LeaseState.QUEUED]
    service.sample_twice()
    with Client(service.app) as client:
        response = get(client, "metrics", "admin-token")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    found = metrics(response.text)
    assert {tuple(labels.items()): v for labels, v in found["gpupool_leases"]} == {
        (("state", "granted"),): 3.0,
        (("state", "queued"),): 1.0,
    }
    assert found["gpupool_queue_length"] == [({}, 1.0)]
    assert found["gpupool_telemetry_simulated"] == [({}, 1.0)]
    totals = {labels["device"]: value for labels, value in found["gpupool_gpu_memory_total_bytes"]}
    pool = {g.uuid: g.memory_mib for n in service.nodes for g in n.gpus}
    pool |= {i.uuid: i.memory_mib for n in service.nodes for g in n.gpus for i in g.mig_instances}
    assert totals == {uuid: mib * MIB for uuid, mib in pool.items()}
    (slice_,) = service.alice.devices
    # dcgm-exporter's labels: a slice names its parent GPU's UUID, its profile; who holds it is lease info's
    used = {labels["device"]: labels for labels, _ in found["gpupool_gpu_memory_used_bytes"]}
    parent = next(g for n in service.nodes for g in n.gpus for i in g.mig_instances if i.uuid == slice_.uuid)
    assert (used[slice_.uuid]["UUID"], used[slice_.uuid]["GPU_I_PROFILE"]) == (parent.uuid, "3g.40gb")
    assert (
        used[slice_.uuid]["Hostname"] == parent_node(service, parent.uuid) and "user" not in used[slice_.uuid]
    )
    info = {labels["device"]: labels for labels, _ in found["gpupool_lease_info"]}
    assert (info[slice_.uuid]["user"], info[slice_.uuid]["profile"]) == ("alice", service.alice.profile)
    assert info[service.bob.devices[0].uuid]["user"] == "bob"
    assert info[slice_.uuid]["lease"] == service.alice.id
    mig_parents = {g.uuid for n in service.nodes for g in n.gpus if g.mode is GpuMode.MIG}
    utilization = {labels["device"] for labels, _ in found["gpupool_gpu_utilization_ratio"]}
    assert mig_parents and not mig_parents & utilization  # "not available": no series, not a 0
    assert slice_.uuid in utilization
    assert all(0 <= value <= 1 for _, value in found["gpupool_gpu_utilization_ratio"])
    held = {(labels["kind"], labels["held"], labels["health"]): v for labels, v in found["gpupool_devices"]}
    assert held[("mig", "true", "healthy")] == 1 and held[("gpu", "true", "healthy")] == 5


def test_a_failed_or_drained_device_is_not_counted_free(tmp_path: Path, hub_api: str) -> None:
    """An admin's trial: Prometheus and Grafana's "Free devices" counted a GPU marked failed and two drained
    ones as free, beside a dashboard that left them out."""
    service = Service(tmp_path, hub_api)

    def free_gpus() -> dict[str, float]:
        with Client(service.app) as client:
            found = metrics(get(client, "metrics", "admin-token").text)
        rows = [(labels, value) for labels, value in found["gpupool_devices"] if labels["kind"] == "gpu"]
        return {labels["health"]: value for labels, value in rows if labels["held"] == "false"}

    before = free_gpus()
    held = {d.uuid for lease in (service.bob, *service.carol) for d in lease.devices}
    idle = [(n.name, g.index) for n in service.nodes for g in n.gpus if g.mode is not GpuMode.MIG]
    idle = [(node, index) for node, index in idle if not held & _gpu_uuids(service, node, index)]
    service.parts.jobs.fault(*idle[0])
    service.parts.jobs.drain(*idle[1])
    assert free_gpus() == {"healthy": before["healthy"] - 2, "unhealthy": 1, "drained": 1}


def test_metrics_need_an_administrator_unless_made_public(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    with Client(service.app) as client:
        assert get(client, "metrics", None).status_code == 401
        refused = get(client, "metrics", "alice-token")
        assert refused.status_code == 403 and "custom:gpupool:admin" in refused.json()["detail"]
    (tmp_path / "public").mkdir()
    public = Service(tmp_path / "public", hub_api, metrics_public=True)
    with Client(public.app) as client:
        assert get(client, "metrics", None).status_code == 200


def test_users_see_samples_of_their_own_devices_and_admins_of_all(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    service.sample_twice()
    with Client(service.app) as client:
        mine = get(client, "api/v1/telemetry", "alice-token").json()
        everything = get(client, "api/v1/telemetry", "admin-token").json()
        hub = get(client, "api/v1/telemetry", "hub-token").json()
        later = get(client, "api/v1/telemetry?since=1001", "alice-token").json()
        assert get(client, "api/v1/telemetry", "nobody").status_code == 403
    (device,) = mine["devices"]
    assert device["uuid"] == service.alice.devices[0].uuid and device["mig_profile"] == "3g.40gb"
    assert [s["time"] for s in device["samples"]] == [1000.0, 1002.0] and mine["simulated"] is True
    assert device["users"] == ["alice"] and device["samples"][0]["power_w"] is None
    assert [s["time"] for s in later["devices"][0]["samples"]] == [1002.0]
    every_uuid = {d["uuid"] for d in everything["devices"]}
    assert len(every_uuid) == sum(1 + len(g.mig_instances) for n in service.nodes for g in n.gpus)
    assert every_uuid == {d["uuid"] for d in hub["devices"]}


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_the_sampler_loop_shows_a_busy_lease_busy_and_an_idle_one_idle(
    tmp_path: Path, hub_api: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    for code in (BUSY, IDLE):
        processes.append(subprocess.Popen([sys.executable, "-c", code], start_new_session=True))
    service = Service(tmp_path, hub_api, sample_seconds=0.2)  # the test runs the sampler loop itself
    alice_slice, bob_gpu = service.alice.devices[0].uuid, service.bob.devices[0].uuid
    service.pids.update({alice_slice: {processes[0].pid}, bob_gpu: {processes[1].pid}})

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], str]:
        loop = asyncio.create_task(service.telemetry.run())
        transport = httpx.ASGITransport(app=service.app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
                deadline = time.monotonic() + 30
                while True:
                    await asyncio.sleep(0.2)
                    alice = await client.get(
                        f"{PREFIX}api/v1/telemetry", headers={"Authorization": "token alice-token"}
                    )
                    bob = await client.get(
                        f"{PREFIX}api/v1/telemetry", headers={"Authorization": "token bob-token"}
                    )
                    a, b = alice.json()["devices"][0]["samples"], bob.json()["devices"][0]["samples"]
                    ready = (
                        a
                        and b
                        and (a[-1]["gpu_utilization"] or 0) >= 50
                        and b[-1]["gpu_utilization"] is not None
                    )
                    if ready or time.monotonic() > deadline:
                        break
                text = (
                    await client.get(f"{PREFIX}metrics", headers={"Authorization": "token admin-token"})
                ).text
                return a[-1], b[-1], text
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop

    alice, bob, text = asyncio.run(scenario())
    assert alice["gpu_utilization"] >= 50, alice
    assert bob["gpu_utilization"] is not None and bob["gpu_utilization"] <= 10, bob
    ratios = {labels["device"]: v for labels, v in metrics(text)["gpupool_gpu_utilization_ratio"]}
    assert ratios[alice_slice] >= 0.5 and ratios[bob_gpu] <= 0.1
    assert service.telemetry.passes >= 2 and service.telemetry.failures == 0


def test_the_app_samples_while_it_serves_and_stops_sampling_when_it_stops(
    tmp_path: Path, hub_api: str
) -> None:
    service = Service(tmp_path, hub_api, sample_seconds=0.2)
    with Client(service.app) as client:
        client.wait_for(lambda: service.telemetry.passes >= 2)
        (device,) = get(client, "api/v1/telemetry", "alice-token").json()["devices"]
        assert len(device["samples"]) >= 2 and service.telemetry.running
    assert not service.telemetry.running


def test_the_render_function_works_without_http(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    text = render_metrics(service.manager, service.telemetry, now=service.carol[1].created_at + 30).decode()
    found = metrics(text)
    assert found["gpupool_queue_wait_seconds_max"] == [({}, 30.0)]
    assert "gpupool_gpu_utilization_ratio" not in found  # nothing sampled yet: no readings, not zeros
    assert "gpupool_telemetry_last_sample_timestamp_seconds" not in found


def test_the_backend_picks_its_sampler() -> None:
    nodes = load_pool_file(DEMO_POOL)
    assert make_sampler("simulated", nodes).simulated
    assert not make_sampler("nvml", nodes).simulated


def test_nvml_mig_slices_without_gpm_have_memory_series_but_no_utilisation_series(tmp_path: Path) -> None:
    ampere = a100_80gb(["3g.40gb@0", "3g.40gb@4"], utilization=0)  # no GPM on Ampere
    hopper = h100_80gb(["7g.80gb@0"])
    hopper.mig_utilization[0] = 64.0
    module = fake_pynvml([ampere, hopper, h100_80gb(utilization=30)])
    nodes = (discover_node("gpu-host", nvml=module, cpu_milli=64_000, memory_mib=512 * 1024),)
    manager = LeaseManager(nodes, LeaseStore(sqlite_url(str(tmp_path / "leases.sqlite"))))
    with NvmlSampler("gpu-host", nvml=module) as sampler:
        telemetry = Telemetry(manager, sampler)
        for at in (10.0, 12.0):
            telemetry.record(sampler.sample(at))
        found = metrics(render_metrics(manager, telemetry).decode())
    ratio = {labels["device"]: value for labels, value in found["gpupool_gpu_utilization_ratio"]}
    used = {labels["device"] for labels, _ in found["gpupool_gpu_memory_used_bytes"]}
    ampere_slices = {i.uuid for i in nodes[0].gpus[0].mig_instances}
    (hopper_slice,) = nodes[0].gpus[1].mig_instances
    assert ampere_slices <= used and not ampere_slices & set(ratio)  # "not available", never 0
    assert ratio[hopper_slice.uuid] == 0.64 and ratio[nodes[0].gpus[2].uuid] == 0.3
    assert found["gpupool_telemetry_simulated"] == [({}, 0.0)]


class _Flaky:
    """A sampler whose second pass fails, as when a GPU falls off the bus mid-read."""

    simulated, backend = True, "simulated"

    def __init__(self, nodes: Any) -> None:
        self.inner, self.calls = SimulatedSampler(nodes, dict), 0

    def open(self) -> None: ...

    def close(self) -> None: ...

    def sample(self, at: float) -> Any:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("GPU is lost")
        return self.inner.sample(at)


def test_a_failing_pass_is_counted_and_sampling_goes_on(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    telemetry = Telemetry(service.manager, _Flaky(service.nodes), interval=0.1)

    async def scenario() -> None:
        task = asyncio.create_task(telemetry.run())
        deadline = time.monotonic() + 20
        while telemetry.passes < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert telemetry.failures == 1 and telemetry.passes >= 3 and not telemetry.running


def parent_node(service: Any, gpu_uuid: str) -> str:
    return next(n.name for n in service.nodes for g in n.gpus if g.uuid == gpu_uuid)


def _gpu_uuids(service: Any, node: str, index: int) -> set[str]:
    """The GPU's UUID and its MIG instances'."""
    (gpu,) = [g for n in service.nodes if n.name == node for g in n.gpus if g.index == index]
    return {gpu.uuid, *(i.uuid for i in gpu.mig_instances)}
