"""``KubeGPUSpawner`` end to end on the real control plane: the real KubeSpawner code and ``kubernetes_asyncio``
client create pods that the real admission chain accepts and the real scheduler binds to the node of their
lease, with the leased resources; gpupool's simulated kubelet runs each pod's command as a process on its own
loopback address, so the spawner's answer really reaches a server. The spawners ask the real gpupool service
(``GPUPOOL_BACKEND=kubernetes``, a separate process acting as the ServiceAccount ``gpupool kube manifests``
creates) for leases over real HTTP. The hub is played by a small HTTP server that answers the service's token
checks.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubespawner.clients
import pytest
import yaml
from hub_harness import free_port, service_command
from jupyterhub.objects import Hub, Server
from kube_cluster import A100, H100, LocalKube, eventually, point_kubespawner_at, service_account_kubeconfig
from token_hub import token_hub

from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES
from gpupool.spawner.hub.compat import SpawnException
from gpupool.spawner.hub.kube_spawner import KubeGPUSpawner
from gpupool.spawner.kube.manifests import label_value

SPAWNER_TOKEN = "spawner-token"
CALLERS = {
    SPAWNER_TOKEN: {
        "name": "gpupool-hub",
        "kind": "service",
        "scopes": ["access:services!service=gpupool", "custom:gpupool:leases", "custom:gpupool:admin"],
    }
}
# What each test pod runs: a web server on the pod's own address (the image is not pulled).
SERVER = [sys.executable, "-m", "http.server", "--bind", "0.0.0.0", "8888"]


class _User:
    """What KubeSpawner and gpupool's spawner read of a hub user."""

    def __init__(self, name: str, uid: int, groups: tuple[str, ...] = ()) -> None:
        self.name = name
        self.id = uid
        self.url = f"/user/{name}/"
        self.admin = False
        self.groups = [type("Group", (), {"name": g})() for g in groups]
        self.settings: dict[str, Any] = {}


class Hub_:
    """The gpupool service on the cluster, and what the spawners need to reach it."""

    def __init__(self, kube: LocalKube, namespace: str, url: str, kubeconfig: Path, profiles: Path) -> None:
        self.kube, self.namespace, self.url, self.kubeconfig = kube, namespace, url, kubeconfig
        self.profiles = profiles  # the service's and the spawners' profiles file

    def pod(self, spawner: KubeGPUSpawner) -> dict[str, Any] | None:
        return self.kube.get(f"/api/v1/namespaces/{self.namespace}/pods/{spawner.pod_name}")


@pytest.fixture(scope="module")
def hub(kube: LocalKube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub_]:
    tmp = tmp_path_factory.mktemp("kube-spawner")
    namespace = kube.namespace("jhub")
    profiles = _with_an_environment_for_cuda_12_8(tmp / "profiles.yaml")
    port = free_port()
    with token_hub(CALLERS) as hub_api:
        env = os.environ | {
            "GPUPOOL_BACKEND": "kubernetes",
            "KUBECONFIG": str(service_account_kubeconfig(kube, namespace, tmp / "service.kubeconfig")),
            "GPUPOOL_KUBE_NAMESPACE": namespace,
            "GPUPOOL_KUBE_JOB_IMAGE": "quay.io/example/gpupool-singleuser:test",
            "GPUPOOL_PROFILES": str(profiles),
            "GPUPOOL_DB_URL": f"sqlite:///{tmp}/gpupool.sqlite",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
            "JUPYTERHUB_API_URL": hub_api,
            "GPUPOOL_RECONCILE_SECONDS": "0",
            "GPUPOOL_SAMPLE_SECONDS": "0",
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log_path = tmp / "service.log"
        with log_path.open("wb") as log:
            service = subprocess.Popen(service_command(), env=env, cwd=tmp, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}/services/gpupool/"
        try:
            _wait_for(url + "api/v1/pool", service, log_path)
            yield Hub_(kube, namespace, url, kube.kubeconfig(tmp / "hub.kubeconfig", namespace), profiles)
        finally:
            service.terminate()
            service.wait(timeout=10)


def test_users_get_pods_bound_by_the_scheduler_to_their_leased_nodes_with_their_leased_resources(
    hub: Hub_, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_kubespawner_at(monkeypatch, hub.kubeconfig)
    seen: dict[str, dict[str, Any]] = {}

    async def all_three() -> list[str]:
        alice = _spawner(_User("alice", 1), hub, "mig-3g")
        bob = _spawner(_User("bob", 2, ("gpu-users",)), hub, "a100-pair")
        carol = _spawner(_User("carol", 3), hub, "mig-1g")
        events: list[str] = []
        progress: list[int] = []
        # the form: gpupool's profiles as KubeSpawner's profile_list, live from the Kubernetes pool
        offered = {row["slug"]: str(row["description"]) for row in await alice.gpupool_profile_list()}
        assert "can start now" in offered["mig-3g"]
        # the nodes are gpupool kube up's stand-ins, and the form says so on every choice
        assert all(said.endswith("(simulated pool)") for said in offered.values()), offered
        assert "a100-pair" not in offered  # only for gpu-users, which bob is in
        assert "a100-pair" in {row["slug"] for row in await bob.gpupool_profile_list()}

        async def watch_progress() -> None:
            async for event in alice.progress():
                events.append(str(event.get("message", "")))
                progress.append(int(event.get("progress", progress[-1] if progress else 0)))

        starting = asyncio.gather(alice.start(), bob.start(), carol.start())
        await asyncio.sleep(0.01)  # JupyterHub asks for progress once the start is under way
        watching = asyncio.create_task(watch_progress())
        started = await starting
        await asyncio.wait_for(watching, 60)
        assert progress == sorted(progress), progress  # the bar never goes back
        for spawner, url in zip((alice, bob, carol), started, strict=True):
            assert url.startswith("http://127.1.")  # the pod's own address
            async with httpx.AsyncClient() as client:  # what the hub's proxy will do: reach the server
                assert await _answers(client, url), f"{url} did not answer 200 within 30 s"
            seen[spawner.user.name] = hub.pod(spawner) or {}
            lease = await _lease(hub.url, spawner.lease_id)
            assert lease["state"] == "granted"
            seen[spawner.user.name]["lease"] = lease
        await asyncio.gather(alice.stop(), bob.stop(), carol.stop())
        for spawner in (alice, bob, carol):
            assert (await _lease(hub.url, spawner.lease_id))["state"] == "released"
            await asyncio.to_thread(
                eventually, lambda s=spawner: hub.pod(s) is None, f"{spawner.pod_name} gone"
            )
        return events

    events = asyncio.run(all_three())
    assert seen["alice"]["spec"]["nodeName"] == H100 and _limits(seen["alice"]) == {
        "nvidia.com/mig-3g.40gb": "1"
    }
    assert seen["bob"]["spec"]["nodeName"] == A100 and _limits(seen["bob"]) == {"nvidia.com/gpu": "2"}
    assert seen["carol"]["spec"]["nodeName"] == H100 and _limits(seen["carol"]) == {
        "nvidia.com/mig-1g.10gb": "1"
    }
    for pod in seen.values():
        assert pod["status"]["phase"] == "Running"
        assert pod["status"]["containerStatuses"][0]["imageID"].startswith("gpupool-simulated://")
        assert _required_node(pod) == pod["spec"]["nodeName"] == pod["lease"]["node"]
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        lease_id = env["GPUPOOL_LEASE_ID"]
        assert lease_id == pod["lease"]["id"]
        assert pod["metadata"]["annotations"]["gpupool.io/lease"] == lease_id
        assert pod["metadata"]["labels"]["gpupool.io/lease"] == label_value(lease_id)
        assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin's part on a real node
    assert events[:2] == [
        "Asking gpupool for Half an H100 (MIG 3g.40gb)",
        f"Granted {seen['alice']['lease']['devices'][0]['label']}; starting the server",
    ], events
    # the scheduler's own event; KubeSpawner shows it in the progress only if its event watch has it before
    # the pod is up (on a loaded machine it may not), so it is read where the scheduler wrote it
    scheduled = hub.kube.items(f"/api/v1/namespaces/{hub.namespace}/events")
    assert any(
        e["reason"] == "Scheduled"
        and e["involvedObject"]["name"] == seen["alice"]["metadata"]["name"]
        and H100 in e["message"]
        for e in scheduled
    ), [e["message"] for e in scheduled]


def test_a_start_that_finds_a_leftover_pod_of_its_name_keeps_the_lease_it_was_granted(
    hub: Hub_, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Kubernetes trial stopped the hub while the API server was down, so the server's pod stayed. The next
    start found it: KubeSpawner cleared it with the spawner's own stop(), which released the lease just
    granted, and the new pod ran on a MIG slice gpupool then showed as free."""
    point_kubespawner_at(monkeypatch, hub.kubeconfig)
    # KubeSpawner shares its watches and clients between spawners, on the event loop that made them: this
    # test's asyncio.run is a new loop, as a hub's one loop would not be
    monkeypatch.setattr(KubeGPUSpawner, "reflectors", {})
    monkeypatch.setattr(kubespawner.clients, "_client_cache", {})

    async def scenario() -> None:
        dave = _spawner(_User("dave", 4), hub, "mig-1g")
        leftover = {
            "metadata": {"name": dave.pod_name, "namespace": hub.namespace},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": H100},  # not another test's passing node
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {"name": "notebook", "image": "example.org/old:1", "command": ["sleep", "600"]}
                ],
            },
        }
        hub.kube.request("POST", f"/api/v1/namespaces/{hub.namespace}/pods", leftover)
        url = await dave.start()
        async with httpx.AsyncClient() as client:
            assert await _answers(client, url)
        lease = await _lease(hub.url, dave.lease_id)
        assert lease["state"] == "granted", lease
        pod = hub.pod(dave) or {}
        assert pod["metadata"]["annotations"]["gpupool.io/lease"] == lease["id"]
        await dave.stop()
        assert (await _lease(hub.url, dave.lease_id))["state"] == "released"

    asyncio.run(scenario())


def test_a_server_pod_a_resource_quota_refuses_is_said_in_the_clusters_words_and_its_lease_goes_back(
    hub: Hub_, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Kubernetes admin's trial: with the namespace's ResourceQuota used up, a researcher's start was a bare
    "HTTP 500: Internal Server Error", and the progress stream carried the API client's headers."""
    point_kubespawner_at(monkeypatch, hub.kubeconfig)
    monkeypatch.setattr(KubeGPUSpawner, "reflectors", {})
    monkeypatch.setattr(kubespawner.clients, "_client_cache", {})
    quotas = f"/api/v1/namespaces/{hub.namespace}/resourcequotas"
    hub.kube.request("POST", quotas, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}})

    async def scenario() -> None:
        erin = _spawner(_User("erin", 5), hub, "mig-1g")
        with pytest.raises(SpawnException) as refused:
            await erin.start()
        said = refused.value.jupyterhub_message
        assert said.startswith("Kubernetes refused to create your server's pod: 403 Forbidden: pods "), said
        assert "exceeded quota: no-pods" in said and "HTTP response headers" not in said, said
        assert refused.value.status_code == 503
        assert (await _lease(hub.url, erin.lease_id or ""))["state"] == "released"

    try:
        # until the quota controller has counted the namespace, admission refuses with another reason
        eventually(lambda: (hub.kube.get(f"{quotas}/no-pods") or {}).get("status", {}).get("hard"), "counted")
        asyncio.run(scenario())
    finally:
        hub.kube.request("DELETE", f"{quotas}/no-pods")


def _with_an_environment_for_cuda_12_8(path: Path) -> Path:
    """The shipped profiles, with a third environment for a100-pair that needs CUDA 12.8: newer than the
    cluster's drivers (550.54.15, CUDA 12.4 at most, from GPU Feature Discovery's labels) run."""
    profiles = yaml.safe_load(EXAMPLE_PROFILES.read_text())
    a100_pair = next(p for p in profiles["profiles"] if p["slug"] == "a100-pair")
    a100_pair["environments"].append(
        {"slug": "cuda-12-8", "display_name": "Code built for CUDA 12.8", "min_cuda": "12.8"}
    )
    path.write_text(yaml.safe_dump(profiles, sort_keys=False))
    return path


def test_an_environment_the_nodes_drivers_cannot_run_is_left_out_of_the_form_saying_why_and_refused_by_name(
    hub: Hub_, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Kubernetes trial: KubeGPUSpawner's form offered an environment built for a CUDA newer than the
    nodes' driver runs, and picking it ended in a 409 "never fits" after Start."""
    point_kubespawner_at(monkeypatch, hub.kubeconfig)
    monkeypatch.setattr(KubeGPUSpawner, "reflectors", {})
    monkeypatch.setattr(kubespawner.clients, "_client_cache", {})
    why = "needs CUDA 12.8; the A100-40GB's driver 550.54.15 supports up to 12.4 (on gpu-a100-01)"

    async def scenario() -> None:
        frank = _spawner(_User("frank", 6, ("gpu-users",)), hub, "a100-pair")
        (row,) = [r for r in await frank.gpupool_profile_list() if r["slug"] == "a100-pair"]
        assert list(row["profile_options"]["environment"]["choices"]) == ["lab", "cuda-12-4"]
        assert f"Code built for CUDA 12.8 not offered: {why}" in str(row["description"])
        form = await frank.get_options_form()  # KubeSpawner's own template, as the hub's spawn page shows it
        assert 'value="cuda-12-4"' in form and 'value="cuda-12-8"' not in form
        assert f"Code built for CUDA 12.8 not offered: {why}" in form  # its template does not escape
        frank.user_options = {"profile": "a100-pair", "environment": "cuda-12-8"}  # a REST spawn, anyway
        with pytest.raises(SpawnException) as refused:
            await frank.start()
        assert refused.value.status_code == 409
        assert refused.value.jupyterhub_message == (
            f"gpupool: environment: profile a100-pair's GPUs can run lab, cuda-12-4, not 'cuda-12-8': {why}"
        )
        assert frank.lease_id == "" and hub.pod(frank) is None

    asyncio.run(scenario())


def _spawner(user: _User, hub: Hub_, profile: str) -> KubeGPUSpawner:
    spawner = KubeGPUSpawner(
        user=user,
        hub=Hub(ip="127.0.0.1", port=8081, base_url="/hub/"),
        namespace=hub.namespace,
        service_url=hub.url,
        service_api_token=SPAWNER_TOKEN,
        profiles_file=str(hub.profiles),
        api_token=f"server-token-{user.name}",
        oauth_client_id=f"jupyterhub-user-{user.name}",
        image="quay.io/example/gpupool-singleuser:test",
        cmd=SERVER,
        show_job_folders=False,  # the stand-in server is no JupyterLab: it takes none of its arguments
        terminals_keep_path=False,
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


def _required_node(pod: dict[str, Any]) -> str:
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


def _wait_for(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the service exited: {log.read_text()[-3000:]}")
        try:
            headers = {"Authorization": f"token {SPAWNER_TOKEN}"}
            if httpx.get(url, headers=headers, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the service did not answer: {log.read_text()[-3000:]}")


async def _answers(client: httpx.AsyncClient, url: str, timeout: float = 30.0) -> bool:
    """Whether the server at ``url`` answers 200 within ``timeout`` seconds, asked again until then as
    JupyterHub's own wait for a new server asks (its default http_timeout is 30 s): a pod is Running a moment
    before the server in it listens (a fresh-clone run under jupyterhub 5.3.0 was refused there once)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if (await client.get(url, timeout=10)).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)
