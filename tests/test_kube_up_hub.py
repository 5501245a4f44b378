"""What the README's "Try it on a local cluster" shows, end to end: ``gpupool up --kubeconfig`` against the real
control plane (the one ``gpupool kube up`` starts; here the tests' own). The demo user logs in through the real
hub and proxy, picks a MIG profile, and reaches JupyterLab in a pod the real scheduler bound to the leased
node, with the leased MIG resource in its limits and, from the simulated device plugin, a ``MIG-…`` UUID of
that node in its environment. Stopping the server deletes the pod and releases the lease."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from kube_cluster import H100, LocalKube, eventually
from up_harness import api_token, extra_config, free_port_family, login, require_proxy, start_up

from gpupool.spawner.kube.local.nodes import node_devices


def test_a_new_user_reaches_jupyterlab_in_a_pod_on_the_leased_node_with_the_leased_mig_slice(
    kube: LocalKube, tmp_path: Path
) -> None:
    require_proxy()
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
    up = start_up(
        tmp_path,
        tmp_path / "state",
        free_port_family(),
        extra_config(tmp_path),
        pool=("--kubeconfig", str(kubeconfig)),
    )
    try:
        assert "servers are pods in namespace default (KubeGPUSpawner)" in up.log.read_text()
        browser = login(up)
        headers = {"Authorization": f"token {api_token(browser)}"}
        form = browser.get("/hub/spawn")
        assert form.status_code == 200 and "MIG 3g.40gb" in form.text
        assert "(simulated pool)" in form.text  # the nodes are gpupool kube up's stand-ins, not real GPUs
        # JupyterHub answers a spawn within its slow_spawn_timeout (10 s), the client's own default: wait longer
        started = browser.post(
            "/hub/api/users/demo/server", json={"profile": "mig-3g"}, headers=headers, timeout=60
        )
        assert started.status_code in (201, 202), started.text
        eventually(lambda: _ready(browser, headers), f"the server ready:\n{up.log_tail()}", timeout_s=120)
        lab = browser.get("/user/demo/lab", follow_redirects=True)
        assert lab.status_code == 200 and "JupyterLab" in lab.text, lab.text[:500]

        pod = kube.get("/api/v1/namespaces/default/pods/jupyter-demo")
        assert pod is not None and pod["spec"]["nodeName"] == H100  # the real scheduler's binding
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        lease = httpx.get(
            f"{up.url}/services/gpupool/api/v1/leases/{env['GPUPOOL_LEASE_ID']}", headers=headers, timeout=10
        ).json()
        assert lease["state"] == "granted" and lease["node"] == H100
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == "1"
        # the server process's own environment: the slice the (simulated) device plugin gave the pod
        seen = _process_environment(kube, pod)
        h100 = next(n for n in _pool_nodes() if n.name == H100)
        assert seen["NVIDIA_VISIBLE_DEVICES"] in node_devices(h100)["nvidia.com/mig-3g.40gb"]
        assert seen["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")

        # the first server made the user's home claim, as Zero to JupyterHub's dynamic storage does, and the
        # local cluster gave it a volume: a training job mounts it and runs (a trial's waited Pending forever)
        claim = eventually(
            lambda: _bound(kube.get("/api/v1/namespaces/default/persistentvolumeclaims/claim-demo")),
            "claim-demo bound",
        )
        assert claim["spec"]["storageClassName"] == ""
        # the README's training example: a script uploaded through JupyterLab, run as a job from the home (a
        # trial's job could not open it: the server's files and the job's were in different folders)
        uploaded = browser.put(
            "/user/demo/api/contents/train.py",
            json={"type": "file", "format": "text", "content": "print('trained')\n"},
            headers=headers,
        )
        assert uploaded.status_code in (200, 201), uploaded.text
        job = httpx.post(
            f"{up.url}/services/gpupool/api/v1/jobs",
            json={"profile": "cpu", "command": ["python", "train.py"]},
            headers=headers,
            timeout=30,
        )
        assert job.status_code == 201, job.text
        jobs_api = f"{up.url}/services/gpupool/api/v1/jobs/{job.json()['id']}"
        try:
            eventually(
                lambda: httpx.get(jobs_api, headers=headers, timeout=10).json()["state"] == "succeeded",
                "the job to succeed",
                timeout_s=120,
            )
        except AssertionError as late:  # what the job and the cluster said then, not at the job's start
            model = httpx.get(jobs_api, headers=headers, timeout=10).json()
            pods = kube.items(
                "/api/v1/namespaces/default/pods", labelSelector="app.kubernetes.io/component=training-job"
            )
            raise AssertionError(
                f"{late}\n{model}\n{[p.get('status') for p in pods]}\n{up.log_tail()}"
            ) from None
        assert httpx.get(f"{jobs_api}/logs", headers=headers, timeout=10).text.strip() == "trained"
        # a Kubernetes trial's timed-out job printed nothing at all, as if it had written nothing
        slow = httpx.post(
            f"{up.url}/services/gpupool/api/v1/jobs",
            json={"profile": "cpu", "command": ["sh", "-c", "echo started; sleep 60"], "max_runtime": "3s"},
            headers=headers,
            timeout=30,
        ).json()["id"]
        slow_api = f"{up.url}/services/gpupool/api/v1/jobs/{slow}"
        eventually(
            lambda: httpx.get(slow_api, headers=headers, timeout=10).json()["state"] == "timed-out",
            "the slow job to time out",
            timeout_s=120,
        )
        token = headers["Authorization"].removeprefix("token ")
        connection = ["--url", f"{up.url}/services/gpupool/", "--token", token]
        command = [sys.executable, "-m", "gpupool.spawner.cli", "logs", slow, *connection]
        said = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert said.returncode == 0, said.stderr
        if not said.stdout:  # unless the service read the log before the pod went
            assert (
                f"no log kept for job {slow}: on Kubernetes a run ended at its maximum runtime" in said.stderr
            )

        stopped = browser.delete("/hub/api/users/demo/server", headers=headers)
        assert stopped.status_code in (202, 204), stopped.text
        eventually(
            lambda: kube.get("/api/v1/namespaces/default/pods/jupyter-demo") is None, "the pod deleted"
        )
        released = httpx.get(
            f"{up.url}/services/gpupool/api/v1/leases/{lease['id']}", headers=headers, timeout=10
        ).json()
        assert released["state"] == "released"
    finally:
        up.stop()


def _ready(browser: httpx.Client, headers: dict[str, str]) -> bool:
    user = browser.get("/hub/api/users/demo", headers=headers).json()
    server = user.get("servers", {}).get("")
    return bool(server and server.get("ready"))


def _process_environment(kube: LocalKube, pod: dict[str, Any]) -> dict[str, str]:
    agent = kube.kubelet.agents[pod["spec"]["nodeName"]]
    running = agent.pods[pod["metadata"]["uid"]]
    process = next(iter(running.containers.values())).process
    assert process is not None
    deadline = time.monotonic() + 10
    while True:
        raw = Path(f"/proc/{process.pid}/environ").read_bytes()
        pairs = dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
        if pairs or time.monotonic() > deadline:
            return pairs
        time.sleep(0.1)


def _pool_nodes() -> Any:
    from kube_cluster import POOL

    from gpupool.spawner.backends.simulated import load_pool_file

    return load_pool_file(POOL)


def _bound(claim: dict[str, Any] | None) -> dict[str, Any] | None:
    return claim if claim and claim.get("status", {}).get("phase") == "Bound" else None
