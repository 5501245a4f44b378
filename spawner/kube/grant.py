"""What a lease becomes on Kubernetes: a node and extended-resource limits.

The NVIDIA device plugin, not gpupool, chooses the physical device on the node; gpupool chooses the node and
the resource names (``nvidia.com/gpu``, ``nvidia.com/mig-3g.40gb``, a time-sliced shared resource), so that
placement stays fragmentation-aware while the kubelet keeps its own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KubeGrant:
    """The node a lease's pod must run on and the extended resources it requests (limits = requests)."""

    node: str
    limits: Mapping[str, int] = field(default_factory=dict)
