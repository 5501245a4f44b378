"""The real gpupool service process with ``GPUPOOL_BACKEND=kubernetes`` against the API server stand-in: ``GET
pool`` shows the cluster's nodes as the "kubernetes" backend, and a node going NotReady shows there."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from hub_harness import free_port, service_command
from kube_apiserver import kube_apiserver, write_kubeconfig

ADMIN = {
    "name": "root",
    "kind": "user",
    "scopes": ["access:services!service=gpupool", "custom:gpupool:admin"],
}


class _Hub(BaseHTTPRequestHandler):
    """JupyterHub's ``GET /hub/api/user``: the token ``admin-token`` is an admin, any other is refused."""

    def do_GET(self) -> None:
        token = (self.headers.get("Authorization") or "").partition(" ")[2]
        ok = token == "admin-token" and self.path == "/hub/api/user"
        body = json.dumps(ADMIN if ok else {"status": 403}).encode()
        self.send_response(200 if ok else 403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def hub_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hub/api"
    server.shutdown()
    server.server_close()


def test_the_service_on_kubernetes_shows_the_clusters_nodes_and_their_health(
    tmp_path: Path, hub_api: str
) -> None:
    port = free_port()
    with kube_apiserver("dgx-h100-mixed", "a100-40gb") as cluster:
        env = os.environ | {
            "GPUPOOL_BACKEND": "kubernetes",
            "KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", cluster.url)),
            "GPUPOOL_KUBE_NAMESPACE": "jhub",
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
