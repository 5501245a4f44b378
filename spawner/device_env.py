"""The environment that pins a process to its lease's devices: one definition for servers and jobs alike."""

from __future__ import annotations


def device_env(visible_devices: str) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` for a lease's comma-joined ``GPU-…``/``MIG-…``
    UUIDs; a CPU-only lease gets no CUDA device (``""``) and the container runtime's ``void``, so neither CUDA
    nor a GPU-enabled container falls back to every GPU on the host."""
    return {"CUDA_VISIBLE_DEVICES": visible_devices, "NVIDIA_VISIBLE_DEVICES": visible_devices or "void"}
