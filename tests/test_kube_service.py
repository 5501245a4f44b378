"""The real gpupool service process with ``GPUPOOL_BACKEND=kubernetes`` against the real API server, acting as
the ServiceAccount that ``gpupool kube manifests`` creates, with exactly the roles it prints: ``GET pool`` shows
the cluster's nodes as the "kubernetes" backend, and a node whose kubelet falls silent shows as unhealthy there
once the node-lifecycle controller has marked it. The local cluster's nodes are gpupool's stand-ins, and every
listing says so; a node labelled as a real cluster's is not called simulated."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hub_harness import free_port, service_command
from kube_cluster import (
    A100,
    H100,
    LocalKube,
    l4_node,
    load_fixture,
    own_node,
    service_account_kubeconfig,
)
from token_hub import token_hub

from gpupool.spawner.cli import main

ADMIN = {
    "name": "root",
    "kind": "user",
    "scopes": ["access:services!service=gpupool", "custom:gpupool:admin"],
}


@contextmanager
def kube_service(kube: LocalKube, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The service process on the cluster, as the manifests' ServiceAccount, in a namespace of its own; yields
    its URL (``…/services/gpupool/``) once ``GET pool`` answers, and its log."""
    namespace = kube.namespace("svc")
    kubeconfig = service_account_kubeconfig(kube, namespace, tmp_path / "kubeconfig")
    port = free_port()
    with token_hub({"admin-token": ADMIN}) as hub_api:
        env = os.environ | {
            "GPUPOOL_BACKEND": "kubernetes",
            "KUBECONFIG": str(kubeconfig),
            "GPUPOOL_KUBE_NAMESPACE": namespace,
            "GPUPOOL_KUBE_JOB_IMAGE": "registry.example.org/gpupool-singleuser:1.0",
            "GPUPOOL_DB_URL": f"sqlite:///{tmp_path}/gpupool.sqlite",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
            "JUPYTERHUB_API_URL": hub_api,
            "GPUPOOL_RECONCILE_SECONDS": "0",
            "GPUPOOL_SAMPLE_SECONDS": "0",
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log_path = tmp_path / "service.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(service_command(), env=env, cwd=tmp_path, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}/services/gpupool/"
        try:
            _wait_for_pool(url + "api/v1/pool", process, log_path)
            yield url, log_path
        finally:
            process.terminate()
            process.wait(timeout=10)


def test_the_service_with_its_own_rbac_shows_the_clusters_nodes_and_their_health(
    kube: LocalKube, tmp_path: Path
) -> None:
    with own_node(kube, l4_node("l4-svc")) as agent, kube_service(kube, tmp_path) as (service, log_path):
        url = service + "api/v1/pool"
        pool = _get(url)
        assert pool["backend"] == "kubernetes"
        assert pool["source"] == f"Kubernetes API at {kube.url}"
        nodes = {n["name"]: n for n in pool["nodes"]}
        assert {H100, A100, agent.name} <= set(nodes)
        assert len(nodes[H100]["gpus"]) == 8 and len(nodes[A100]["gpus"]) == 4
        assert nodes[A100]["labels"]["gpupool.io/backend"] == "kubernetes"
        assert agent.name not in pool["summary"]["unhealthy"]
        agent.go_silent()
        deadline = time.monotonic() + 45
        while agent.name not in pool["summary"]["unhealthy"] and time.monotonic() < deadline:
            time.sleep(0.2)
            pool = _get(url)
        assert agent.name in pool["summary"]["unhealthy"]
        assert H100 not in pool["summary"]["unhealthy"]
        forbidden = [
            line
            for line in log_path.read_text().splitlines()
            if "(403" in line or "forbidden" in line.lower()
        ]
        assert forbidden == []  # everything the service asked of the API server, its roles allowed


def test_the_local_clusters_gpus_are_called_simulated_and_a_node_labelled_as_a_real_ones_is_not(
    kube: LocalKube, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A researcher trying the Kubernetes demo took its H100s for real ones: the nodes gpupool's kubelet registers
    (``gpupool.io/simulated=true``) are called simulated in ``gpupool pool``, the dashboard, the profiles the job
    panel and spawn form read, and the telemetry the GPU monitor reads. A node labelled as GPU Feature Discovery
    labels a real cluster's, without that mark, is not."""
    real = load_fixture("a100-40gb")  # a real cluster's A100 node, as its GFD labelled it
    labels = real["metadata"]["labels"] | {"kubernetes.io/hostname": "a100-real"}
    metadata = {"name": "a100-real", "labels": labels}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": real["spec"]}
    agent = kube.add_node(node, {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "4"})
    try:
        with kube_service(kube, tmp_path) as (service, _log):
            assert main(["pool", "--url", service, "--token", "admin-token"]) == 0
            text = capsys.readouterr().out
            assert f"Pool from Kubernetes API at {kube.url} (kubernetes, simulated: not real GPUs)" in text
            node_lines = {line.split()[0]: line for line in text.splitlines() if "  CPU " in line}
            assert "  simulated  " in node_lines[H100] and "  simulated  " in node_lines[A100]
            assert "simulated" not in node_lines["a100-real"]
            pool = _get(service + "api/v1/pool")
            simulated = {n["name"]: n["simulated"] for n in pool["nodes"]}
            assert pool["simulated"] and simulated[H100] and simulated[A100] and not simulated["a100-real"]
            profiles = _get(service + "api/v1/profiles")
            assert profiles and all(p["simulated"] for p in profiles)  # the job panel's "simulated" label
            assert _get(service + "api/v1/telemetry")["simulated"] is True  # the GPU monitor's
            page = httpx.get(service, headers={"Authorization": "token admin-token"}, timeout=5).text
            assert '<span class="sim">simulated</span></h1>' in page
            assert f'<b>{H100}</b> <span class="sim">simulated</span>' in page
            assert '<b>a100-real</b> <span class="m">' in page
    finally:
        kube.remove_node(agent)


def _get(url: str) -> Any:
    response = httpx.get(url, headers={"Authorization": "token admin-token"}, timeout=5)
    response.raise_for_status()
    return response.json()


def _wait_for_pool(url: str, process: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the service exited: {log.read_text()[-3000:]}")
        try:
            return _get(url)
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail(f"the service did not answer: {log.read_text()[-3000:]}")
