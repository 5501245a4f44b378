"""The environment that pins a process to its lease's devices: one definition for servers and jobs alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def device_env(visible_devices: str) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` for a lease's comma-joined ``GPU-…``/``MIG-…``
    UUIDs; a CPU-only lease gets no CUDA device (``""``) and the container runtime's ``void``, so neither CUDA
    nor a GPU-enabled container falls back to every GPU on the host."""
    return {"CUDA_VISIBLE_DEVICES": visible_devices, "NVIDIA_VISIBLE_DEVICES": visible_devices or "void"}


def lease_env(lease: Mapping[str, Any], service_url: str) -> dict[str, str]:
    """The environment pinning a server to ``lease`` (a service ``LeaseOut``): its device UUIDs, comma-joined,
    in ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES``; for a CPU-only lease no CUDA device and the
    container runtime's ``void``."""
    uuids = ",".join(str(device["uuid"]) for device in lease.get("devices") or ())
    return {
        **device_env(uuids),
        "GPUPOOL_LEASE_ID": str(lease["id"]),
        "GPUPOOL_SERVICE_URL": service_url,
        "GPUPOOL_PROFILE": str(lease["profile"]),
    }
