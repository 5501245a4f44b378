"""GPU-idle culling on Kubernetes, end to end: ``gpupool up --kubeconfig`` on the real control plane (real hub,
proxy, KubeGPUSpawner, gpupool service on its Kubernetes backend, the real jupyterhub-idle-culler with gpupool's
arbiter), and a dcgm-exporter pod on the cluster that shows the demo user's A100 idle. The user is warned,
then the server is culled: its pod deleted and its lease released, though nobody ever closed its tab.

The exporter's text is written by the test in dcgm-exporter's format (the program needs GPUs; see
``test_kube_dcgm``). Timings are shortened as the README says, through ``gpupool up``'s environment: an 8 s
``gpu_idle_timeout`` in the profiles file, a one-second culler pass, a three-second warning, a sample every
half second.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from kube_cluster import A100, LocalKube, eventually
from test_kube_dcgm import EXPORTER_LABELS, NAMESPACE, _pod, exposition
from up_harness import api_token, extra_config, free_port_family, login, require_proxy, start_up

PROFILES = """
profiles:
  - slug: a100
    display_name: One A100
    gpus: {count: 1, products: [A100-40GB]}
    cpu: 1
    memory: 1GiB
    gpu_idle_timeout: 8s
    default: true
"""
# gpupool up hands its GPUPOOL_* settings to the service and the culler
SHORT = {
    "GPUPOOL_SAMPLE_SECONDS": "0.5",
    "GPUPOOL_CULL_WARNING_SECONDS": "3",
    "GPUPOOL_CULL_EVERY_SECONDS": "1",
}


def test_a_server_whose_gpu_dcgm_exporter_shows_idle_is_warned_then_culled(
    kube: LocalKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_proxy()
    (tmp_path / "profiles.yaml").write_text(PROFILES)
    monkeypatch.setenv("GPUPOOL_PROFILES", str(tmp_path / "profiles.yaml"))
    for name, value in SHORT.items():
        monkeypatch.setenv(name, value)
    served = tmp_path / "served"
    served.mkdir()
    NAMESPACE["users"] = "default"  # where gpupool up's KubeGPUSpawner makes pods
    (served / "metrics").write_text(exposition(a100_util=0, mig_active=0, a100_pod="jupyter-demo"))
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
    up = start_up(
        tmp_path,
        tmp_path / "state",
        free_port_family(),
        extra_config(tmp_path),
        pool=("--kubeconfig", str(kubeconfig)),
    )
    operator = kube.namespace("gpu-operator")
    exporter = [sys.executable, "-m", "http.server", "9400", "--bind", "0.0.0.0", "--directory", str(served)]
    try:
        browser = login(up)
        headers = {"Authorization": f"token {api_token(browser)}"}
        started = browser.post(
            "/hub/api/users/demo/server", json={"profile": "a100"}, headers=headers, timeout=60
        )
        assert started.status_code in (201, 202), started.text
        eventually(lambda: _ready(browser, headers), f"the server ready:\n{up.log_tail()}", timeout_s=120)
        pod = kube.get("/api/v1/namespaces/default/pods/jupyter-demo")
        assert pod is not None and pod["spec"]["nodeName"] == A100
        lease_id = pod["metadata"]["annotations"]["gpupool.io/lease"]
        _pod(kube, operator, "nvidia-dcgm-exporter-q9z4m", A100, exporter, labels=EXPORTER_LABELS, port=9400)
        service = httpx.Client(base_url=f"{up.url}/services/gpupool/api/v1", headers=headers, timeout=10)

        def warned() -> bool:
            answer = service.get("/warnings").json()
            warnings = answer.get("warnings", []) if isinstance(answer, dict) else answer
            return any(w.get("lease_id") == lease_id for w in warnings)

        eventually(warned, f"a warning for the idle A100:\n{up.log_tail()}", timeout_s=60)
        assert _ready(browser, headers)  # warned first, still running
        eventually(lambda: not _ready(browser, headers), f"the server culled:\n{up.log_tail()}", timeout_s=60)
        eventually(
            lambda: kube.get("/api/v1/namespaces/default/pods/jupyter-demo") is None, "the pod deleted"
        )
        eventually(
            lambda: service.get(f"/leases/{lease_id}").json()["state"] == "released", "the lease released"
        )
        culled = [
            line for line in up.log.read_text().splitlines() if "cull" in line.lower() and "demo" in line
        ]
        assert any("gpu" in line.lower() for line in culled), culled[-10:]  # culled for its idle GPU
    finally:
        up.stop()


def _ready(browser: httpx.Client, headers: dict[str, str]) -> bool:
    user = browser.get("/hub/api/users/demo", headers=headers).json()
    return bool(user["servers"].get("", {}).get("ready"))
