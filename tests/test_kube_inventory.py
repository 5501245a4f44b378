"""The Kubernetes inventory and the service's wiring of it, against the real API server with real controllers
(``tests/kube_cluster.py``), through the real ``kubernetes_asyncio`` client: the initial pool from the nodes
our kubelet registered, a node whose kubelet falls silent going NotReady through the node-lifecycle
controller and back, a cordon, watches resuming after their server-side timeout, a restart of the API server
(its watch cache forgets the old versions: 410 Gone, a relist), and another workload's pod, bound by the real
scheduler, taking capacity until its command ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kube_cluster import (
    A100,
    H100,
    LocalKube,
    Relay,
    l4_node,
    load_fixture,
    own_node,
    wait_for_file,
    workload_pod,
)

from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES
from gpupool.spawner.kube.local.control_plane import write_kubeconfig
from gpupool.spawner.kube.node_watch import KubeInventory, connect
from gpupool.spawner.kube.resources import kube_grant
from gpupool.spawner.pool.devices import GpuMode, Health
from gpupool.spawner.pool.leases import LeaseState
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import Allocation, PoolState
from gpupool.spawner.service.assembly import assemble
from gpupool.spawner.service.settings import ServiceSettings
from gpupool.spawner.service.store.lease_store import sqlite_url

ONE_A100 = Request(1000, 1024, WholeGpus(1, frozenset({"A100-40GB"})))
ONE_L4 = Request(1000, 1024, WholeGpus(1, frozenset({"L4-24GB"})))


async def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 45.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


@asynccontextmanager
async def watching(kubeconfig: Path, watch_timeout_s: int = 300) -> AsyncIterator[KubeInventory]:
    api = await connect(str(kubeconfig))
    inventory = KubeInventory(api, retry_s=0.2, watch_timeout_s=watch_timeout_s)
    try:
        await inventory.start()
        yield inventory
    finally:
        await inventory.stop()
        await api.close()


class Service:
    """The service as its composition root builds it for ``GPUPOOL_BACKEND=kubernetes``; the tests read its
    managers and run its cluster watches, not its HTTP API."""

    def __init__(self, tmp: Path, kubeconfig: Path) -> None:
        self.service = assemble(
            ServiceSettings(
                backend="kubernetes",
                kubeconfig=str(kubeconfig),
                kube_job_image="gpupool-singleuser:test",
                profiles_file=str(EXAMPLE_PROFILES),
                db_url=sqlite_url(str(tmp / "leases.sqlite")),
                hub_api_url="http://127.0.0.1:9/hub/api",  # no hub: these tests read the managers directly
                reconcile_seconds=0,
                sample_seconds=0,
            )
        )
        self.manager, self.source = self.service.manager, self.service.parts.source
        assert self.service.cluster is not None
        self.cluster = self.service.cluster  # the start-up health, applied now

    def free_a100s(self) -> int:
        return self.manager.availability({"a100": ONE_A100})["a100"][0]


def test_the_initial_pool_has_both_nodes_with_whole_gpus_and_legal_mig_slices(
    kube: LocalKube, tmp_path: Path
) -> None:
    service = Service(tmp_path, kube.kubeconfig(tmp_path / "kubeconfig"))
    assert service.source == f"Kubernetes API at {kube.url}"
    nodes = {ns.node.name: ns for ns in service.manager.pool.nodes}
    assert {H100, A100} <= set(nodes)
    h100 = nodes[H100].node
    assert [g.mode.value for g in h100.gpus] == ["whole"] * 6 + ["mig"] * 2
    slices = sorted(m.profile for g in h100.gpus for m in g.mig_instances)
    assert slices == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb", "3g.40gb", "3g.40gb"]
    assert {g.product for g in nodes[A100].node.gpus} == {"A100-40GB"} and len(nodes[A100].node.gpus) == 4
    assert service.manager.pool.check_invariants() == []  # the MIG layouts are legal
    assert nodes[H100].healthy and nodes[A100].healthy
    assert nodes[H100].node.labels["gpupool.io/simulated"] == "true"  # our kubelet says what it is


def test_a_node_whose_kubelet_falls_silent_goes_not_ready_and_takes_no_new_leases_until_it_is_back(
    kube: LocalKube, tmp_path: Path
) -> None:
    with own_node(kube, l4_node("l4-flaky")) as agent:
        service = Service(tmp_path, kube.kubeconfig(tmp_path / "kubeconfig"))
        manager = service.manager

        async def scenario() -> None:
            async with service.cluster.watching():
                assert manager.health_of(agent.name) is Health.HEALTHY
                agent.go_silent()  # the node-lifecycle controller notices within its grace period
                await eventually(
                    lambda: manager.health_of(agent.name) is Health.UNHEALTHY, "L4 node unhealthy"
                )
                reasons = manager.health_marks()[(agent.name, None)][Health.UNHEALTHY]
                assert "unknown state" in reasons and "NodeStatusUnknown" in reasons, reasons
                waiting = manager.request_lease("alice", [], "server", "a", "l4", ONE_L4)
                assert waiting.state is LeaseState.QUEUED
                kube.run(agent.speak_again())
                await eventually(
                    lambda: manager.health_of(agent.name) is Health.HEALTHY, "L4 node healthy again"
                )
                await eventually(
                    lambda: manager.get(waiting.id).state is LeaseState.GRANTED, "the L4 lease granted"
                )
                assert manager.get(waiting.id).node == agent.name

        asyncio.run(scenario())


def test_a_cordoned_node_is_unhealthy_and_says_why(kube: LocalKube, tmp_path: Path) -> None:
    with own_node(kube, l4_node("l4-cordoned")) as agent:
        kube.patch(f"/api/v1/nodes/{agent.name}", {"spec": {"unschedulable": True}})
        service = Service(tmp_path, kube.kubeconfig(tmp_path / "kubeconfig"))  # the start-up list sees it
        assert service.manager.health_of(agent.name) is Health.UNHEALTHY
        assert "cordoned" in service.manager.health_marks()[(agent.name, None)][Health.UNHEALTHY]


def test_a_watch_the_server_ends_resumes_from_its_last_version_without_listing_again(
    kube: LocalKube, tmp_path: Path
) -> None:
    namespace = kube.namespace("resume")
    done = tmp_path / "done"

    async def scenario() -> None:
        async with watching(kube.kubeconfig(tmp_path / "kubeconfig"), watch_timeout_s=1) as inventory:
            await eventually(lambda: inventory.resumes >= 2, "watches ended by the server and resumed")
            workload_pod(kube, namespace, "train-1", A100, {"nvidia.com/gpu": 1}, wait_for_file(done))
            await eventually(lambda: inventory.usage.get(A100) == {"nvidia.com/gpu": 1}, "the pod once bound")
            assert inventory.relists == 0
            done.touch()
            await eventually(
                lambda: not inventory.usage.get(A100), "the GPU back once the pod's command ended"
            )

    asyncio.run(scenario())


def test_after_an_api_server_restart_a_watch_whose_version_is_gone_lists_afresh_and_misses_nothing(
    kube: LocalKube, tmp_path: Path
) -> None:
    with own_node(kube, l4_node("l4-restart")) as agent:

        async def scenario() -> None:
            async with watching(kube.kubeconfig(tmp_path / "kubeconfig")) as inventory:
                await eventually(lambda: agent.name in inventory.nodes, "the node listed")
                await asyncio.to_thread(kube.plane.restart_apiserver)
                kube.patch(f"/api/v1/nodes/{agent.name}", {"spec": {"unschedulable": True}})
                await eventually(
                    lambda: "cordoned" in (inventory.problems.get(agent.name) or ""),
                    "the cordon seen after the restart",
                )
                assert inventory.relists >= 1  # after the outage, or as its watch cache lost our versions

        asyncio.run(scenario())


def test_an_outside_pod_using_two_a100s_lowers_free_capacity_until_it_ends(
    kube: LocalKube, tmp_path: Path
) -> None:
    service = Service(tmp_path, kube.kubeconfig(tmp_path / "kubeconfig"))
    namespace = kube.namespace("outside")
    done = tmp_path / "done"

    async def scenario() -> None:
        async with service.cluster.watching():
            assert service.free_a100s() == 4
            workload_pod(kube, namespace, "their-training", A100, {"nvidia.com/gpu": 2}, wait_for_file(done))
            await eventually(lambda: service.free_a100s() == 2, "two A100s held by the outside pod")
            holders = [o for o in service.manager.pool.allocations if o.startswith("outside:")]
            assert len(holders) == 2
            done.touch()  # its command ends: the pod Succeeded, as its kubelet reports
            await eventually(lambda: service.free_a100s() == 4, "the A100s back once the pod ended")
            assert service.manager.pool.check_invariants() == []

    asyncio.run(scenario())


def _variant(
    fixture: str, name: str, labels: dict[str, str], gpus: dict[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """A Node of ``fixture``'s kind named ``name``, with ``labels`` added and ``gpus`` as its GPU resources."""
    node = load_fixture(fixture)
    metadata = {
        "name": name,
        "labels": node["metadata"]["labels"] | labels | {"kubernetes.io/hostname": name},
    }
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"} | gpus
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": node.get("spec", {})}, resources


def test_device_plugin_variants_registered_by_a_kubelet_are_read_as_the_plugin_means_them(
    kube: LocalKube, tmp_path: Path
) -> None:
    """Through the real API server: a ``+me`` slice served as ``nvidia.com/mig-1g.10gb.me``; GPUs shared with
    the device plugin's default ``renameByDefault: false`` (16 ``nvidia.com/gpu`` on 4 GPUs × 4 replicas), which
    an outside pod's ``nvidia.com/gpu: 1`` takes one share of; and a node with a profile its GPU lacks, left out
    while the rest of the pool is read."""
    me = _variant(
        "dgx-h100-mixed",
        "h100-me",
        {"nvidia.com/mig.config": "custom"},
        {"nvidia.com/gpu": "7", "nvidia.com/mig-1g.10gb.me": "1", "nvidia.com/mig-3g.40gb": "1"},
    )
    shared = _variant(
        "a100-40gb",
        "a100-shared",
        {
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED",
        },
        {"nvidia.com/gpu": "16"},
    )
    mps = _variant(  # MPS, with renameByDefault: true (the shares' own resource name)
        "a100-40gb",
        "a100-mps",
        {"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"},
        {"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "16"},
    )
    odd = _variant(
        "dgx-h100-mixed",
        "h100-odd",
        {"nvidia.com/mig.config": "custom"},
        {"nvidia.com/gpu": "7", "nvidia.com/mig-5g.60gb": "1"},
    )
    agents = [kube.add_node(obj, resources) for obj, resources in (me, shared, mps, odd)]
    namespace = kube.namespace("variants")
    done = tmp_path / "done"
    try:
        service = Service(tmp_path, kube.kubeconfig(tmp_path / "kubeconfig"))
        nodes = {ns.node.name: ns.node for ns in service.manager.pool.nodes}
        assert "h100-odd" not in nodes and {H100, A100, "h100-me", "a100-shared", "a100-mps"} <= set(nodes)
        slices = sorted(m.profile for g in nodes["h100-me"].gpus for m in g.mig_instances)
        assert slices == ["1g.10gb+me", "3g.40gb"]
        me_slice = PoolState([nodes["h100-me"]]).place(Request(0, 0, MigSlice(profile="1g.10gb+me")), "me")
        assert isinstance(me_slice, Allocation)
        assert kube_grant(nodes["h100-me"], me_slice.grants).limits == {"nvidia.com/mig-1g.10gb.me": 1}
        a100s = nodes["a100-shared"].gpus
        assert [(g.product, g.mode, g.max_shares) for g in a100s] == [("A100-40GB", GpuMode.SHARED, 4)] * 4
        a_share = PoolState([nodes["a100-shared"]]).place(Request(0, 0, GpuShare(250)), "share")
        assert isinstance(a_share, Allocation)
        assert kube_grant(nodes["a100-shared"], a_share.grants).limits == {"nvidia.com/gpu": 1}
        capped = Request(0, 0, GpuShare(250, memory_mib=6144))
        time_sliced = PoolState([nodes["a100-shared"]]).place(capped, "capped")
        assert isinstance(time_sliced, Allocation)  # time-slicing cannot cap memory: the grant says so
        assert "not enforced" in kube_grant(nodes["a100-shared"], time_sliced.grants).note
        under_mps = PoolState([nodes["a100-mps"]]).place(capped, "capped")
        assert isinstance(under_mps, Allocation)
        grant = kube_grant(nodes["a100-mps"], under_mps.grants)
        assert (dict(grant.limits), dict(grant.environment)) == (
            {"nvidia.com/gpu.shared": 1},
            {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6144M"},
        )

        def shares_held() -> int:
            return sum(1 for o in service.manager.pool.allocations if o.startswith("outside:a100-shared"))

        async def scenario() -> None:
            async with service.cluster.watching():
                workload_pod(
                    kube, namespace, "sliced", "a100-shared", {"nvidia.com/gpu": 1}, wait_for_file(done)
                )
                await eventually(lambda: shares_held() == 1, "the outside pod's replica held as one share")
                held = [
                    g
                    for o, a in service.manager.pool.allocations.items()
                    if o.startswith("outside:")
                    for g in a.grants
                ]
                assert {g.kind for g in held if g.gpu_uuid.startswith("k8s-a100-shared")} == {"share"}
                done.touch()

        asyncio.run(scenario())
    finally:
        done.touch()
        for agent in agents:
            kube.remove_node(agent)


def test_while_the_api_server_is_silent_nothing_is_placed_and_the_queue_says_why(
    kube: LocalKube, tmp_path: Path
) -> None:
    """A Kubernetes trial stopped the cluster under a running service: spawns were still granted leases and
    then failed with the raw "Cannot connect to host". Now they wait, saying why, and start once the API
    server answers. (The service's watches go through a relay this test cuts; the cluster keeps running.)"""
    service = Service(tmp_path, kube.kubeconfig(tmp_path / "kubeconfig"))
    manager, cluster = service.manager, service.cluster
    target = urlsplit(kube.url)

    async def scenario() -> None:
        relay = Relay(target.hostname or "127.0.0.1", target.port or 443)
        port = await relay.open(0)
        cluster.backend.kubeconfig = str(
            write_kubeconfig(
                tmp_path / "relayed", f"https://127.0.0.1:{port}", kube.plane.pki.ca.cert, kube.plane.admin
            )
        )
        async with cluster.watching():
            try:
                assert (
                    manager.request_lease("ann", [], "server", "a", "a100", ONE_A100).state
                    is LeaseState.GRANTED
                )
                await relay.close()
                await eventually(lambda: cluster.unreachable_since() is not None, "the watches lost")
                waiting = manager.request_lease("bo", [], "server", "b", "a100", ONE_A100)
                assert waiting.state is LeaseState.QUEUED
                message = manager.waiting_message(waiting.id) or ""
                assert "gpupool has lost its watch of the cluster since" in message, message
                assert "nothing starts until it is back" in message
                await relay.open(port)
                await eventually(
                    lambda: manager.get(waiting.id).state is LeaseState.GRANTED, "granted once it answers", 60
                )
            finally:
                await relay.close()

    asyncio.run(scenario())
