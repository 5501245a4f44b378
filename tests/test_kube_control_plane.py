"""The local control plane (``gpupool kube up``, and the tests' own) keeps its store to itself: a hostile-user
trial read every key of another session's cluster (``/registry/…``, 272 of them, Secrets among them) from a
job, over etcd's plain HTTP on loopback, which made any account on the host the cluster's admin."""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from kube_cluster import H100, LocalKube, Relay, eventually, home_claim

from gpupool.spawner.kube.local.container_env import MissingReference, container_environment
from gpupool.spawner.kube.local.control_plane import write_kubeconfig
from gpupool.spawner.kube.local.mounts import VolumeNotReady, volume_folders
from gpupool.spawner.kube.local.pki import client_tls
from gpupool.spawner.kube.local.pod_processes import RunningPod
from gpupool.spawner.kube.node_watch import KubeInventory, connect
from gpupool.spawner.service.kube_pool import load_kube_pool

REGISTRY = {
    "key": base64.b64encode(b"/registry/").decode(),
    "range_end": base64.b64encode(b"/registry0").decode(),
}


def test_etcd_answers_only_a_client_with_a_certificate_of_the_clusters_ca(kube: LocalKube) -> None:
    url = kube.plane.etcd_url
    assert url.startswith("https://127.0.0.1:")
    ranged = {**REGISTRY, "count_only": True}
    with pytest.raises(httpx.TransportError):  # plain HTTP: etcd closes the connection unanswered
        httpx.post(url.replace("https://", "http://") + "/v3/kv/range", json=ranged, timeout=5)
    with pytest.raises(httpx.TransportError):  # TLS without a client certificate: refused in the handshake
        httpx.post(
            f"{url}/v3/kv/range",
            json=ranged,
            verify=ssl.create_default_context(cafile=str(kube.plane.pki.ca.cert)),
            timeout=5,
        )
    # its peer port too: a second trial forged raft messages to it over plain HTTP and wrote keys
    peer = kube.plane.etcd_peer_url
    assert peer.startswith("https://127.0.0.1:")
    with pytest.raises(httpx.TransportError):
        httpx.get(peer.replace("https://", "http://") + "/members", timeout=5)
    with pytest.raises(httpx.TransportError):
        httpx.get(
            f"{peer}/members",
            verify=ssl.create_default_context(cafile=str(kube.plane.pki.ca.cert)),
            timeout=5,
        )
    # the API server's own certificate still reads it (what the cluster itself runs on)
    tls = client_tls(kube.plane.pki.ca.cert, kube.plane.etcd_client)
    answer = httpx.post(f"{url}/v3/kv/range", json=ranged, verify=tls, timeout=5)
    assert answer.status_code == 200 and int(answer.json()["count"]) > 0


def test_a_kubeconfig_without_rights_stops_the_service_naming_who_may_not_list_what(
    kube: LocalKube, tmp_path: Path
) -> None:
    """A Kubernetes trial's kubeconfig for a user without rights stopped the service with "cannot read the
    cluster's nodes (KeyError: 'resourceVersion')", and said the same of nodes when only pods were refused."""
    nobody = kube.plane.kubeconfig_for(f"nobody-{tmp_path.name}", "nobody")
    with pytest.raises(SystemExit) as stopped:
        load_kube_pool(str(nobody))
    message = str(stopped.value)
    assert "403" in message and 'User "nobody" cannot list resource' in message, message
    assert "KeyError" not in message


def test_a_namespace_the_cluster_lacks_stops_the_service_at_start(kube: LocalKube, tmp_path: Path) -> None:
    """A Kubernetes trial's ``no-such-ns`` started the hub; each spawn then failed with a client's raw 404 dump."""
    with pytest.raises(
        SystemExit, match="the cluster has no namespace no-such-ns for servers and jobs: create it"
    ):
        load_kube_pool(str(kube.kubeconfig(tmp_path / "kubeconfig")), "no-such-ns")
    assert load_kube_pool(str(kube.kubeconfig(tmp_path / "kubeconfig")), "default").nodes  # one that exists


def test_a_silent_api_server_is_said_once_and_known_until_it_answers_again(
    kube: LocalKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Kubernetes trial stopped the cluster under a running service: ~200 "watch of pods lost" warnings in
    85 s, and `gpupool pool` still said "Live" with every node healthy. The service now knows since when. (The
    service reaches the API server through a relay this test cuts, so the cluster itself keeps running.)"""
    caplog.set_level(logging.DEBUG, logger="gpupool.spawner.kube.mirror")

    async def scenario() -> None:
        async with relayed_inventory(kube, tmp_path) as (relay, inventory):
            assert inventory.unreachable_since is None
            cutting = time.time()
            await relay.close()
            await _until(lambda: inventory.unreachable_since is not None, 10)
            assert cutting <= (inventory.unreachable_since or 0) <= time.time()
            await asyncio.sleep(3)  # at 0.2 s a try, 15 warnings before
            warned = [r for r in caplog.records if r.levelno >= logging.WARNING and "lost" in r.message]
            assert len(warned) <= 2, [r.message for r in warned]  # once per watch (nodes, pods)
            await relay.open(relay.port_open)
            await _until(lambda: inventory.unreachable_since is None, 60)
            assert any("is back after" in r.message for r in caplog.records)

    asyncio.run(scenario())


@asynccontextmanager
async def relayed_inventory(
    kube: LocalKube, tmp_path: Path, **options: float
) -> AsyncIterator[tuple[Relay, KubeInventory]]:
    """The inventory, watching the real API server through a relay the test can cut or freeze."""
    target = urlsplit(kube.url)
    relay = Relay(target.hostname or "127.0.0.1", target.port or 443)
    port = await relay.open(0)
    config = write_kubeconfig(
        tmp_path / "kubeconfig", f"https://127.0.0.1:{port}", kube.plane.pki.ca.cert, kube.plane.admin
    )
    api = await connect(str(config))
    inventory = KubeInventory(api, retry_s=0.2, **options)
    await inventory.start()
    try:
        yield relay, inventory
    finally:
        relay.flowing.set()
        await inventory.stop()
        await api.close()
        await relay.close()


async def _until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        await asyncio.sleep(0.1)


def test_an_api_server_that_hangs_is_found_silent_and_answering_again(
    kube: LocalKube, tmp_path: Path
) -> None:
    """A Kubernetes trial stopped the API server (SIGSTOP): for 5 min gpupool said "Live" and placed a job
    whose Job then could not be created. Its watches, open but silent, said nothing; a probe does."""

    async def scenario() -> None:
        async with relayed_inventory(kube, tmp_path, probe_s=0.3, probe_timeout_s=1.0) as (relay, inventory):
            await asyncio.sleep(1)
            assert inventory.unreachable_since is None
            relay.flowing.clear()  # connections stay open; nothing comes back
            await _until(lambda: inventory.unreachable_since is not None, 10)
            relay.flowing.set()
            await _until(lambda: inventory.unreachable_since is None, 30)

    asyncio.run(scenario())


def test_a_pod_whose_secret_is_missing_waits_for_it_and_then_runs(kube: LocalKube, tmp_path: Path) -> None:
    """A Kubernetes trial applied the service's manifests before their Secrets: each pod Failed with a
    StartError and its ReplicaSet made 68 more in 7 s. A kubelet keeps such a container waiting instead."""
    namespace = kube.namespace("secret")
    done = tmp_path / "ran"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reads-a-secret", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            # a node of the session's pool: another test's own node may go silent or be removed under it
            "nodeSelector": {"kubernetes.io/hostname": H100},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "example.org/app:1",
                    "command": ["sh", "-c", f'echo "$DB" > {done}'],
                    "env": [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}}],
                }
            ],
        },
    }
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    path = f"/api/v1/namespaces/{namespace}/pods/reads-a-secret"

    def waiting() -> dict[str, Any] | None:
        """The pod's status once its container waits for the missing Secret. Before that it may wait with
        the Node authorizer's 403: under load its graph learns of a new pod after the kubelet asks (CI's
        run failed the container on it)."""
        status = (kube.get(path) or {}).get("status", {})
        states = [c["state"] for c in status.get("containerStatuses", [])]
        said = states[0].get("waiting", {}).get("message") if states else None
        return status if said == 'secret "db" not found' else None

    status = eventually(waiting, "the container waiting for its Secret")
    assert status["phase"] == "Pending"
    assert status["containerStatuses"][0]["state"]["waiting"] == {
        "reason": "CreateContainerConfigError",
        "message": 'secret "db" not found',
    }
    time.sleep(3)  # longer than the kubelet's retry: still waiting, not failed
    assert (kube.get(path) or {})["status"]["phase"] == "Pending"
    secret = {"metadata": {"name": "db"}, "data": {"url": base64.b64encode(b"postgres://db").decode()}}
    kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
    eventually(lambda: (kube.get(path) or {}).get("status", {}).get("phase") == "Succeeded", "the pod to run")
    assert done.read_text().strip() == "postgres://db"


def test_what_the_node_authorizer_does_not_yet_show_a_node_is_waited_for_not_failed(
    kube: LocalKube, tmp_path: Path
) -> None:
    """CI's run of the Secret test: the kubelet read the Secret of a pod the API server's Node authorizer had not
    yet linked to its node, got 403, and failed the container. A pod bound to no node stands in for that
    moment here: the real authorizer refuses its Secret and its claim to the node that asks."""
    namespace = kube.namespace("authz")
    secret = {"metadata": {"name": "db"}, "data": {"url": base64.b64encode(b"postgres://db").decode()}}
    kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
    home_claim(kube, namespace, "zed")
    container = {
        "name": "main",
        "env": [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}}],
    }
    pod = {
        "metadata": {"name": "not-linked-yet", "namespace": namespace, "uid": "u-1"},
        "spec": {
            "containers": [container],
            "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-zed"}}],
        },
    }
    node = kube.kubelet.agents[H100]
    running = RunningPod("u-1", namespace, "not-linked-yet", "127.1.9.9", tmp_path)
    with pytest.raises(MissingReference, match="forbidden"):
        kube.run(container_environment(node.api, node.name, pod, container, running))
    with pytest.raises(VolumeNotReady, match="claim-zed"):
        kube.run(volume_folders(node.api, pod, tmp_path))
