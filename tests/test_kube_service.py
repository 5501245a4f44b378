"""The real gpupool service process with ``GPUPOOL_BACKEND=kubernetes`` against the API server stand-in: ``GET
pool`` shows the cluster's nodes as the "kubernetes" backend, and a node going NotReady shows there."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hub_harness import free_port, service_command
from kube_apiserver import kube_apiserver, write_kubeconfig
from token_hub import token_hub

ADMIN = {
    "name": "root",
    "kind": "user",
    "scopes": ["access:services!service=gpupool", "custom:gpupool:admin"],
}


@pytest.fixture
def hub_api() -> Iterator[str]:
    with token_hub({"admin-token": ADMIN}) as url:
        yield url


def test_the_service_on_kubernetes_shows_the_clusters_nodes_and_their_health(
    tmp_path: Path, hub_api: str
) -> None:
    port = free_port()
    with kube_apiserver("dgx-h100-mixed", "a100-40gb") as cluster:
        env = os.environ | {
            "GPUPOOL_BACKEND": "kubernetes",
            "KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", cluster.url)),
            "GPUPOOL_KUBE_NAMESPACE": "jhub",
            "GPUPOOL_KUBE_JOB_IMAGE": "registry.example.org/gpupool-singleuser:1.0",
            "GPUPOOL_DB_URL": f"sqlite:///{tmp_path}/gpupool.sqlite",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
            "JUPYTERHUB_API_URL": hub_api,
            "GPUPOOL_RECONCILE_SECONDS": "0",
            "GPUPOOL_SAMPLE_SECONDS": "0",
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log = (tmp_path / "service.log").open("wb")
        process = subprocess.Popen(service_command(), env=env, cwd=tmp_path, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}/services/gpupool/api/v1/pool"
        try:
            pool = _wait_for_pool(url, process, tmp_path)
            assert pool["backend"] == "kubernetes"
            assert pool["source"] == f"Kubernetes API at {cluster.url}"
            nodes = {n["name"]: n for n in pool["nodes"]}
            assert sorted(nodes) == ["dgx-h100-01", "gpu-a100-01"]
            assert len(nodes["dgx-h100-01"]["gpus"]) == 8 and len(nodes["gpu-a100-01"]["gpus"]) == 4
            assert nodes["gpu-a100-01"]["labels"]["gpupool.io/backend"] == "kubernetes"
            assert pool["summary"]["whole_gpus_free"] == 10 and pool["summary"]["unhealthy"] == []
            cluster.set_node_ready("gpu-a100-01", False)
            deadline = time.monotonic() + 10
            while pool["summary"]["unhealthy"] != ["gpu-a100-01"] and time.monotonic() < deadline:
                time.sleep(0.05)
                pool = _get(url)
            assert pool["summary"]["unhealthy"] == ["gpu-a100-01"]
        finally:
            process.terminate()
            process.wait(timeout=10)
            log.close()


def _get(url: str) -> dict[str, Any]:
    response = httpx.get(url, headers={"Authorization": "token admin-token"}, timeout=5)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def _wait_for_pool(url: str, process: subprocess.Popen[bytes], tmp: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the service exited: {(tmp / 'service.log').read_text()[-3000:]}")
        try:
            return _get(url)
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail(f"the service did not answer: {(tmp / 'service.log').read_text()[-3000:]}")
