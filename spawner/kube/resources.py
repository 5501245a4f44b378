"""A lease's grants as Kubernetes resource limits: the node plus ``nvidia.com/gpu``, ``nvidia.com/mig-<profile>``
or the time-sliced shared resource, as the NVIDIA device plugin exposes them on that node (:mod:`.labels`).

The grants name synthetic devices (``k8s-<node>-gpu<i>``); only their kind and, for MIG, their profile matter
here, since the device plugin picks the physical device on the node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from ..pool.devices import Gpu, Node
from ..pool.state import Grant, OutsideUse
from .gfd import SHARING_STRATEGY, mig_profile, mig_resource
from .grant import MPS_MEMORY_LIMIT, KubeGrant
from .labels import GPU_RESOURCE, MIG_STRATEGY, SHARED_RESOURCE, SHARES_LABEL


class NotOnNode(ValueError):
    """A grant for a device the node does not have; the message names both."""


def kube_grant(node: Node, grants: Iterable[Grant], *, shared_resource: str = SHARED_RESOURCE) -> KubeGrant:
    """The node and limits for ``grants`` (a lease's devices) on ``node`` (the pool's node they are on).

    Whole GPUs become ``nvidia.com/gpu: N``; a MIG instance ``nvidia.com/mig-<profile>: 1`` under the mixed
    strategy and ``nvidia.com/gpu: 1`` under the single one (where the slices are the node's ``nvidia.com/gpu``);
    a share ``shared_resource: 1`` (one time-slicing or MPS replica), or ``nvidia.com/gpu: 1`` on a node whose
    shares kept that name.
    """
    shared_resource = node.labels.get(SHARES_LABEL, shared_resource)
    profiles = {m.uuid: m.profile for g in node.gpus for m in g.mig_instances}
    gpus = {g.uuid: g for g in node.gpus}
    single = node.labels.get(MIG_STRATEGY) == "single"
    limits: Counter[str] = Counter()
    for grant in grants:
        if grant.kind == "mig":
            if grant.uuid not in profiles:
                raise NotOnNode(f"grant {grant.uuid}: node {node.name} has no such MIG instance")
            limits[GPU_RESOURCE if single else mig_resource(profiles[grant.uuid])] += 1
        elif grant.kind in ("gpu", "share"):
            if grant.gpu_uuid not in gpus:
                raise NotOnNode(f"grant {grant.uuid}: node {node.name} has no such GPU")
            limits[GPU_RESOURCE if grant.kind == "gpu" else shared_resource] += 1
        else:
            raise ValueError(f"grant {grant.uuid}: kind must be gpu, mig or share, got {grant.kind!r}")
    environment, note = _share_memory_cap(node, [g for g in grants if g.kind == "share"], gpus)
    return KubeGrant(node.name, dict(sorted(limits.items())), environment, note)


def _share_memory_cap(node: Node, shares: list[Grant], gpus: Mapping[str, Gpu]) -> tuple[dict[str, str], str]:
    """A share's memory cap (its profile's ``memory_gb``): under MPS the pod's CUDA client is capped with
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` on its one device; under time-slicing nothing can cap it, and the
    grant says so."""
    capped = [g for g in shares if 0 < g.memory_mib < gpus[g.gpu_uuid].memory_mib]  # 0: no cap asked
    if not capped:
        return {}, ""
    cap = min(g.memory_mib for g in capped)
    if node.labels.get(SHARING_STRATEGY) == "mps":
        return {MPS_MEMORY_LIMIT: f"0={cap}M"}, ""
    return {}, f"its {cap // 1024} GiB GPU memory cap is not enforced: the GPU is time-sliced, so use no more"


def outside_use(
    node: Node, usage: Mapping[str, int], *, shared_resource: str = SHARED_RESOURCE
) -> OutsideUse:
    """What other workloads' pods hold on ``node`` (resource -> units, from :func:`.labels.external_usage`) in
    the pool's terms: ``nvidia.com/gpu`` is whole GPUs, or MIG instances of any profile under the single
    strategy; ``nvidia.com/mig-<profile>`` instances of that profile; the shared resource, GPU shares."""
    single = node.labels.get(MIG_STRATEGY) == "single"
    shared_resource = node.labels.get(SHARES_LABEL, shared_resource)
    shares = usage.get(shared_resource, 0)
    gpus = 0 if shared_resource == GPU_RESOURCE else usage.get(GPU_RESOURCE, 0)  # there, they are shares
    mig = {
        profile: count
        for resource, count in usage.items()
        if (profile := mig_profile(resource)) is not None and count > 0
    }
    if single and gpus:
        mig["*"] = gpus
    return OutsideUse(whole_gpus=0 if single else gpus, mig=mig, shares=shares)
