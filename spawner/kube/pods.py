"""A notebook server's pod from its lease: what ``KubeGPUSpawner`` hands KubeSpawner, and the whole Pod.

The lease has already chosen the node and the resource names (:class:`~.grant.KubeGrant`); the pod must
(1) ask for exactly those extended resources, requests equal to limits, so the device plugin hands over the
device gpupool counted, (2) be allowed onto that node only, (3) tolerate the GPU nodes' taint, (4) carry the
lease and the user as labels, so reconciliation finds the pods of a lease, and (5) know its lease and the
service (``GPUPOOL_LEASE_ID``, ``GPUPOOL_SERVICE_URL``) for the notebook widgets.

:func:`server_pod_overrides` gives that as KubeSpawner trait values, the form the spawner applies;
:func:`server_pod` builds the complete ``v1`` Pod from the same values, for tests and schema validation, so
both forms come from one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from ..device_env import device_env
from .grant import KubeGrant
from .manifests import (
    COMPONENT_LABEL,
    DEFAULT_GID,
    DEFAULT_UID,
    LEASE_LABEL,
    MANAGED_BY,
    USER_LABEL,
    JsonDict,
    ManifestError,
    container_security_context,
    cpu_quantity,
    dns_label,
    env_list,
    gpu_tolerations,
    label_value,
    memory_quantity,
    metadata,
    node_selector_terms,
    pod_security_context,
    require_dns_label,
    require_dns_subdomain,
    require_text,
    resource_limits,
)

SERVER_PORT = 8888
HOME_MOUNT = "/home/jovyan"


class KubeSpawnerOverrides(TypedDict):
    """KubeSpawner trait name → value, ready for ``setattr(spawner, name, value)`` before ``start()``.

    KubeSpawner passes ``extra_labels`` and ``environment`` through its ``{username}`` template expansion;
    nothing here holds a brace, so expansion leaves every value as it is.
    """

    extra_resource_limits: dict[str, str]
    extra_resource_guarantees: dict[str, str]
    cpu_limit: float
    cpu_guarantee: float
    mem_limit: int
    mem_guarantee: int
    node_affinity_required: list[JsonDict]
    tolerations: list[JsonDict]
    extra_labels: dict[str, str]
    extra_annotations: dict[str, str]
    environment: dict[str, str]


def lease_labels(lease_id: str, user: str) -> dict[str, str]:
    """The labels that find a lease's pods (and a user's): values made valid by :func:`label_value`, so a
    selector built with the same function matches."""
    return {LEASE_LABEL: label_value(lease_id), USER_LABEL: label_value(user)}


def lease_pod_env(grant: KubeGrant, lease_id: str, service_url: str, profile: str) -> dict[str, str]:
    """What gpupool puts in a leased container's environment.

    No device UUIDs: on Kubernetes the device plugin picks the device and sets ``NVIDIA_VISIBLE_DEVICES``
    itself. A lease without GPU resources gets the local spawner's CPU-only pinning (no CUDA device, the
    container runtime's ``void``): CUDA images set ``NVIDIA_VISIBLE_DEVICES=all``, and on a node whose default
    runtime is NVIDIA's that would hand every GPU of the node to a pod that leased none.
    """
    env = {
        "GPUPOOL_LEASE_ID": require_text(lease_id, "lease_id"),
        "GPUPOOL_SERVICE_URL": require_text(service_url, "service_url"),
        "GPUPOOL_PROFILE": require_text(profile, "profile"),
    }
    if not grant.limits:
        env.update(device_env(""))
    env.update(grant.environment)  # an MPS share's memory cap
    return env


def server_pod_overrides(
    grant: KubeGrant,
    *,
    lease_id: str,
    user: str,
    profile: str,
    cpu_milli: int,
    memory_mib: int,
    service_url: str,
) -> KubeSpawnerOverrides:
    """The KubeSpawner settings that put a server on its lease (see the module docstring).

    CPU and memory are the profile's, the amounts the pool reserved on the node; limits equal requests, so
    the pool's bookkeeping is exact and the pod is in the Guaranteed QoS class, the last the kubelet evicts.
    Raises :class:`ManifestError` naming the field when a value cannot become a valid pod.
    """
    gpus = resource_limits(grant.limits)
    cpu_quantity(cpu_milli)
    memory_quantity(memory_mib)
    labels = {**lease_labels(lease_id, user), COMPONENT_LABEL: "singleuser-server"}
    return KubeSpawnerOverrides(
        extra_resource_limits=dict(gpus),
        extra_resource_guarantees=dict(gpus),
        cpu_limit=cpu_milli / 1000,
        cpu_guarantee=cpu_milli / 1000,
        mem_limit=memory_mib * 2**20,
        mem_guarantee=memory_mib * 2**20,
        node_affinity_required=node_selector_terms(grant.node),
        tolerations=gpu_tolerations(),
        extra_labels=labels,
        extra_annotations={LEASE_LABEL: lease_id},
        environment=lease_pod_env(grant, lease_id, service_url, profile),
    )


def server_pod_name(user: str, server_name: str = "") -> str:
    """``jupyter-<user>[-<server>]`` as a valid, unique pod name (for :func:`server_pod`; KubeSpawner names
    the pods it creates itself)."""
    return dns_label(f"jupyter-{user}" + (f"-{server_name}" if server_name else ""))


def server_pod(
    overrides: KubeSpawnerOverrides,
    *,
    name: str,
    namespace: str,
    image: str,
    home_claim: str | None = None,
    cmd: Sequence[str] = ("jupyterhub-singleuser",),
    port: int = SERVER_PORT,
    uid: int = DEFAULT_UID,
    gid: int = DEFAULT_GID,
) -> JsonDict:
    """The complete ``v1`` Pod a server runs in, from :func:`server_pod_overrides` as KubeSpawner would apply
    them, with the user's home volume (``home_claim``, a PVC name) at ``/home/jovyan``, as a full object for
    validation and tests."""
    require_dns_label(name, "name")
    require_text(image, "image")
    if not cmd:
        raise ManifestError("cmd: expected at least the program to run, got an empty command")
    container: JsonDict = {
        "name": "notebook",
        "image": image,
        "args": list(cmd),
        "ports": [{"name": "notebook-port", "containerPort": port}],
        "env": env_list(overrides["environment"], "environment"),
        "resources": _resources(overrides),
        "securityContext": container_security_context(uid),
    }
    spec: JsonDict = {
        "restartPolicy": "OnFailure",
        "automountServiceAccountToken": False,  # a user's pod gets no credentials for the API server
        "securityContext": pod_security_context(uid, gid),
        "containers": [container],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": overrides["node_affinity_required"]
                }
            }
        },
        "tolerations": overrides["tolerations"],
    }
    if home_claim is not None:
        require_dns_subdomain(home_claim, "home_claim")
        spec["volumes"] = [{"name": "home", "persistentVolumeClaim": {"claimName": home_claim}}]
        container["volumeMounts"] = [{"name": "home", "mountPath": HOME_MOUNT}]
    labels = {**MANAGED_BY, **overrides["extra_labels"]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(name, namespace, labels, overrides["extra_annotations"]),
        "spec": spec,
    }


def _resources(overrides: KubeSpawnerOverrides) -> JsonDict:
    """The container's limits and requests, as KubeSpawner writes them from its CPU and memory traits."""
    return {
        "limits": {
            "cpu": f"{round(overrides['cpu_limit'] * 1000)}m",
            "memory": f"{overrides['mem_limit'] // 2**20}Mi",
            **overrides["extra_resource_limits"],
        },
        "requests": {
            "cpu": f"{round(overrides['cpu_guarantee'] * 1000)}m",
            "memory": f"{overrides['mem_guarantee'] // 2**20}Mi",
            **overrides["extra_resource_guarantees"],
        },
    }
