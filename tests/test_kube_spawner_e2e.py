"""``KubeGPUSpawner`` end to end: the real KubeSpawner code and ``kubernetes_asyncio`` client against the API
server stand-in, asking the real gpupool service (``GPUPOOL_BACKEND=kubernetes``, a separate process) for
leases over real HTTP.

The stand-in has no kubelet, so this test plays one: a pod that appears is bound to the node its required
node affinity names (only if that node allocates the extended resources the pod asks for), reported Running
and Ready on 127.0.0.1, and announced with the scheduler's ``Scheduled`` event. The hub is played by a small
HTTP server that answers the service's token checks.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
from hub_harness import free_port, service_command
from jupyterhub.objects import Hub, Server
from kube_apiserver import KubeApiServer, kube_apiserver, write_kubeconfig
from kubernetes_asyncio.config import kube_config
from token_hub import token_hub

from gpupool.spawner.hub.kube_spawner import KubeGPUSpawner
from gpupool.spawner.kube.manifests import label_value

NAMESPACE = "jhub"
SPAWNER_TOKEN = "spawner-token"
CALLERS = {
    SPAWNER_TOKEN: {
        "name": "gpupool-hub",
        "kind": "service",
        "scopes": ["access:services!service=gpupool", "custom:gpupool:leases", "custom:gpupool:admin"],
    }
}


class _User:
    """What KubeSpawner and gpupool's spawner read of a hub user."""

    def __init__(self, name: str, uid: int, groups: tuple[str, ...] = ()) -> None:
        self.name = name
        self.id = uid
        self.url = f"/user/{name}/"
        self.admin = False
        self.groups = [type("Group", (), {"name": g})() for g in groups]
        self.settings: dict[str, Any] = {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeApiServer, str, Path]]:
    """The stand-in with an 8×H100 (mixed MIG) node and a 4×A100 node, a kubelet for it, the gpupool service
    on it; yields the stand-in, the service's URL and the kubeconfig."""
    tmp = tmp_path_factory.mktemp("kube-spawner")
    port = free_port()
    with token_hub(CALLERS) as hub_api, kube_apiserver("dgx-h100-mixed", "a100-40gb") as api:
        kubeconfig = write_kubeconfig(tmp / "kubeconfig", api.url, namespace=NAMESPACE)
        env = os.environ | {
            "GPUPOOL_BACKEND": "kubernetes",
            "KUBECONFIG": str(kubeconfig),
            "GPUPOOL_KUBE_NAMESPACE": NAMESPACE,
            "GPUPOOL_KUBE_JOB_IMAGE": "quay.io/example/gpupool-singleuser:test",
            "GPUPOOL_DB_URL": f"sqlite:///{tmp}/gpupool.sqlite",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
            "JUPYTERHUB_API_URL": hub_api,
            "GPUPOOL_RECONCILE_SECONDS": "0",
            "GPUPOOL_SAMPLE_SECONDS": "0",
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        stop = threading.Event()
        kubelet = threading.Thread(target=_kubelet, args=(api, stop), daemon=True)
        kubelet.start()
        log = (tmp / "service.log").open("wb")
        service = subprocess.Popen(service_command(), env=env, cwd=tmp, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}/services/gpupool/"
        try:
            _wait_for(url + "api/v1/pool", service, tmp)
            yield api, url, kubeconfig
        finally:
            stop.set()
            service.terminate()
            service.wait(timeout=10)
            log.close()


def test_two_users_get_pods_on_their_leased_nodes_with_their_leased_resources(
    cluster: tuple[KubeApiServer, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, url, kubeconfig = cluster
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))  # read at import
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))

    async def both() -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        alice = _spawner(_User("alice", 1), url, "mig-3g")
        bob = _spawner(_User("bob", 2, ("gpu-users",)), url, "a100-pair")
        events: list[str] = []
        # the form: gpupool's profiles as KubeSpawner's profile_list, live from the Kubernetes pool
        offered = {row["slug"]: str(row["description"]) for row in await alice.gpupool_profile_list()}
        assert "can start now" in offered["mig-3g"] and "simulated" not in offered["mig-3g"]
        assert "a100-pair" not in offered  # only for gpu-users, which bob is in
        assert "a100-pair" in {row["slug"] for row in await bob.gpupool_profile_list()}

        async def watch_progress() -> None:
            async for event in alice.progress():
                events.append(str(event.get("message", "")))

        starting = asyncio.gather(alice.start(), bob.start())
        await asyncio.sleep(0.01)  # JupyterHub asks for progress once the start is under way
        watching = asyncio.create_task(watch_progress())
        started = await starting
        await asyncio.wait_for(watching, 30)
        assert all(started), started
        pods = (_pod(api, alice), _pod(api, bob))
        leases = [await _lease(url, s.lease_id) for s in (alice, bob)]
        assert [lease["state"] for lease in leases] == ["granted", "granted"]
        await asyncio.gather(alice.stop(), bob.stop())
        for spawner in (alice, bob):
            assert (await _lease(url, spawner.lease_id))["state"] == "released"
            assert _find_pod(api, spawner) is None
        return pods[0], pods[1], events

    alice_pod, bob_pod, events = asyncio.run(both())
    assert _node_of(alice_pod) == "dgx-h100-01" and _limits(alice_pod) == {"nvidia.com/mig-3g.40gb": "1"}
    assert _node_of(bob_pod) == "gpu-a100-01" and _limits(bob_pod) == {"nvidia.com/gpu": "2"}
    for pod in (alice_pod, bob_pod):
        assert pod["spec"]["nodeName"] == _node_of(pod)  # the stand-in's kubelet bound it there
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        # the exact lease id in the annotation; the label carries it made a valid label value
        lease_id = env["GPUPOOL_LEASE_ID"]
        assert pod["metadata"]["annotations"]["gpupool.io/lease"] == lease_id
        assert pod["metadata"]["labels"]["gpupool.io/lease"] == label_value(lease_id)
        assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin's part on a real node
        kubernetes_validate.validate(_as_submitted(pod), "1.30", strict=True)
    assert any("Asking gpupool for" in e for e in events), events
    assert any("placed on node dgx-h100-01" in e for e in events), events  # the Scheduled event, in words


def _spawner(user: _User, url: str, profile: str) -> KubeGPUSpawner:
    spawner = KubeGPUSpawner(
        user=user,
        hub=Hub(ip="127.0.0.1", port=8081, base_url="/hub/"),
        namespace=NAMESPACE,
        service_url=url,
        service_api_token=SPAWNER_TOKEN,
        api_token=f"server-token-{user.name}",
        oauth_client_id=f"jupyterhub-user-{user.name}",
        image="quay.io/example/gpupool-singleuser:test",
        start_timeout=60,
        http_timeout=30,
    )
    spawner.server = Server(base_url=f"/user/{user.name}/")
    spawner.user_options = {"profile": profile}
    return spawner


async def _lease(url: str, lease_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(headers={"Authorization": f"token {SPAWNER_TOKEN}"}, timeout=10) as client:
        answer = await client.get(f"{url}api/v1/leases/{lease_id}")
    answer.raise_for_status()
    lease: dict[str, Any] = answer.json()
    return lease


def _find_pod(api: KubeApiServer, spawner: KubeGPUSpawner) -> dict[str, Any] | None:
    return api.get("pods", spawner.pod_name, NAMESPACE)


def _pod(api: KubeApiServer, spawner: KubeGPUSpawner) -> dict[str, Any]:
    pod = _find_pod(api, spawner)
    assert pod is not None, f"no pod {spawner.pod_name}"
    return pod


def _node_of(pod: dict[str, Any]) -> str:
    affinity = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = affinity["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    assert expression["key"] == "kubernetes.io/hostname" and expression["operator"] == "In"
    (node,) = expression["values"]
    return str(node)


def _limits(pod: dict[str, Any]) -> dict[str, str]:
    resources = pod["spec"]["containers"][0]["resources"]
    gpu = {k: v for k, v in resources["limits"].items() if k.startswith("nvidia.com/")}
    assert gpu == {k: v for k, v in resources["requests"].items() if k.startswith("nvidia.com/")}
    return gpu


def _as_submitted(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as KubeSpawner sent it: without what the stand-in (server side) added."""
    submitted = {k: v for k, v in pod.items() if k != "status"}
    submitted["metadata"] = {
        k: v
        for k, v in pod["metadata"].items()
        if k not in ("resourceVersion", "uid", "creationTimestamp", "namespace")
    }
    submitted["spec"] = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
    return submitted


def _kubelet(api: KubeApiServer, stop: threading.Event) -> None:
    """Bind new pods to the node their affinity requires, when it allocates what they ask for, and run them."""
    while not stop.wait(0.05):
        for pod in api.objects("pods", NAMESPACE):
            if pod.get("status", {}).get("phase") == "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            node = api.get("nodes", _node_of(pod))
            wanted = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
            if node is None or any(k not in node["status"]["allocatable"] for k in wanted if "/" in k):
                continue
            bound = {
                **pod,
                "spec": {**pod["spec"], "nodeName": node["metadata"]["name"]},
                "status": {
                    "phase": "Running",
                    "podIP": "127.0.0.1",
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [
                        {
                            "name": c["name"],
                            "image": c["image"],
                            "imageID": "",
                            "restartCount": 0,
                            "ready": True,
                            "state": {"running": {}},
                        }
                        for c in pod["spec"]["containers"]
                    ],
                },
            }
            api.put("pods", bound)
            api.put(
                "events",
                {
                    "metadata": {"name": f"{pod['metadata']['name']}.scheduled", "namespace": NAMESPACE},
                    "involvedObject": {
                        "kind": "Pod",
                        "name": pod["metadata"]["name"],
                        "namespace": NAMESPACE,
                    },
                    "reason": "Scheduled",
                    "type": "Normal",
                    "message": f"Successfully assigned {NAMESPACE}/{pod['metadata']['name']} to "
                    f"{node['metadata']['name']}",
                    "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
            )


def _wait_for(url: str, process: subprocess.Popen[bytes], tmp: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the service exited: {(tmp / 'service.log').read_text()[-3000:]}")
        try:
            if (
                httpx.get(url, headers={"Authorization": f"token {SPAWNER_TOKEN}"}, timeout=5).status_code
                == 200
            ):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the service did not answer: {(tmp / 'service.log').read_text()[-3000:]}")
