"""The MIG instances of a GPU in MIG mode, read from NVML: their devices, and each one's profile and start
slot, from the GPU instances where the driver lets gpupool read them, else from the device names and the
product's legal placements."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType

from ..pool import mig
from ..pool.devices import MigInstance
from .nvml_access import MIB, Probe, log, text

# "NVIDIA H100 80GB HBM3 MIG 3g.40gb": the name NVML gives a MIG device (driver >= R470).
MIG_NAME = re.compile(r"\bMIG\s+(\d+g\.\d+gb(?:\+[a-z]+)?)\s*$")


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


@dataclass
class _Seen:
    """A MIG device as NVML showed it, before its profile and start are settled."""

    uuid: str
    name_profile: str | None
    memory_mib: int | None
    profile_id: int | None = None
    start: int | None = None
    gi_id: int | None = None  # the GPU instance's id


def read_mig(probe: Probe, parent: object, parent_uuid: str, product: str) -> tuple[MigInstance, ...]:
    """The MIG instances configured on a GPU, from its GPU instances or, failing that, its device names."""
    nvml = probe.nvml
    seen: list[_Seen] = []
    instance_error: str | None = None
    for handle in mig_handles(nvml, parent, probe.problems):
        uuid = text(probe.read("MIG device UUID", nvml.nvmlDeviceGetUUID, handle))
        if not uuid:
            continue
        name = text(probe.read(f"{uuid} name", nvml.nvmlDeviceGetName, handle))
        memory = probe.read(f"{uuid} memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        match = MIG_NAME.search(name)
        item = _Seen(uuid, match.group(1) if match else None, int(memory.total) // MIB if memory else None)
        try:  # needs privileges on some drivers: NoPermission / NotSupported
            item.gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
            instance = nvml.nvmlDeviceGetGpuInstanceById(parent, item.gi_id)
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


def mig_handles(nvml: ModuleType, parent: object, problems: list[str]) -> list[object]:
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


def _settle(probe: Probe, seen: list[_Seen], parent_uuid: str, product: str) -> tuple[MigInstance, ...]:
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
            gpu_instance_id=item.gi_id,
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
