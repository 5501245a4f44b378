"""Device telemetry on Kubernetes from NVIDIA's dcgm-exporter, which every GPU Operator site runs.

gpupool's Kubernetes devices are its own names for what a node offers (``k8s-<node>-gpu<i>``): the device
plugin, not gpupool, picks the physical GPU or MIG instance a pod gets. What joins the two is the pod:
dcgm-exporter, reading the kubelet's pod-resources API, labels each device's series with the ``pod`` and
``namespace`` using it, and the pods gpupool creates carry their lease in the ``gpupool.io/lease``
annotation. So each lease's devices get the readings of the devices its pod was given, in order.

Pure: the exporters are found among pods the inventory already watches (:func:`exporters`), their
Prometheus text is parsed with ``prometheus_client``'s parser (:func:`parse_readings`), and readings become
:class:`~..telemetry.samples.Sample` records of leased devices (:func:`lease_samples`). Units as
dcgm-exporter writes them: ``DCGM_FI_DEV_GPU_UTIL`` %, ``DCGM_FI_DEV_FB_USED``/``_FREE`` MiB,
``DCGM_FI_DEV_GPU_TEMP`` °C, ``DCGM_FI_DEV_POWER_USAGE`` W, and for MIG instances
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` as a ratio from 0 to 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ..pool.devices import Node
from ..pool.leases import Lease
from ..telemetry.samples import Sample
from .manifests import LEASE_LABEL

EXPORTER_LABELS = {"app": "nvidia-dcgm-exporter"}  # the GPU Operator's label on dcgm-exporter's pods
EXPORTER_PORT = 9400

# dcgm-exporter's field -> (Sample field, factor to its unit)
FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_utilization", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("engine_active", 100.0),  # MIG instances: a ratio, read as %
    "DCGM_FI_DEV_FB_USED": ("memory_used_mib", 1.0),
    "DCGM_FI_DEV_FB_FREE": ("memory_free_mib", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
}


@dataclass
class Reading:
    """One physical device (a GPU, or a MIG instance of one) as one exporter reported it."""

    hostname: str
    gpu: int
    instance: str  # GPU_I_ID, "" for a whole GPU
    pod: str  # "namespace/name" using it, "" when none
    values: dict[str, float] = field(default_factory=dict)


def exporters(
    pods: Iterable[Mapping[str, Any]], labels: Mapping[str, str] = EXPORTER_LABELS
) -> list[tuple[str, str]]:
    """The metrics URL and node of each running dcgm-exporter pod (its ``metrics`` port, else 9400)."""
    found = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        status = pod.get("status") or {}
        spec = pod.get("spec") or {}
        pod_labels = metadata.get("labels") or {}
        if status.get("phase") != "Running" or not status.get("podIP") or not spec.get("nodeName"):
            continue
        if any(pod_labels.get(k) != v for k, v in labels.items()):
            continue
        port = EXPORTER_PORT
        for container in spec.get("containers") or []:
            for declared in container.get("ports") or []:
                if declared.get("name") == "metrics" and declared.get("containerPort"):
                    port = int(declared["containerPort"])
        found.append((f"http://{status['podIP']}:{port}/metrics", str(spec["nodeName"])))
    return sorted(found)


def on_node(reading: Reading, node: str, pods: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether ``reading`` may be believed from the exporter of ``node``: the pod it names runs there. An
    exporter reads the GPUs of its own node only, so one that names pods elsewhere (a pod merely labelled
    like dcgm-exporter) cannot make another node's GPUs look idle to the culler."""
    pod = pods.get(reading.pod)
    return pod is not None and (pod.get("spec") or {}).get("nodeName") == node


def parse_readings(text: str) -> list[Reading]:
    """The devices in one exporter's Prometheus text, each with the fields gpupool reads."""
    found: dict[tuple[str, int, str, str], Reading] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            wanted = FIELDS.get(sample.name)
            labels = sample.labels
            if wanted is None or not labels.get("gpu", "").isdigit():
                continue
            pod = (
                f"{labels['namespace']}/{labels['pod']}"
                if labels.get("pod") and labels.get("namespace")
                else ""
            )
            key = (labels.get("Hostname", ""), int(labels["gpu"]), labels.get("GPU_I_ID", ""), pod)
            reading = found.setdefault(key, Reading(*key))
            name, factor = wanted
            reading.values[name] = float(sample.value) * factor
    return list(found.values())


def lease_samples(
    readings: Iterable[Reading],
    leases: Iterable[Lease],
    pods: Mapping[str, Mapping[str, Any]],
    nodes: Sequence[Node],
    at: float,
) -> list[Sample]:
    """Samples of leased devices: the readings of each pod that carries a lease, matched in order to that
    lease's devices (by GPU index, then MIG instance). A device no lease's pod uses has none: unknown."""
    lease_of_pod = {
        key: str(annotations[LEASE_LABEL])
        for key, pod in pods.items()
        if LEASE_LABEL in (annotations := (pod.get("metadata") or {}).get("annotations") or {})
    }
    by_lease: dict[str, list[Reading]] = {}
    for reading in readings:
        if reading.pod in lease_of_pod:
            by_lease.setdefault(lease_of_pod[reading.pod], []).append(reading)
    gpu_index = {g.uuid: g.index for n in nodes for g in n.gpus}
    mig_profile = {m.uuid: m.profile for n in nodes for g in n.gpus for m in g.mig_instances}
    mig_start = {m.uuid: m.start for n in nodes for g in n.gpus for m in g.mig_instances}
    samples = []
    for lease in leases:  # both in order of GPU index, then MIG instance (numbers, not text)
        mine = sorted(by_lease.get(lease.id, ()), key=lambda r: (r.gpu, _number(r.instance)))
        ordered = sorted(
            lease.devices, key=lambda g: (gpu_index.get(g.gpu_uuid, 0), mig_start.get(g.uuid, 0))
        )
        for grant, reading in zip(ordered, mine, strict=False):
            values = reading.values
            used, free = values.get("memory_used_mib"), values.get("memory_free_mib")
            mig = grant.kind == "mig"
            samples.append(
                Sample(
                    uuid=grant.uuid,
                    node=lease.node or reading.hostname,
                    gpu_index=gpu_index.get(grant.gpu_uuid, reading.gpu),
                    mig_profile=mig_profile.get(grant.uuid) if mig else None,
                    time=at,
                    gpu_utilization=values.get("engine_active" if mig else "gpu_utilization"),
                    memory_used_mib=used,
                    memory_total_mib=used + free if used is not None and free is not None else None,
                    temperature_c=None if mig else values.get("temperature_c"),
                    power_w=None if mig else values.get("power_w"),
                )
            )
    return samples


def _number(text: str) -> int:
    return int(text) if text.isdigit() else -1
