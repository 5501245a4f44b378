"""A node's GPU devices handed to containers, as the NVIDIA device plugin does: free devices of the node's
pool file for a container's ``nvidia.com/…`` limits, taken back when its pod ends."""

from __future__ import annotations

from typing import Any


class NodeDevices:
    """The free and allocated devices (``GPU-…`` and ``MIG-…`` UUIDs) of one node, by extended resource."""

    def __init__(self, node: str, devices: dict[str, list[str]] | None = None) -> None:
        self.node = node
        self.free = {resource: list(uuids) for resource, uuids in (devices or {}).items()}
        self.allocated: dict[str, list[tuple[str, str]]] = {}  # pod uid -> (resource, device) pairs

    def allocate(self, uid: str, container: dict[str, Any]) -> list[str]:
        """Devices for the container's ``nvidia.com/…`` limits, as the device plugin would pick them."""
        limits = container.get("resources", {}).get("limits", {})
        taken: list[str] = []
        for resource, count in limits.items():
            free = self.free.get(resource)
            if free is None:
                continue
            wanted = int(count)
            if len(free) < wanted:
                raise ValueError(f"{resource}: {wanted} asked for, {len(free)} free on {self.node}")
            for _ in range(wanted):
                device = free.pop(0)
                self.allocated.setdefault(uid, []).append((resource, device))
                taken.append(device)
        return taken

    def release(self, uid: str) -> None:
        for resource, device in self.allocated.pop(uid, []):
            self.free[resource].append(device)
