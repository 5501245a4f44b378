"""What a lease becomes on Kubernetes: a node and extended-resource limits.

The NVIDIA device plugin, not gpupool, chooses the physical device on the node; gpupool chooses the node and
the resource names (``nvidia.com/gpu``, ``nvidia.com/mig-3g.40gb``, a time-sliced shared resource), so that
placement stays fragmentation-aware while the kubelet keeps its own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"  # an MPS client's device memory cap, "0=6144M"


@dataclass(frozen=True)
class KubeGrant:
    """The node a lease's pod must run on and the extended resources it requests (limits = requests).

    ``environment`` is what the pod's container needs besides (an MPS share's memory cap); ``note`` says in
    words what the user should know of the grant (a share's memory cap that nothing enforces)."""

    node: str
    limits: Mapping[str, int] = field(default_factory=dict)
    environment: Mapping[str, str] = field(default_factory=dict)
    note: str = ""
