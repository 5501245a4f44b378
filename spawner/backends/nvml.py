"""Discover the GPUs of this host through NVML (``pynvml``, from nvidia-ml-py), read-only.

It yields domain records (:class:`Node`, :class:`Gpu`, :class:`MigInstance`) and nothing else: it never
changes a GPU setting or a MIG layout and never decides placement. A GPU that fails to answer is reported
UNHEALTHY with whatever could be read, so one bad device never hides the rest of the host from the pool.

The parts: whole GPUs here, :mod:`.nvml_mig` (MIG instances), :mod:`.nvml_access` (starting NVML, probing).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import replace
from types import ModuleType

from ..pool.devices import BACKEND_LABEL, Gpu, GpuMode, Node
from ..pool.products import UnknownProduct, normalize_product
from .nvml_access import MIB, NvmlUnavailable, Probe, gpu_count, start, stop, text
from .nvml_mig import mig_handles, mig_profile_for_nvml_id, read_mig

log = logging.getLogger(__name__)


def nvml_available(nvml: ModuleType | None = None) -> bool:
    """Whether NVML starts on this host, so a caller can pick a backend without handling exceptions."""
    try:
        module = start(nvml)
    except NvmlUnavailable as error:
        log.debug("NVML is not available: %s", error)
        return False
    stop(module)
    return True


def discover_node(
    name: str | None = None,
    *,
    nvml: ModuleType | None = None,
    cpu_milli: int | None = None,
    memory_mib: int | None = None,
) -> Node:
    """This host as a pool :class:`Node`: its CPUs, memory and every GPU NVML reports, with MIG instances.

    ``nvml`` replaces the ``pynvml`` module (tests pass a fake). Raises :class:`NvmlUnavailable` with a
    readable message when NVML cannot start; a GPU that cannot be read comes back UNHEALTHY instead.
    """
    node_name = name or socket.gethostname()
    module = start(nvml)
    try:
        gpus = _discover_gpus(module, node_name)
    finally:
        stop(module)
    return Node(
        name=node_name,
        cpu_milli=cpu_milli if cpu_milli is not None else (os.cpu_count() or 1) * 1000,
        memory_mib=memory_mib if memory_mib is not None else _host_memory_mib(),
        gpus=gpus,
        labels={BACKEND_LABEL: "nvml"},
    )


def read_utilization(nvml: ModuleType | None = None) -> dict[str, int | None]:
    """How busy each GPU and MIG device is (percent over NVML's last sample period), by UUID.

    NVML cannot say for MIG devices, a GPU in MIG mode or a failing GPU: those read None ("N/A"), never a
    fake 0 that would make a busy slice look idle.
    """
    module = start(nvml)
    busy: dict[str, int | None] = {}
    try:
        for index in range(gpu_count(module)):
            try:
                parent = module.nvmlDeviceGetHandleByIndex(index)
            except module.NVMLError as error:
                log.debug("GPU %d: %s", index, error)
                continue
            try:
                mig_on = int(module.nvmlDeviceGetMigMode(parent)[0]) == module.NVML_DEVICE_MIG_ENABLE
            except module.NVMLError:  # NotSupported on GPUs without MIG (L4, T4, V100): MIG is simply off
                mig_on = False
            for handle in (parent, *(mig_handles(module, parent, []) if mig_on else ())):
                try:
                    uuid = text(module.nvmlDeviceGetUUID(handle))
                except module.NVMLError:
                    continue
                try:
                    busy[uuid] = int(module.nvmlDeviceGetUtilizationRates(handle).gpu)
                except module.NVMLError:
                    busy[uuid] = None
    finally:
        stop(module)
    return busy


# ---- whole GPUs --------------------------------------------------------------------------------------------


def _discover_gpus(nvml: ModuleType, node_name: str) -> tuple[Gpu, ...]:
    try:
        driver = text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as error:
        log.warning("could not read the NVIDIA driver version: %s", error)
        driver = ""
    cuda = _cuda_version(nvml)
    read = [_read_gpu(nvml, index, driver, node_name) for index in range(gpu_count(nvml))]
    groups = _nvlink_groups(nvml, [(gpu.index, handle) for gpu, handle in read if handle is not None])
    return tuple(replace(gpu, nvlink_group=groups.get(gpu.index), cuda_version=cuda) for gpu, _ in read)


def _cuda_version(nvml: ModuleType) -> str:
    """The CUDA version the driver supports (``12040`` is ``"12.4"``: nvidia-smi's "CUDA Version"); ""
    when NVML cannot say."""
    try:
        encoded = int(nvml.nvmlSystemGetCudaDriverVersion())
    except nvml.NVMLError as error:
        log.warning("could not read the CUDA version the driver supports: %s", error)
        return ""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def _read_gpu(nvml: ModuleType, index: int, driver: str, node_name: str) -> tuple[Gpu, object | None]:
    """One GPU and its handle (None when even the handle could not be had)."""
    probe = Probe(nvml, f"GPU {index} on {node_name}")
    placeholder = f"GPU-unreadable-{node_name}-{index}"  # unique in the pool, and plainly not a real UUID
    handle = probe.read("device handle", nvml.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        return Gpu(placeholder, index, "unknown", 0, driver_version=driver, health=probe.health()), None
    uuid = text(probe.read("UUID", nvml.nvmlDeviceGetUUID, handle)) or placeholder
    raw_name = text(probe.read("name", nvml.nvmlDeviceGetName, handle))
    memory = probe.read("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
    memory_mib = int(memory.total) // MIB if memory is not None else 0
    capability = probe.read("capability", nvml.nvmlDeviceGetCudaComputeCapability, handle, optional=True)
    mig_mode = probe.read("MIG mode", nvml.nvmlDeviceGetMigMode, handle, optional=True)  # [current, pending]
    mig_on = mig_mode is not None and int(mig_mode[0]) == nvml.NVML_DEVICE_MIG_ENABLE
    product = _product(raw_name, memory_mib)
    instances = read_mig(probe, handle, uuid, product) if mig_on else ()
    gpu = Gpu(
        uuid=uuid,
        index=index,
        product=product,
        memory_mib=memory_mib,
        compute_capability=f"{int(capability[0])}.{int(capability[1])}" if capability else "",
        driver_version=driver,
        mode=GpuMode.MIG if mig_on else GpuMode.WHOLE,
        mig_instances=instances,
        health=probe.health(),
    )
    return gpu, handle


def _product(raw_name: str, memory_mib: int) -> str:
    """The canonical product, or NVML's own name for a GPU the pool does not know (still usable whole)."""
    if not raw_name:
        return "unknown"
    try:
        return normalize_product(raw_name, memory_mib or None)
    except UnknownProduct:
        log.info("GPU product %r is not one gpupool knows; using the name NVML reports", raw_name)
        return raw_name


def _nvlink_groups(nvml: ModuleType, handles: Sequence[tuple[int, object]]) -> dict[int, int]:
    """GPU index -> NVLink group: connected components of the NVLink P2P graph, numbered from 0 in GPU order.

    A GPU without NVLink peers, or on a driver that does not support the query, gets no group.
    """
    root = {index: index for index, _ in handles}

    def find(index: int) -> int:
        while root[index] != index:
            index = root[index]
        return index

    for a, (index_a, handle_a) in enumerate(handles):
        for index_b, handle_b in handles[a + 1 :]:
            try:
                status = nvml.nvmlDeviceGetP2PStatus(handle_a, handle_b, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
            except nvml.NVMLError as error:
                log.debug("NVLink status of GPUs %d and %d unknown: %s", index_a, index_b, error)
                continue
            if int(status) == nvml.NVML_P2P_STATUS_OK:
                root[find(index_b)] = find(index_a)
    members: dict[int, list[int]] = {}
    for index, _ in handles:
        members.setdefault(find(index), []).append(index)
    groups: dict[int, int] = {}
    for number, component in enumerate(c for c in sorted(members.values()) if len(c) > 1):
        groups.update(dict.fromkeys(component, number))
    return groups


def _host_memory_mib() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MIB


__all__ = [
    "NvmlUnavailable",
    "discover_node",
    "mig_profile_for_nvml_id",
    "nvml_available",
    "read_utilization",
]
