"""The Kubernetes inventory and the service's wiring of it, against the stateful API server stand-in over real
HTTP with the real ``kubernetes_asyncio`` client: the initial pool, a node going NotReady and back, a dropped
watch resuming from its version, a 410 Gone relisting, and other workloads' pods taking capacity."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from fastapi import FastAPI
from kube_apiserver import KubeApiServer, kube_apiserver, write_kubeconfig

from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES, load_profiles
from gpupool.spawner.kube.inventory import KubeInventory, connect
from gpupool.spawner.pool.devices import Health
from gpupool.spawner.pool.requests import Request, WholeGpus
from gpupool.spawner.service.job_store import JobStore
from gpupool.spawner.service.jobs import JobManager
from gpupool.spawner.service.kube_pool import load_kube_pool
from gpupool.spawner.service.leases import LeaseManager
from gpupool.spawner.service.store import LeaseState, LeaseStore, sqlite_url

H100, A100 = "dgx-h100-01", "gpu-a100-01"
ONE_A100 = Request(1000, 1024, WholeGpus(1, frozenset({"A100-40GB"})))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[KubeApiServer, Path]]:
    with kube_apiserver("dgx-h100-mixed", "a100-40gb") as server:
        yield server, write_kubeconfig(tmp_path / "kubeconfig", server.url)


async def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def watching(kubeconfig: Path) -> AsyncIterator[KubeInventory]:
    api = await connect(str(kubeconfig))
    inventory = KubeInventory(api, retry_s=0.05)
    try:
        await inventory.start()
        yield inventory
    finally:
        await inventory.stop()
        await api.close()


class Service:
    """The service's pool as ``__main__`` wires it for ``GPUPOOL_BACKEND=kubernetes``, without the HTTP API."""

    def __init__(self, tmp: Path, kubeconfig: Path) -> None:
        self.backend = load_kube_pool({"KUBECONFIG": str(kubeconfig)})
        self.manager = LeaseManager(self.backend.nodes, LeaseStore(sqlite_url(str(tmp / "leases.sqlite"))))
        self.jobs = JobManager(
            self.manager, JobStore(self.manager.store.engine), load_profiles(EXAMPLE_PROFILES)
        )
        self.app = FastAPI()
        self.backend.attach(self.app, self.manager, self.jobs)

    def free_a100s(self) -> int:
        return self.manager.availability({"a100": ONE_A100})["a100"][0]


def test_the_initial_pool_has_both_nodes_with_whole_gpus_and_legal_mig_slices(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    service = Service(tmp_path, cluster[1])
    assert service.backend.source.startswith("Kubernetes API at http://127.0.0.1:")
    nodes = {ns.node.name: ns for ns in service.manager.pool.nodes}
    assert sorted(nodes) == [H100, A100]
    h100 = nodes[H100].node
    assert [g.mode.value for g in h100.gpus] == ["whole"] * 6 + ["mig"] * 2
    slices = sorted(m.profile for g in h100.gpus for m in g.mig_instances)
    assert slices == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb", "3g.40gb", "3g.40gb"]
    assert {g.product for g in nodes[A100].node.gpus} == {"A100-40GB"} and len(nodes[A100].node.gpus) == 4
    assert service.manager.pool.check_invariants() == []  # the MIG layouts are legal
    assert all(ns.healthy for ns in nodes.values())


def test_a_node_going_not_ready_takes_no_new_leases_until_it_is_ready_again(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    server, kubeconfig = cluster
    service = Service(tmp_path, kubeconfig)
    manager = service.manager

    async def scenario() -> None:
        async with service.app.router.lifespan_context(service.app):
            server.set_node_ready(A100, False)
            await eventually(lambda: manager.health_of(A100) is Health.UNHEALTHY, "A100 node unhealthy")
            reasons = manager.health_marks()[(A100, None)]
            assert "NotReady" in reasons[Health.UNHEALTHY]
            anywhere = manager.request_lease(
                "bob", [], "server", "b", "any", Request(1000, 1024, WholeGpus(1))
            )
            waiting = manager.request_lease("alice", [], "server", "a", "a100", ONE_A100)
            assert waiting.state is LeaseState.QUEUED
            assert anywhere.state is LeaseState.GRANTED and anywhere.node == H100
            server.set_node_ready(A100, True)
            await eventually(lambda: manager.health_of(A100) is Health.HEALTHY, "A100 node healthy again")
            granted = manager.get(waiting.id)
            assert granted.state is LeaseState.GRANTED and granted.node == A100

    asyncio.run(scenario())


def test_a_cordoned_node_is_unhealthy_and_says_why(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    server, kubeconfig = cluster
    node = server.get("nodes", H100)
    assert node is not None
    node["spec"]["unschedulable"] = True
    server.put("nodes", node)
    service = Service(tmp_path, kubeconfig)  # the start-up list already sees it
    assert service.manager.health_of(H100) is Health.UNHEALTHY
    assert "cordoned" in service.manager.health_marks()[(H100, None)][Health.UNHEALTHY]


def test_a_dropped_watch_resumes_from_its_last_version_without_listing_again(
    cluster: tuple[KubeApiServer, Path],
) -> None:
    server, kubeconfig = cluster

    async def scenario() -> None:
        async with watching(kubeconfig) as inventory:
            await eventually(lambda: len(server.watches_from("/api/v1/pods")) == 1, "the first pod watch")
            seen = server.watches_from("/api/v1/pods")[0]
            server.drop_watches(lambda s: s.add_pod("train-1", A100, {"nvidia.com/gpu": 1}))
            await eventually(
                lambda: inventory.usage.get(A100) == {"nvidia.com/gpu": 1}, "the pod added meanwhile"
            )
            assert server.watches_from("/api/v1/pods")[1] == seen  # resumed where it was, from the history
            assert server.lists_of("/api/v1/pods") == 1 and inventory.relists == 0
            assert inventory.resumes >= 1

    asyncio.run(scenario())


def test_a_watch_whose_version_is_gone_lists_afresh_and_misses_nothing(
    cluster: tuple[KubeApiServer, Path],
) -> None:
    server, kubeconfig = cluster

    async def scenario() -> None:
        async with watching(kubeconfig) as inventory:
            await eventually(lambda: len(server.watches_from("/api/v1/nodes")) == 1, "the first node watch")
            server.drop_watches(lambda s: s.set_node_ready(H100, False), compact=True)
            await eventually(
                lambda: inventory.problems.get(H100) is not None, "the NotReady seen by a relist"
            )
            assert inventory.relists >= 1 and server.lists_of("/api/v1/nodes") >= 2

    asyncio.run(scenario())


def test_an_outside_pod_using_two_a100s_lowers_free_capacity_until_it_ends(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    server, kubeconfig = cluster
    service = Service(tmp_path, kubeconfig)

    async def scenario() -> None:
        async with service.app.router.lifespan_context(service.app):
            assert service.free_a100s() == 4
            server.add_pod("ours", A100, {"nvidia.com/gpu": 1}, labels={"gpupool.io/lease": "abc"})
            pod = server.add_pod("their-training", A100, {"nvidia.com/gpu": 2}, namespace="research")
            await eventually(lambda: service.free_a100s() == 2, "two A100s held by the outside pod")
            holders = [o for o in service.manager.pool.allocations if o.startswith("outside:")]
            assert len(holders) == 2  # gpupool's own pod is its lease's, never counted twice
            pod["status"]["phase"] = "Succeeded"
            server.put("pods", pod)
            await eventually(lambda: service.free_a100s() == 4, "the A100s back once the pod ended")
            assert service.manager.pool.check_invariants() == []

    asyncio.run(scenario())
