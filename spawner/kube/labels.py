"""The pool as Kubernetes describes it: Node objects with GPU Feature Discovery labels become domain nodes, and
Pods' extended-resource requests become usage per node. Pure: plain dicts in (as the API returns them), domain
records out.

What a node's labels and allocatable resources say, and what gpupool makes of it:

- ``nvidia.com/gpu.product`` (``NVIDIA-H100-80GB-HBM3``; under the single strategy ``…-MIG-1g.10gb``),
  ``nvidia.com/gpu.memory`` (MiB), ``nvidia.com/gpu.count``, ``nvidia.com/gpu.compute.major/minor`` and
  ``nvidia.com/cuda.driver.major/minor/rev`` describe the node's physical GPUs.
- ``nvidia.com/mig.strategy``: ``none`` (or absent): every GPU is whole; ``mixed``: allocatable
  ``nvidia.com/gpu`` counts the whole GPUs and each ``nvidia.com/mig-<profile>`` the MIG instances of that
  profile, on the remaining GPUs; ``single``: every GPU is split the same way and the instances are counted
  as ``nvidia.com/gpu``.
- A time-sliced shared resource (``nvidia.com/gpu.shared`` by default) in allocatable makes the node's
  non-MIG GPUs shared, each by ``allocatable / GPUs`` holders (the time-slicing replicas). With the device
  plugin's default ``renameByDefault: false`` there is no such resource: GFD's
  ``nvidia.com/gpu.sharing-strategy`` (``time-slicing`` or ``mps``) says the GPUs are shared, and
  ``nvidia.com/gpu`` then counts shares (``gpu.count`` × ``gpu.replicas``), never whole GPUs. Which name a
  node's shares go by is kept in its ``gpupool.io/shared-resource`` label for :mod:`.resources`.
- MIG profiles with attributes (``1g.10gb+me``) are served as ``nvidia.com/mig-1g.10gb.me``.
- ``gpupool.io/simulated=true``, which only gpupool's stand-in kubelet sets (``gpupool kube up``), stays on the
  domain node: its GPUs are labelled simulated wherever they show. A real cluster's nodes lack it.

Kubernetes counts MIG instances per node, not per GPU, and the NVIDIA device plugin, not gpupool, picks the
physical device. So gpupool lays the counted instances onto the MIG GPUs in legal placements
(:mod:`..pool.mig`), gives every device a synthetic stable UUID (``k8s-<node>-gpu<i>``,
``k8s-<node>-<profile>-<n>``), and places by node and resource name only (:mod:`.resources`).

The parts: :mod:`.gfd` (the label and resource names, quantities), :mod:`.node_gpus` (a node's GPUs),
:mod:`.mig_layout` (MIG instances onto GPUs) and :mod:`.pod_usage` (what pods hold).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..pool import mig
from ..pool.devices import BACKEND_LABEL, Node
from .gfd import (
    GPU_RESOURCE,
    MIG_CONFIG_STATE,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY,
    SHARED_RESOURCE,
    SHARING_STRATEGY,
    STRATEGIES,
    NodeLabelError,
    as_list,
    as_mapping,
    cpu_milli,
    memory_mib,
)
from .node_gpus import node_gpus
from .pod_usage import external_usage

SHARES_LABEL = "gpupool.io/shared-resource"  # set by parse_node: the resource this node's GPU shares go by

# Taints GPU nodes carry on purpose and gpupool's pods tolerate; any other NoSchedule/NoExecute taint keeps
# new work off the node.
TOLERATED_TAINTS = frozenset({GPU_RESOURCE})
_BAD_MIG_STATES = {
    "failed": "its MIG reconfiguration failed (nvidia.com/mig.config.state=failed)",
    "pending": "its MIG reconfiguration is pending (nvidia.com/mig.config.state=pending)",
    "rebooting": "it is rebooting to apply a MIG configuration (nvidia.com/mig.config.state=rebooting)",
}


@dataclass(frozen=True)
class KubeNode:
    """A Kubernetes node as gpupool sees it: the domain node, how its GPUs are exposed, and whether new work
    may go there (``problem`` says why not, in words; None when it may)."""

    node: Node
    mig_strategy: str
    problem: str | None


def parse_node(obj: Mapping[str, Any], *, shared_resource: str = SHARED_RESOURCE) -> KubeNode:
    """The domain node for a Node object; :class:`NodeLabelError` when its GPU labels contradict each other.

    The domain node is always built HEALTHY: health changes while the service runs, so it is applied through
    the lease manager's health marks (``problem``), never baked into the pool's fixed node list.
    """
    metadata = as_mapping(obj.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise NodeLabelError(f"a Node without metadata.name: {str(obj)[:200]}")
    labels = {str(k): str(v) for k, v in as_mapping(metadata.get("labels")).items()}
    status = as_mapping(obj.get("status"))
    allocatable = {str(k): str(v) for k, v in as_mapping(status.get("allocatable")).items()}
    where = f"node {name}"
    strategy = labels.get(MIG_STRATEGY, "none") or "none"
    if strategy not in STRATEGIES:
        raise NodeLabelError(
            f"{where}: {MIG_STRATEGY} must be one of {', '.join(STRATEGIES)}, got {strategy!r}"
        )
    shares = _shares_resource(labels, allocatable, shared_resource)
    try:
        gpus = node_gpus(name, labels, allocatable, strategy, shares)
    except (mig.UnknownMigProfile, mig.NotMigCapable) as error:  # one odd node, not the whole pool
        raise NodeLabelError(f"{where}: {error}") from None
    node = Node(
        name=name,
        cpu_milli=cpu_milli(allocatable.get("cpu", "0"), f"{where}: status.allocatable.cpu"),
        memory_mib=memory_mib(allocatable.get("memory", "0"), f"{where}: status.allocatable.memory"),
        gpus=gpus,
        labels=labels | {BACKEND_LABEL: "kubernetes", SHARES_LABEL: shares},
    )
    return KubeNode(node, strategy, node_problem(obj))


def _shares_resource(labels: Mapping[str, str], allocatable: Mapping[str, str], configured: str) -> str:
    """The resource a node's GPU shares go by: the configured one (``renameByDefault: true`` or a site's own
    name), or ``nvidia.com/gpu`` itself when GFD says the GPUs are shared and no such resource is served."""
    if labels.get(SHARING_STRATEGY) in ("time-slicing", "mps") and configured not in allocatable:
        return GPU_RESOURCE
    return configured


def node_problem(obj: Mapping[str, Any]) -> str | None:
    """Why no new work may go to this node now (NotReady, cordoned, tainted, MIG being reconfigured), as one
    sentence; None when it may."""
    reasons: list[str] = []
    conditions = [c for c in as_list(as_mapping(obj.get("status")).get("conditions")) if isinstance(c, dict)]
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        reasons.append("it reports no Ready condition")
    elif ready.get("status") != "True":
        said = ": ".join(str(ready[k]) for k in ("reason", "message") if ready.get(k))
        state = (
            "NotReady" if ready.get("status") == "False" else "in an unknown state (its kubelet is silent)"
        )
        reasons.append(f"it is {state}" + (f" ({said})" if said else ""))
    spec = as_mapping(obj.get("spec"))
    if spec.get("unschedulable"):
        reasons.append("it is cordoned (spec.unschedulable)")
    for taint in as_list(spec.get("taints")):
        if not isinstance(taint, dict) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        key = str(taint.get("key", ""))
        if key in TOLERATED_TAINTS or (
            key == "node.kubernetes.io/unschedulable" and spec.get("unschedulable")
        ):
            continue
        value = f"={taint['value']}" if taint.get("value") else ""
        reasons.append(f"it has the taint {key}{value}:{taint['effect']}")
    labels = as_mapping(as_mapping(obj.get("metadata")).get("labels"))
    state = str(labels.get(MIG_CONFIG_STATE, ""))
    if state in _BAD_MIG_STATES:
        reasons.append(_BAD_MIG_STATES[state])
    return "; ".join(reasons) or None


__all__ = [
    "GPU_RESOURCE",
    "MIG_RESOURCE_PREFIX",
    "MIG_STRATEGY",
    "SHARED_RESOURCE",
    "KubeNode",
    "NodeLabelError",
    "external_usage",
    "node_problem",
    "parse_node",
]
