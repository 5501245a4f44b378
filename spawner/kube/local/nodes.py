"""Node objects for a pool file's nodes, as GPU Feature Discovery and the NVIDIA device plugin label them.

Whole GPUs become ``nvidia.com/gpu``; MIG instances follow the device plugin's mixed strategy
(``nvidia.com/mig-<profile>`` counted per node, ``nvidia.com/mig.strategy=mixed``); shared GPUs follow
time-slicing with ``renameByDefault: true`` (``nvidia.com/gpu.shared``, ``nvidia.com/gpu.replicas``). GPU nodes
carry the ``nvidia.com/gpu=present:NoSchedule`` taint sites use to keep other pods off them. Every node says it
is simulated (label ``gpupool.io/simulated=true``), so the service labels its GPUs "simulated" wherever they show
(:func:`...pool.devices.pool_is_simulated`). Pure: domain nodes in, plain dicts out.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...pool.devices import SIMULATED_LABEL, GpuMode, Node
from ..gfd import mig_resource
from ..labels import GPU_RESOURCE, SHARED_RESOURCE

# The product names GPU Feature Discovery publishes (``nvidia.com/gpu.product``) for gpupool's products.
GFD_PRODUCTS = {
    "A100-40GB": "NVIDIA-A100-SXM4-40GB",
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "H100-80GB": "NVIDIA-H100-80GB-HBM3",
    "H100-NVL-94GB": "NVIDIA-H100-NVL",
    "GH200-96GB": "NVIDIA-GH200-480GB",
    "H200-141GB": "NVIDIA-H200",
    "B200-180GB": "NVIDIA-B200",
    "A30-24GB": "NVIDIA-A30",
    "L4-24GB": "NVIDIA-L4",
    "L40S-48GB": "NVIDIA-L40S",
    "A10-24GB": "NVIDIA-A10",
    "T4-16GB": "Tesla-T4",
    "V100-16GB": "Tesla-V100-SXM2-16GB",
    "V100-32GB": "Tesla-V100-SXM2-32GB",
}


def node_object(node: Node) -> dict[str, Any]:
    """The Node a kubelet registers for ``node`` (metadata and spec); :func:`node_status` is its status."""
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        SIMULATED_LABEL: "true",
        **{
            k: v
            for k, v in node.labels.items()
            if "/" not in k or not k.split("/")[0].endswith("kubernetes.io")
        },
        **_gpu_labels(node),
    }
    spec: dict[str, Any] = {}
    if node.gpus:
        spec["taints"] = [{"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": spec,
    }


def node_resources(node: Node) -> dict[str, str]:
    """Capacity (and allocatable: the same here) as the kubelet and the device plugin report it."""
    resources = {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi", "pods": "110"}
    whole = sum(1 for g in node.gpus if g.mode is GpuMode.WHOLE)
    shared = sum(g.max_shares or 4 for g in node.gpus if g.mode is GpuMode.SHARED)
    slices = Counter(m.profile for g in node.gpus for m in g.mig_instances)
    if node.gpus:
        resources[GPU_RESOURCE] = str(whole)
    if shared:
        resources[SHARED_RESOURCE] = str(shared)
    resources.update({mig_resource(p): str(n) for p, n in sorted(slices.items())})
    return resources


def _gpu_labels(node: Node) -> dict[str, str]:
    if not node.gpus:
        return {}
    first = node.gpus[0]
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": GFD_PRODUCTS.get(first.product, first.product),
        "nvidia.com/gpu.count": str(len(node.gpus)),
        "nvidia.com/gpu.memory": str(first.memory_mib),
        "nvidia.com/gpu.replicas": "1",
    }
    if first.compute_capability:
        major, _, minor = first.compute_capability.partition(".")
        labels |= {"nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor or "0"}
    if first.driver_version:
        parts = first.driver_version.split(".")
        labels |= {
            f"nvidia.com/cuda.driver.{k}": v for k, v in zip(("major", "minor", "rev"), parts, strict=False)
        }
    if any(g.mode is GpuMode.MIG for g in node.gpus):
        labels |= {
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config": "custom-config",
            "nvidia.com/mig.config.state": "success",
        }
    shared = [g for g in node.gpus if g.mode is GpuMode.SHARED]
    if shared:
        labels |= {
            "nvidia.com/gpu.replicas": str(shared[0].max_shares or 4),
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
        }
    return labels


def node_devices(node: Node) -> dict[str, list[str]]:
    """Resource name -> the device UUIDs the device plugin hands out for it (a time-sliced GPU once per
    replica), in the order it hands them out."""
    devices: dict[str, list[str]] = {}
    for gpu in node.gpus:
        if gpu.mode is GpuMode.WHOLE:
            devices.setdefault(GPU_RESOURCE, []).append(gpu.uuid)
        elif gpu.mode is GpuMode.SHARED:
            devices.setdefault(SHARED_RESOURCE, []).extend([gpu.uuid] * (gpu.max_shares or 4))
        for instance in gpu.mig_instances:
            devices.setdefault(mig_resource(instance.profile), []).append(instance.uuid)
    return devices
