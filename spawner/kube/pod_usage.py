"""What pods hold of a node's GPU resources, read from their specs: the usage gpupool did not grant (other
workloads on the same nodes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from .gfd import GPU_RESOURCE, MIG_RESOURCE_PREFIX, SHARED_RESOURCE, as_list, as_mapping, device_count
from .manifests import LEASE_LABEL


def is_gpu_resource(resource: str, shared_resource: str = SHARED_RESOURCE) -> bool:
    return resource in (GPU_RESOURCE, shared_resource) or resource.startswith(MIG_RESOURCE_PREFIX)


def pod_gpu_requests(pod: Mapping[str, Any], shared_resource: str = SHARED_RESOURCE) -> dict[str, int]:
    """The GPU resources a pod holds: per resource, the larger of its containers' sum and any init
    container's (init containers run one at a time, before the others). Limits count where requests are
    unset: extended resources must have requests equal to limits."""
    spec = as_mapping(pod.get("spec"))
    total: Counter[str] = Counter()
    for container in as_list(spec.get("containers")):
        total.update(_container_gpus(container, shared_resource))
    for container in as_list(spec.get("initContainers")):
        for resource, count in _container_gpus(container, shared_resource).items():
            total[resource] = max(total[resource], count)
    return {resource: count for resource, count in total.items() if count > 0}


def _container_gpus(container: object, shared_resource: str) -> dict[str, int]:
    resources = as_mapping(as_mapping(container).get("resources"))
    found: dict[str, int] = {}
    for section in ("limits", "requests"):
        for resource, value in as_mapping(resources.get(section)).items():
            if is_gpu_resource(str(resource), shared_resource):
                found[str(resource)] = max(
                    found.get(str(resource), 0), device_count(str(value), str(resource))
                )
    return found


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is bound to a node and not finished: what the kubelet still counts against the node."""
    node = as_mapping(pod.get("spec")).get("nodeName")
    phase = as_mapping(pod.get("status")).get("phase")
    return bool(node) and phase not in ("Succeeded", "Failed")


def external_usage(
    pods: Iterable[Mapping[str, Any]], shared_resource: str = SHARED_RESOURCE
) -> dict[str, dict[str, int]]:
    """Node -> GPU resource -> how many units pods other than gpupool's own hold there. gpupool's own pods
    (labelled ``gpupool.io/lease``) are left out: their leases already count them."""
    usage: dict[str, Counter[str]] = {}
    for pod in pods:
        labels = as_mapping(as_mapping(pod.get("metadata")).get("labels"))
        if LEASE_LABEL in labels or not holds_resources(pod):
            continue
        requests = pod_gpu_requests(pod, shared_resource)
        if requests:
            usage.setdefault(str(pod["spec"]["nodeName"]), Counter()).update(requests)
    return {node: dict(sorted(counts.items())) for node, counts in usage.items()}
