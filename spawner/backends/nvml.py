"""Discover the GPUs of this host through NVML (``pynvml``, from nvidia-ml-py), read-only.

It yields domain records (:class:`Node`, :class:`Gpu`, :class:`MigInstance`) and nothing else: it never
changes a GPU setting or a MIG layout and never decides placement. A GPU that fails to answer is reported
UNHEALTHY with whatever could be read, so one bad device never hides the rest of the host from the pool.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from ..pool import mig
from ..pool.devices import Gpu, GpuMode, Health, MigInstance, Node
from ..pool.products import UnknownProduct, normalize_product
from .simulated import BACKEND_LABEL

log = logging.getLogger(__name__)

_MIB = 2**20
# "NVIDIA H100 80GB HBM3 MIG 3g.40gb": the name NVML gives a MIG device (driver >= R470).
_MIG_NAME = re.compile(r"\bMIG\s+(\d+g\.\d+gb(?:\+[a-z]+)?)\s*$")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host (no driver, driver not loaded, no pynvml); the message says which."""


def nvml_available(nvml: ModuleType | None = None) -> bool:
    """Whether NVML starts on this host, so a caller can pick a backend without handling exceptions."""
    try:
        module = _start(nvml)
    except NvmlUnavailable as error:
        log.debug("NVML is not available: %s", error)
        return False
    _stop(module)
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
    module = _start(nvml)
    try:
        gpus = _discover_gpus(module, node_name)
    finally:
        _stop(module)
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
    module = _start(nvml)
    busy: dict[str, int | None] = {}
    try:
        for index in range(_count(module)):
            try:
                parent = module.nvmlDeviceGetHandleByIndex(index)
            except module.NVMLError as error:
                log.debug("GPU %d: %s", index, error)
                continue
            try:
                mig_on = int(module.nvmlDeviceGetMigMode(parent)[0]) == module.NVML_DEVICE_MIG_ENABLE
            except module.NVMLError:  # NotSupported on GPUs without MIG (L4, T4, V100): MIG is simply off
                mig_on = False
            for handle in (parent, *(_mig_handles(module, parent, []) if mig_on else ())):
                try:
                    uuid = _text(module.nvmlDeviceGetUUID(handle))
                except module.NVMLError:
                    continue
                try:
                    busy[uuid] = int(module.nvmlDeviceGetUtilizationRates(handle).gpu)
                except module.NVMLError:
                    busy[uuid] = None
    finally:
        _stop(module)
    return busy


def mig_profile_for_nvml_id(product: str, profile_id: int) -> mig.MigProfile:
    """The product's MIG profile with this NVML GPU-instance profile id (``nvidia-smi mig -lgip``, column ID).

    NVML names a GPU instance's profile by id; the pool speaks profile names such as ``3g.40gb``.
    """
    geo = mig.geometry(product)
    for profile in geo.profiles.values():
        if profile.shape.nvml_profile_id == profile_id:
            return profile
    known = ", ".join(f"{p.name}={p.shape.nvml_profile_id}" for p in geo.profiles.values())
    raise mig.UnknownMigProfile(f"{geo.product} has no MIG profile with NVML id {profile_id}; ids: {known}")


# ---- starting and stopping NVML ----------------------------------------------------------------------------


def _start(nvml: ModuleType | None) -> ModuleType:
    """Import pynvml (unless given) and initialise it; every way this fails becomes one readable error."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError as error:
            raise NvmlUnavailable(
                f"The nvidia-ml-py package (module pynvml) is not installed: {error}; "
                "install it with `pip install nvidia-ml-py`"
            ) from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound as error:
        raise NvmlUnavailable(f"No NVIDIA driver found (libnvidia-ml.so is missing): {error}") from None
    except nvml.NVMLError_DriverNotLoaded as error:
        raise NvmlUnavailable(f"The NVIDIA driver is installed but not loaded: {error}") from None
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML could not start: {error}") from None
    return nvml


def _stop(nvml: ModuleType) -> None:
    """Shut NVML down; a failure here must not hide what discovery found, so it is only logged."""
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as error:
        log.warning("nvmlShutdown failed: %s", error)


# ---- whole GPUs --------------------------------------------------------------------------------------------


@dataclass
class _Probe:
    """Reads one GPU call by call, recording failures (the GPU is then unhealthy) instead of raising them."""

    nvml: ModuleType
    label: str
    problems: list[str] = field(default_factory=list)
    lost: bool = False

    def read(self, what: str, call: Callable[..., Any], *args: Any, optional: bool = False) -> Any:
        """``call(*args)``, or None when it fails; ``optional`` calls may be NotSupported without harm."""
        if self.lost:
            return None
        try:
            return call(*args)
        except self.nvml.NVMLError_NotSupported as error:
            if not optional:
                self.problems.append(f"{what}: {error}")
        except self.nvml.NVMLError_GpuIsLost as error:
            self.lost = True
            self.problems.append(f"{what}: {error}")
        except self.nvml.NVMLError as error:
            self.problems.append(f"{what}: {error}")
        return None

    def health(self) -> Health:
        """The verdict once every read is done: any failure makes the GPU unhealthy, and says why."""
        if self.problems:
            log.warning("%s is unhealthy: %s", self.label, "; ".join(self.problems))
        return Health.UNHEALTHY if self.problems else Health.HEALTHY


def _count(nvml: ModuleType) -> int:
    try:
        return int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML started but could not count the GPUs: {error}") from None


def _discover_gpus(nvml: ModuleType, node_name: str) -> tuple[Gpu, ...]:
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as error:
        log.warning("could not read the NVIDIA driver version: %s", error)
        driver = ""
    read = [_read_gpu(nvml, index, driver, node_name) for index in range(_count(nvml))]
    groups = _nvlink_groups(nvml, [(gpu.index, handle) for gpu, handle in read if handle is not None])
    return tuple(replace(gpu, nvlink_group=groups.get(gpu.index)) for gpu, _ in read)


def _read_gpu(nvml: ModuleType, index: int, driver: str, node_name: str) -> tuple[Gpu, object | None]:
    """One GPU and its handle (None when even the handle could not be had)."""
    probe = _Probe(nvml, f"GPU {index} on {node_name}")
    placeholder = f"GPU-unreadable-{node_name}-{index}"  # unique in the pool, and plainly not a real UUID
    handle = probe.read("device handle", nvml.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        return Gpu(placeholder, index, "unknown", 0, driver_version=driver, health=probe.health()), None
    uuid = _text(probe.read("UUID", nvml.nvmlDeviceGetUUID, handle)) or placeholder
    raw_name = _text(probe.read("name", nvml.nvmlDeviceGetName, handle))
    memory = probe.read("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
    memory_mib = int(memory.total) // _MIB if memory is not None else 0
    capability = probe.read("capability", nvml.nvmlDeviceGetCudaComputeCapability, handle, optional=True)
    mig_mode = probe.read("MIG mode", nvml.nvmlDeviceGetMigMode, handle, optional=True)  # [current, pending]
    mig_on = mig_mode is not None and int(mig_mode[0]) == nvml.NVML_DEVICE_MIG_ENABLE
    product = _product(raw_name, memory_mib)
    instances = _read_mig(probe, handle, uuid, product) if mig_on else ()
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


# ---- MIG instances -----------------------------------------------------------------------------------------


@dataclass
class _Seen:
    """A MIG device as NVML showed it, before its profile and start are settled."""

    uuid: str
    name_profile: str | None
    memory_mib: int | None
    profile_id: int | None = None
    start: int | None = None


def _read_mig(probe: _Probe, parent: object, parent_uuid: str, product: str) -> tuple[MigInstance, ...]:
    """The MIG instances configured on a GPU, from its GPU instances or, failing that, its device names."""
    nvml = probe.nvml
    seen: list[_Seen] = []
    instance_error: str | None = None
    for handle in _mig_handles(nvml, parent, probe.problems):
        uuid = _text(probe.read("MIG device UUID", nvml.nvmlDeviceGetUUID, handle))
        if not uuid:
            continue
        name = _text(probe.read(f"{uuid} name", nvml.nvmlDeviceGetName, handle))
        memory = probe.read(f"{uuid} memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        match = _MIG_NAME.search(name)
        item = _Seen(uuid, match.group(1) if match else None, int(memory.total) // _MIB if memory else None)
        try:  # needs privileges on some drivers: NoPermission / NotSupported
            instance = nvml.nvmlDeviceGetGpuInstanceById(parent, nvml.nvmlDeviceGetGpuInstanceId(handle))
            info = nvml.nvmlGpuInstanceGetInfo(instance)
            item.profile_id, item.start = int(info.profileId), int(info.placement.start)
        except nvml.NVMLError as error:
            instance_error = str(error)
        seen.append(item)
    if instance_error is not None:
        log.info(
            "%s: GPU instances could not be read (%s); MIG profiles come from device names and start slots "
            "are inferred from the product's legal placements",
            probe.label,
            instance_error,
        )
    else:
        log.debug("%s: MIG layout read from NVML GPU instances", probe.label)
    return _settle(probe, seen, parent_uuid, product)


def _mig_handles(nvml: ModuleType, parent: object, problems: list[str]) -> list[object]:
    """The MIG devices of a GPU in MIG mode, skipping empty slots; other failures are added to ``problems``."""
    try:
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))
    except nvml.NVMLError as error:
        problems.append(f"MIG device count: {error}")
        return []
    handles: list[object] = []
    for slot in range(slots):
        try:
            handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot))
        except nvml.NVMLError_NotFound:
            continue  # an empty slot: fewer instances than the GPU could hold
        except nvml.NVMLError as error:
            problems.append(f"MIG device {slot}: {error}")
    return handles


def _settle(probe: _Probe, seen: list[_Seen], parent_uuid: str, product: str) -> tuple[MigInstance, ...]:
    """Name each instance's profile and start slot. An instance the pool cannot reason about is dropped and
    the GPU marked unhealthy, so nothing is ever placed over it."""
    try:
        geo = mig.geometry(product)
    except mig.NotMigCapable:
        if seen:
            probe.problems.append(f"MIG instances on {product}, a product without known MIG geometry")
        return ()
    named: list[tuple[_Seen, str]] = []
    for item in seen:
        by_id = _profile_name(geo, item.profile_id)
        profile = item.name_profile or by_id
        if by_id and by_id != profile:  # the driver's own name wins over gpupool's table of ids
            note = (
                f"NVML profile id {item.profile_id} is {by_id} in gpupool's table; the driver says {profile}"
            )
            log.warning("%s: %s: %s", probe.label, item.uuid, note)
        if profile in geo.profiles:
            named.append((item, profile))
        else:
            problem = f"profile {profile or item.profile_id} is not a {geo.product} profile"
            probe.problems.append(f"MIG device {item.uuid}: {problem}")
    starts = {item.uuid: item.start for item, _ in named if item.start is not None}
    guess = [(item, profile) for item, profile in named if item.start is None]
    if guess:
        known = [mig.Placement(item.start, profile) for item, profile in named if item.start is not None]
        inferred = list(mig.fit(geo, [profile for _, profile in guess], existing=known) or ())
        if not inferred:
            probe.problems.append(f"{', '.join(p for _, p in guess)}: no legal placement on {geo.product}")
        for item, profile in guess if inferred else ():
            spot = next(p for p in inferred if p.profile == profile)
            inferred.remove(spot)
            starts[item.uuid] = spot.start
    instances = (
        MigInstance(
            uuid=item.uuid,
            profile=profile,
            start=starts[item.uuid],
            memory_mib=item.memory_mib or mig.profile_memory_gb(profile) * 1024,
            parent_uuid=parent_uuid,
        )
        for item, profile in named
        if item.uuid in starts
    )
    return tuple(sorted(instances, key=lambda instance: (instance.start, instance.uuid)))


def _profile_name(geo: mig.Geometry, profile_id: int | None) -> str | None:
    try:
        return None if profile_id is None else mig_profile_for_nvml_id(geo.product, profile_id).name
    except mig.UnknownMigProfile:
        return None


# ---- small helpers -----------------------------------------------------------------------------------------


def _text(value: object) -> str:
    """NVML strings: str from nvidia-ml-py >= 11.515, bytes from older releases, None when unread."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _host_memory_mib() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // _MIB


__all__ = [
    "NvmlUnavailable",
    "discover_node",
    "mig_profile_for_nvml_id",
    "nvml_available",
    "read_utilization",
]
