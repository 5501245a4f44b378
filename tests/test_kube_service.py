"""The real gpupool service process with ``GPUPOOL_BACKEND=kubernetes`` against the real API server, acting as
the ServiceAccount that ``gpupool kube manifests`` creates, with exactly the roles it prints: ``GET pool`` shows
the cluster's nodes as the "kubernetes" backend, and a node whose kubelet falls silent shows as unhealthy there
once the node-lifecycle controller has marked it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from hub_harness import free_port, service_command
from kube_cluster import A100, H100, LocalKube, l4_node, own_node, service_account_kubeconfig
from token_hub import token_hub

ADMIN = {
    "name": "root",
    "kind": "user",
    "scopes": ["access:services!service=gpupool", "custom:gpupool:admin"],
}


def test_the_service_with_its_own_rbac_shows_the_clusters_nodes_and_their_health(
    kube: LocalKube, tmp_path: Path
) -> None:
    namespace = kube.namespace("svc")
    kubeconfig = service_account_kubeconfig(kube, namespace, tmp_path / "kubeconfig")
    port = free_port()
    with own_node(kube, l4_node("l4-svc")) as agent, token_hub({"admin-token": ADMIN}) as hub_api:
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
        url = f"http://127.0.0.1:{port}/services/gpupool/api/v1/pool"
        try:
            pool = _wait_for_pool(url, process, log_path)
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
        finally:
            process.terminate()
            process.wait(timeout=10)


def _get(url: str) -> dict[str, Any]:
    response = httpx.get(url, headers={"Authorization": "token admin-token"}, timeout=5)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


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
