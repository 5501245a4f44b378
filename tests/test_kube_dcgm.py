"""Device telemetry on Kubernetes from dcgm-exporter, on the real control plane.

A dcgm-exporter pod (labelled as the GPU Operator labels it) runs on a GPU node and serves, over real HTTP
from its own pod address, what dcgm-exporter serves: Prometheus text with its field names, labels and units,
each device's series naming the pod that uses it. The exporter itself needs GPUs, so the text is written by the
test (a stand-in for the program; the format is dcgm-exporter's). The service, built for the Kubernetes backend,
finds the exporter through the pods its inventory watches and gives each lease the readings of its pod's
devices: a whole A100 and a MIG slice, idle and then busy.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from kube_cluster import A100, H100, LocalKube, eventually, wait_for_file
from test_kube_inventory import Service

from gpupool.spawner.pool.requests import MigSlice, Request, WholeGpus
from gpupool.spawner.telemetry.samples import Sample

EXPORTER_LABELS = {"app": "nvidia-dcgm-exporter"}


NAMESPACE = {"users": "default"}  # where the users' pods run: a namespace of the test's own, set below


def series(name: str, value: float, hostname: str, gpu: int, pod: str = "", **extra: str) -> str:
    """One line of dcgm-exporter's exposition (labels as its render_metrics.go writes them)."""
    labels = {
        "gpu": str(gpu),
        "UUID": f"GPU-0c4d2f3a-7e5b-4a8c-9d1e-{gpu:012d}",
        "pci_bus_id": f"00000000:{gpu + 7:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": "NVIDIA A100-SXM4-40GB" if hostname == A100 else "NVIDIA H100 80GB HBM3",
        "Hostname": hostname,
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
        **extra,
    }
    if pod:
        labels |= {"container": "notebook", "namespace": NAMESPACE["users"], "pod": pod}
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{text}}} {value:g}"


def of_node(text: str, node: str) -> str:
    """What the exporter on ``node`` serves: the series of that node's GPUs (dcgm-exporter reads its own)."""
    return "\n".join(
        line for line in text.splitlines() if line.startswith("#") or f'Hostname="{node}"' in line
    )


def exposition(a100_util: float, mig_active: float, a100_pod: str = "jupyter-ada") -> str:
    lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    lines += [series("DCGM_FI_DEV_GPU_UTIL", 0, A100, gpu) for gpu in (0, 1, 3)]
    lines.append(series("DCGM_FI_DEV_GPU_UTIL", a100_util, A100, 2, a100_pod))
    lines += [
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
    ]
    lines.append(series("DCGM_FI_DEV_FB_USED", 512, A100, 2, a100_pod))
    lines += [
        "# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_FREE gauge",
    ]
    lines.append(series("DCGM_FI_DEV_FB_FREE", 40000, A100, 2, a100_pod))
    lines += ["# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).", "# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    lines.append(series("DCGM_FI_DEV_GPU_TEMP", 41, A100, 2, a100_pod))
    lines += ["# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).", "# TYPE DCGM_FI_DEV_POWER_USAGE gauge"]
    lines.append(series("DCGM_FI_DEV_POWER_USAGE", 88.5, A100, 2, a100_pod))
    lines += [
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.",
        "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge",
        series(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            mig_active,
            H100,
            6,
            "jupyter-bo",
            GPU_I_ID="2",
            GPU_I_PROFILE="3g.40gb",
        ),
    ]
    return "\n".join(lines) + "\n"


def test_leased_devices_get_the_readings_dcgm_exporter_gives_their_pods(
    kube: LocalKube, tmp_path: Path
) -> None:
    service = Service(tmp_path, kube.kubeconfig(tmp_path / "kubeconfig"))
    manager, telemetry = service.manager, service.service.parts.telemetry
    NAMESPACE["users"] = users = kube.namespace("users")
    served = {node: tmp_path / node for node in (A100, H100, "forged")}
    for folder in served.values():
        folder.mkdir()

    def serve(a100_util: float, mig_active: float) -> None:
        text = exposition(a100_util=a100_util, mig_active=mig_active)
        (served[A100] / "metrics").write_text(of_node(text, A100))
        (served[H100] / "metrics").write_text(of_node(text, H100))

    serve(a100_util=0, mig_active=0.0)
    # a pod merely labelled like dcgm-exporter, on the H100 node, claiming ada's A100 (on another node) idle
    forged = series("DCGM_FI_DEV_GPU_UTIL", 0, A100, 0, "jupyter-ada")  # GPU 0 sorts first: it would win
    (served["forged"] / "metrics").write_text(f"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n{forged}\n")
    operator = kube.namespace("gpu-operator")
    done = tmp_path / "done"
    whole = manager.request_lease(
        "ada", (), "server", "ada", "a100", Request(1000, 1024, WholeGpus(1, frozenset({"A100-40GB"})))
    )
    mig = manager.request_lease(
        "bo", (), "server", "bo", "mig-3g", Request(1000, 1024, MigSlice(profile="3g.40gb"))
    )
    assert (whole.node, mig.node) == (A100, H100)

    async def scenario() -> None:
        async with service.cluster.watching():
            for name, lease, node in (("jupyter-ada", whole, A100), ("jupyter-bo", mig, H100)):
                _pod(kube, users, name, node, wait_for_file(done), annotations={"gpupool.io/lease": lease.id})
            for name, node, folder in (
                ("nvidia-dcgm-exporter-x7k2p", A100, served[A100]),
                ("nvidia-dcgm-exporter-m4q8d", H100, served[H100]),
                ("not-an-exporter", H100, served["forged"]),
            ):
                command = [
                    sys.executable,
                    "-m",
                    "http.server",
                    "9400",
                    "--bind",
                    "0.0.0.0",
                    "--directory",
                    str(folder),
                ]
                _pod(kube, operator, name, node, command, labels=EXPORTER_LABELS, port=9400)
            telemetry.sampler.open()
            idle = await _sample_until(
                telemetry, lambda s: whole.devices[0].uuid in s and mig.devices[0].uuid in s
            )
            a100, slice_ = idle[whole.devices[0].uuid], idle[mig.devices[0].uuid]
            assert (a100.gpu_utilization, a100.memory_used_mib, a100.memory_total_mib) == (0, 512, 40512)
            assert (a100.temperature_c, a100.power_w, a100.node) == (41, 88.5, A100)
            assert (slice_.gpu_utilization, slice_.mig_profile, slice_.node) == (0, "3g.40gb", H100)
            assert len(idle) == 2  # devices no lease's pod uses have no reading: unknown, not idle
            serve(a100_util=87, mig_active=0.42)
            busy = await _sample_until(telemetry, lambda s: s[whole.devices[0].uuid].gpu_utilization == 87)
            for _ in range(3):  # the pod on the H100 node that claims ada's A100 idle is never believed
                again = {s.uuid: s for s in (await telemetry.sample_once()).samples}
                assert again[whole.devices[0].uuid].gpu_utilization == 87
            assert busy[mig.devices[0].uuid].gpu_utilization == 42.0  # a ratio, read as percent
            recent = telemetry.history.recent(whole.devices[0].uuid, None)
            assert [s.gpu_utilization for s in recent][-1] == 87
            done.touch()

    try:
        asyncio.run(scenario())
    finally:
        done.touch()
        telemetry.sampler.close()


async def _sample_until(telemetry: object, condition: object, timeout_s: float = 30) -> dict[str, Sample]:
    deadline = time.monotonic() + timeout_s
    while True:
        snapshot = await telemetry.sample_once()  # type: ignore[attr-defined]
        found = {s.uuid: s for s in snapshot.samples}
        try:
            if condition(found):  # type: ignore[operator]
                return found
        except KeyError:
            pass
        assert time.monotonic() < deadline, f"no such readings within {timeout_s} s: {found}"
        await asyncio.sleep(0.3)


def _pod(
    kube: LocalKube,
    namespace: str,
    name: str,
    node: str,
    command: list[str],
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    port: int | None = None,
) -> None:
    container: dict[str, object] = {"name": "main", "image": "example.org/x:1", "command": command}
    if port is not None:
        container["ports"] = [{"name": "metrics", "containerPort": port}]
    kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [container],
            },
        },
    )
    eventually(
        lambda: (
            (kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}") or {}).get("status", {}).get("phase")
            == "Running"
        ),
        f"pod {name} running",
    )
