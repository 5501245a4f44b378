"""The real Kubernetes control plane of the Kubernetes tests, started once per test run.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager, built from their Go modules
(:mod:`gpupool.spawner.kube.local.build`; ``make test`` builds them first), run on 127.0.0.1 with the nodes of
``tests/pools/kube.yaml`` kept Ready by gpupool's simulated kubelet, which runs in a thread of the test
process so that a test can make a node of its own go silent. If the control plane cannot be built or started,
every Kubernetes test fails with the reason; none is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes_asyncio.config import kube_config
from kubespawner.clients import load_config
from polling import pauses

from gpupool.spawner.backends.simulated import load_pool_file, parse_pool
from gpupool.spawner.kube.local.build import BuildError, ensure_built
from gpupool.spawner.kube.local.cluster import Kubelet, wait_ready
from gpupool.spawner.kube.local.control_plane import ControlPlane, ControlPlaneError, write_kubeconfig
from gpupool.spawner.kube.local.kubelet import NodeAgent
from gpupool.spawner.kube.local.nodes import node_object, node_resources
from gpupool.spawner.pool.devices import Node

POOL = Path(__file__).parent / "pools" / "kube.yaml"
FIXTURES = Path(__file__).parent / "fixtures" / "kube"
H100, A100 = "dgx-h100-01", "gpu-a100-01"
T = TypeVar("T")
Obj = dict[str, Any]


def load_fixture(name: str) -> Obj:
    """A Node (or other object) from ``tests/fixtures/kube/<name>.yaml``."""
    data: Obj = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())
    return data


class LocalKube:
    """The running cluster: its admin client, kubeconfigs, and the kubelet's event loop."""

    def __init__(self, plane: ControlPlane, kubelet: Kubelet, loop: asyncio.AbstractEventLoop) -> None:
        self.plane = plane
        self.kubelet = kubelet
        self.loop = loop
        self.url = plane.url
        self.api = plane.client()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the kubelet's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """An admin's kubeconfig whose default namespace is ``namespace``."""
        return write_kubeconfig(path, self.url, self.plane.pki.ca.cert, self.plane.admin, namespace)

    def namespace(self, prefix: str = "t") -> str:
        """A new namespace for one test, so tests never see each other's pods and Jobs."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        # the ServiceAccount admission plugin refuses pods until the controller has made the namespace's
        # default ServiceAccount, a moment after the namespace itself
        eventually(lambda: self.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"), f"{name}/default")
        return name

    def request(self, method: str, path: str, body: Any = None, **headers: str) -> Obj:
        answer = self.api.request(method, path, json=body, headers=headers)
        if answer.status_code >= 400:
            raise AssertionError(f"{method} {path}: {answer.status_code} {answer.text}")
        found: Obj = answer.json()
        return found

    def get(self, path: str) -> Obj | None:
        answer = self.api.get(path)
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        found: Obj = answer.json()
        return found

    def items(self, path: str, **params: str) -> list[Obj]:
        answer = self.api.get(path, params=params)
        answer.raise_for_status()
        found: list[Obj] = answer.json()["items"]
        return found

    def patch(self, path: str, body: Obj) -> Obj:
        return self.request("PATCH", path, body, **{"Content-Type": "application/merge-patch+json"})

    def add_node(self, node: Obj, resources: dict[str, str]) -> NodeAgent:
        """A node of the test's own, registered and kept Ready by the kubelet until the test makes it silent."""
        agent = self.run(self.kubelet.add(node, resources))
        self.run(wait_ready(self.plane, [agent.name]))
        return agent

    def remove_node(self, agent: NodeAgent) -> None:
        self.run(agent.stop())
        self.kubelet.agents.pop(agent.name, None)
        self.api.delete(f"/api/v1/nodes/{agent.name}")


def eventually(condition: Callable[[], T], what: str, timeout_s: float = 30.0) -> T:
    """``condition()`` once truthy (for tests that are not async)."""
    for _ in pauses(timeout_s):
        if found := condition():
            return found
    raise AssertionError(f"not within {timeout_s} s: {what}")


@contextmanager
def local_kube(folder: Path) -> Iterator[LocalKube]:
    try:
        programs = ensure_built()
    except BuildError as error:
        pytest.fail(f"the Kubernetes control plane could not be built: {error}", pytrace=False)
    plane = ControlPlane(programs, folder)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="kubelet", daemon=True)
    thread.start()
    try:
        plane.start()
    except ControlPlaneError as error:
        pytest.fail(f"the Kubernetes control plane did not start: {error}", pytrace=False)
    kubelet = Kubelet(folder, plane.url)
    cluster = LocalKube(plane, kubelet, loop)
    try:
        cluster.run(kubelet.start())
        nodes = load_pool_file(POOL)
        for node in nodes:
            cluster.run(kubelet.add(node))
        cluster.run(wait_ready(plane, [n.name for n in nodes]))
        yield cluster
    finally:
        try:
            cluster.run(kubelet.stop())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            cluster.api.close()
            plane.stop()


def l4_node(name: str) -> Node:
    """A node of two whole L4 GPUs: a product only a test's own node has, so its health decides placement."""
    (node,) = parse_pool(
        {"nodes": [{"name": name, "cpu": 16, "memory": "64GiB", "gpus": {"product": "L4-24GB", "count": 2}}]},
        "test node",
    )
    return node


@contextmanager
def own_node(kube: LocalKube, node: Node) -> Iterator[NodeAgent]:
    """``node`` registered by its own kubelet for one test, and removed afterwards."""
    agent = kube.add_node(node_object(node), node_resources(node))
    try:
        yield agent
    finally:
        kube.remove_node(agent)


def workload_pod(
    kube: LocalKube, namespace: str, name: str, node: str, limits: dict[str, int], command: list[str]
) -> Obj:
    """Another workload's pod (not gpupool's) asking for GPUs on ``node``; the real scheduler binds it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "example.org/training:1",
                    "command": command,
                    "resources": {"limits": {k: str(v) for k, v in limits.items()}},
                }
            ],
        },
    }
    return kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)


def wait_for_file(path: Path) -> list[str]:
    """A container command that runs until ``path`` exists, then exits 0."""
    return ["sh", "-c", f"while [ ! -e '{path}' ]; do sleep 0.1; done"]


# Where each kind of object is created (the paths the API server serves them under).
_PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Service": "/api/v1/namespaces/{ns}/services",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
}


def apply(kube: LocalKube, obj: Obj) -> Obj:
    """Create ``obj`` as ``kubectl apply`` would the first time (the API server validates it)."""
    path = _PATHS[obj["kind"]].format(ns=obj["metadata"].get("namespace", ""))
    return kube.request("POST", path, obj)


def service_account_kubeconfig(kube: LocalKube, namespace: str, path: Path) -> Path:
    """Apply the ServiceAccount and RBAC that ``gpupool kube manifests --namespace <namespace>`` prints, and
    write a kubeconfig that acts as that ServiceAccount (a token from the TokenRequest API): the service then
    runs with exactly the rights the manifests give it."""
    printed = subprocess.run(
        [sys.executable, "-m", "gpupool.spawner.cli", "kube", "manifests", "--namespace", namespace],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    account = ""
    for document in yaml.safe_load_all(printed):
        if document["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
            apply(kube, document)
        if document["kind"] == "ServiceAccount":
            account = document["metadata"]["name"]
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 7200},
    }
    token = kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": kube.url, "certificate-authority": str(kube.plane.pki.ca.cert)},
            }
        ],
        "users": [{"name": account, "user": {"token": token["status"]["token"]}}],
        "contexts": [
            {"name": "local", "context": {"cluster": "local", "user": account, "namespace": namespace}}
        ],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def home_claim(kube: LocalKube, namespace: str, user: str) -> None:
    """The user's home claim (``claim-<user>``, as KubeSpawner names it), bound by the real PersistentVolume
    controller to a volume made for it: the scheduler places no pod whose claim is unbound. (The kubelet
    mounts nothing; see :mod:`gpupool.spawner.kube.local.kubelet`.)"""
    volume = f"home-{namespace}-{user}"
    kube.request(
        "POST",
        "/api/v1/persistentvolumes",
        {
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": f"/tmp/{volume}"},
                "claimRef": {"namespace": namespace, "name": f"claim-{user}"},
                "storageClassName": "",
            },
        },
    )
    kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
        {
            "metadata": {"name": f"claim-{user}"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "",
                "volumeName": volume,
            },
        },
    )


def point_kubespawner_at(monkeypatch: pytest.MonkeyPatch, kubeconfig: Path) -> None:
    """Make KubeSpawner read ``kubeconfig`` in this test. Its client reads ``KUBECONFIG`` once, at import, and
    KubeSpawner loads the client configuration once per process (``kubespawner.clients.load_config`` is cached),
    so an earlier test's cluster would otherwise stay in force."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    load_config.cache_clear()


class Relay:
    """A TCP relay to the API server that can be cut (every connection closed, nothing accepted) and opened
    again on the same port: an API server gone silent, for its clients alone."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.flowing = asyncio.Event()  # cleared: connections stay open and nothing passes (a hung server)
        self.port_open = 0  # the port it listens on, to open again after a cut
        self.flowing.set()

    async def open(self, port: int) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", port)
        self.port_open = int(self.server.sockets[0].getsockname()[1])
        return self.port_open

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for writer in list(self.writers):
            writer.close()
        self.writers.clear()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(self.host, self.port)
        self.writers |= {writer, upstream_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    await self.flowing.wait()
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
