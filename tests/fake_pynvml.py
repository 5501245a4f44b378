"""A stand-in for the ``pynvml`` module (nvidia-ml-py 13.x) describing a host, for machines without GPUs.

It behaves like the real module wherever a caller can tell: the real constants and exception classes, so
``except pynvml.NVMLError_NotFound`` works; opaque handles; the real ctypes result structures; ``str`` results
(``bytes`` with ``legacy_bytes=True``, as nvidia-ml-py < 11.515 gave); ``Uninitialized`` before ``nvmlInit``;
``NotFound`` for empty MIG slots; ``NotSupported`` for utilisation of MIG devices and GPUs in MIG mode, and
for temperature, power and clocks of MIG devices. Telemetry: GPM (``nvmlGpm*``, on GPUs that support it:
compute capability 9.0 and newer unless ``gpm`` says otherwise) with real ``c_nvmlGpmSample_t`` buffers, and
XID errors through event sets (``xids`` waits to be delivered).
MIG profile ids come from NVIDIA's tables here, independently of ``gpupool.spawner.pool.mig``, so the
backend's mapping is checked rather than echoed.
"""

from __future__ import annotations

import ctypes
import re
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from ctypes import c_uint
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pynvml as real

# NVML GPU-instance profile ids (``nvidia-smi mig -lgip``, column ID) of 8-slice GPUs (A100, H100, H200),
# keyed by (compute slices, memory slices, "+me").
_PROFILE_IDS = {(1, 1, False): 19, (1, 1, True): 20, (1, 2, False): 15, (2, 2, False): 14, (3, 4, False): 9}
_PROFILE_IDS |= {(4, 4, False): 5, (7, 8, False): 0}
_MAX_MIG_DEVICES = 7


@dataclass
class FakeGpu:
    """One GPU as the fake driver reports it.

    ``mig``: None for MIG off, else the instances as ``"3g.40gb@4"`` (profile at memory slice), listed in
    MIG device index order; a None entry is an empty index. ``errors`` maps an NVML function name to the
    NVML error code it raises for this GPU (its handle, MIG devices or GPU instances).
    """

    name: str
    memory_gib: float = 80
    mig: Sequence[str | None] | None = None
    uuid: str | None = None
    memory_mib: int | None = None  # the exact total NVML reports; default memory_gib * 1024
    compute_capability: tuple[int, int] = (9, 0)
    mig_capable: bool = True
    utilization: int = 0
    lost: bool = False  # fell off the bus: the handle is given, every query on it raises GpuIsLost
    errors: Mapping[str, int] = field(default_factory=dict)
    # Telemetry. MIG instances are keyed by their start memory slice (the "@4" of "3g.40gb@4").
    memory_utilization: int = 0
    memory_used_mib: int = 0
    temperature_c: int = 34
    power_mw: int = 71_000
    power_limit_mw: int = 700_000
    sm_clock_mhz: int = 1980
    ecc: tuple[int, int] | None = (0, 0)  # (corrected, uncorrected); None: ECC off, NotSupported
    gpm: bool | None = None  # GPM support; None: as real drivers, from compute capability 9.0 on
    mig_utilization: dict[int, float] = field(default_factory=dict)
    mig_memory_utilization: dict[int, float] = field(default_factory=dict)
    mig_memory_used_mib: dict[int, int] = field(default_factory=dict)
    xids: list[tuple[int, int]] = field(default_factory=list)  # (XID code, GPU instance id or 0xFFFFFFFF)
    events: bool = True  # whether XID events can be registered (False: NotSupported)

    @property
    def gpm_supported(self) -> bool:
        return self.gpm if self.gpm is not None else self.compute_capability >= (9, 0)

    @property
    def total_mib(self) -> int:
        return self.memory_mib if self.memory_mib is not None else round(self.memory_gib * 1024)


def a100_40gb(mig: Sequence[str | None] | None = None, **extra: Any) -> FakeGpu:
    return FakeGpu("NVIDIA A100-SXM4-40GB", 40, mig, memory_mib=40960, compute_capability=(8, 0), **extra)


def a100_80gb(mig: Sequence[str | None] | None = None, **extra: Any) -> FakeGpu:
    return FakeGpu("NVIDIA A100-SXM4-80GB", 80, mig, memory_mib=81920, compute_capability=(8, 0), **extra)


def h100_80gb(mig: Sequence[str | None] | None = None, **extra: Any) -> FakeGpu:
    return FakeGpu("NVIDIA H100 80GB HBM3", 80, mig, memory_mib=81559, compute_capability=(9, 0), **extra)


def h200(mig: Sequence[str | None] | None = None, **extra: Any) -> FakeGpu:
    return FakeGpu("NVIDIA H200", 141, mig, memory_mib=143771, compute_capability=(9, 0), **extra)


class _Handle:
    """An opaque device handle, like ``c_nvmlDevice_t``: callers may only pass it back."""

    __slots__ = ("_gpu", "_index", "_mig")

    def __init__(self, gpu: FakeGpu, index: int, mig: _Mig | None = None) -> None:
        self._gpu, self._index, self._mig = gpu, index, mig

    def __repr__(self) -> str:
        return "<fake c_nvmlDevice_t>"


class _GpuInstance:
    """An opaque GPU-instance handle, like ``c_nvmlGpuInstance_t``."""

    __slots__ = ("_mig",)

    def __init__(self, mig: _Mig) -> None:
        self._mig = mig


@dataclass(frozen=True)
class _Mig:
    gpu: FakeGpu
    profile: str
    start: int
    slices: int
    profile_id: int
    uuid: str

    @property
    def gi_id(self) -> int:
        return self.start + 1  # deliberately not the MIG device index


@dataclass
class FakeState:
    """What the fake saw: for tests that check initialisation and shutdown."""

    refcount: int = 0
    inits: int = 0
    shutdowns: int = 0
    calls: list[str] = field(default_factory=list)


def _error(code: int) -> Exception:
    return real.NVMLError(code)  # type: ignore[no-any-return]


def _parse_profile(profile: str, gpu: FakeGpu) -> tuple[int, int]:
    """(memory slices, NVML profile id) of a profile name such as ``1g.20gb`` on this GPU."""
    match = re.fullmatch(r"(\d+)g\.(\d+)gb(\+me)?", profile)
    if not match:
        raise ValueError(f"not a MIG profile name: {profile!r}")
    compute, memory_gb = int(match.group(1)), int(match.group(2))
    slices = min((1, 2, 4, 8), key=lambda s: abs(s - memory_gb * 8 / (gpu.total_mib / 1024)))
    key = (compute, slices, bool(match.group(3)))
    if key not in _PROFILE_IDS:
        raise ValueError(f"{profile} is no MIG profile of {gpu.name}")
    return slices, _PROFILE_IDS[key]


def _layout(gpu: FakeGpu, index: int) -> list[_Mig | None]:
    used: set[int] = set()
    slots: list[_Mig | None] = []
    for entry in gpu.mig or ():
        if entry is None:
            slots.append(None)
            continue
        profile, _, start_text = entry.partition("@")
        start = int(start_text or 0)
        slices, profile_id = _parse_profile(profile, gpu)
        covered = set(range(start, start + slices))
        if covered & used or start + slices > 8:
            raise ValueError(f"{entry} does not fit on {gpu.name} next to {gpu.mig}")
        used |= covered
        mig_uuid = f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'{gpu.uuid}/{index}/{start}')}"
        slots.append(_Mig(gpu, profile, start, slices, profile_id, mig_uuid))
    return slots


def fake_pynvml(
    gpus: Sequence[FakeGpu] = (),
    *,
    driver: str = "550.54.15",
    cuda: int = 12040,
    nvlink: Iterable[Iterable[int]] = (),
    init_error: int | None = None,
    p2p_error: int | None = None,
    legacy_bytes: bool = False,
) -> ModuleType:
    """A module that answers like ``pynvml`` on a host with these GPUs.

    ``nvlink``: groups of GPU indices joined by NVLink. ``init_error``: the NVML error code ``nvmlInit``
    raises (no library, driver not loaded). ``p2p_error``: the code ``nvmlDeviceGetP2PStatus`` raises.
    """
    gpus = list(gpus)
    for index, gpu in enumerate(gpus):
        gpu.uuid = gpu.uuid or f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'fake-gpu/{gpu.name}/{index}')}"
    layouts = [_layout(gpu, index) for index, gpu in enumerate(gpus)]
    linked = {(a, b) for group in nvlink for a in group for b in group if a != b}
    state = FakeState()
    module = ModuleType("pynvml", "Fake pynvml: see tests/fake_pynvml.py")
    for name in dir(real):
        if name.startswith(("NVML_", "NVMLError", "NVMLLibraryMismatchError", "c_nvml")):
            setattr(module, name, getattr(real, name))

    def text(value: str) -> str | bytes:
        return value.encode() if legacy_bytes else value

    def check(function: str, handle: object = None, *, parent_only: bool = False) -> FakeGpu | None:
        state.calls.append(function)
        if state.refcount == 0:
            raise _error(real.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        if not isinstance(handle, _Handle | _GpuInstance):
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = handle._mig.gpu if isinstance(handle, _GpuInstance) else handle._gpu
        if gpu.lost:
            raise _error(real.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.errors:
            raise _error(gpu.errors[function])
        if parent_only and isinstance(handle, _Handle) and handle._mig is not None:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def api(function: Callable[..., Any]) -> Callable[..., Any]:
        setattr(module, function.__name__, function)
        return function

    @api
    def nvmlInit() -> None:
        state.calls.append("nvmlInit")
        if init_error is not None:
            raise _error(init_error)
        state.refcount += 1
        state.inits += 1

    @api
    def nvmlShutdown() -> None:
        check("nvmlShutdown")
        state.refcount -= 1
        state.shutdowns += 1

    @api
    def nvmlSystemGetDriverVersion() -> str | bytes:
        check("nvmlSystemGetDriverVersion")
        return text(driver)

    @api
    def nvmlSystemGetCudaDriverVersion() -> int:
        check("nvmlSystemGetCudaDriverVersion")
        return cuda

    @api
    def nvmlDeviceGetCount() -> int:
        check("nvmlDeviceGetCount")
        return len(gpus)

    @api
    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(gpus):
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        if "nvmlDeviceGetHandleByIndex" in gpus[index].errors:
            raise _error(gpus[index].errors["nvmlDeviceGetHandleByIndex"])
        return _Handle(gpus[index], index)

    @api
    def nvmlDeviceGetIndex(handle: _Handle) -> int:
        check("nvmlDeviceGetIndex", handle, parent_only=True)
        return handle._index

    @api
    def nvmlDeviceGetName(handle: _Handle) -> str | bytes:
        gpu = check("nvmlDeviceGetName", handle)
        assert gpu is not None
        return text(f"{gpu.name} MIG {handle._mig.profile}" if handle._mig else gpu.name)

    @api
    def nvmlDeviceGetUUID(handle: _Handle) -> str | bytes:
        gpu = check("nvmlDeviceGetUUID", handle)
        assert gpu is not None and gpu.uuid is not None
        return text(handle._mig.uuid if handle._mig else gpu.uuid)

    @api
    def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> Any:
        gpu = check("nvmlDeviceGetMemoryInfo", handle)
        assert gpu is not None
        mib = gpu.total_mib * handle._mig.slices // 8 if handle._mig else gpu.total_mib
        used = gpu.mig_memory_used_mib.get(handle._mig.start, 0) if handle._mig else gpu.memory_used_mib
        total, taken = mib * 2**20, min(used, mib) * 2**20
        if version:
            return real.c_nvmlMemory_v2_t(version=version, total=total, free=total - taken, used=taken)
        return real.c_nvmlMemory_t(total=total, free=total - taken, used=taken)

    @api
    def nvmlDeviceGetCudaComputeCapability(handle: _Handle) -> tuple[int, int]:
        gpu = check("nvmlDeviceGetCudaComputeCapability", handle)
        assert gpu is not None
        return gpu.compute_capability

    @api
    def nvmlDeviceGetUtilizationRates(handle: _Handle) -> Any:
        gpu = check("nvmlDeviceGetUtilizationRates", handle)
        assert gpu is not None
        if handle._mig or gpu.mig is not None:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return real.c_nvmlUtilization_t(gpu=gpu.utilization, memory=gpu.memory_utilization)

    def board(function: str, handle: _Handle) -> FakeGpu:
        """A query of the whole board: MIG device handles get NotSupported, as from real drivers."""
        gpu = check(function, handle)
        assert gpu is not None
        if handle._mig is not None:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    @api
    def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
        gpu = board("nvmlDeviceGetTemperature", handle)
        if sensor != real.NVML_TEMPERATURE_GPU:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_c

    @api
    def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
        return board("nvmlDeviceGetPowerUsage", handle).power_mw

    @api
    def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
        return board("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    @api
    def nvmlDeviceGetClockInfo(handle: _Handle, type: int) -> int:
        gpu = board("nvmlDeviceGetClockInfo", handle)
        if type != real.NVML_CLOCK_SM:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.sm_clock_mhz

    @api
    def nvmlDeviceGetTotalEccErrors(handle: _Handle, errorType: int, counterType: int) -> int:
        gpu = board("nvmlDeviceGetTotalEccErrors", handle)
        if gpu.ecc is None:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.ecc[0] if errorType == real.NVML_MEMORY_ERROR_TYPE_CORRECTED else gpu.ecc[1]

    # ---- GPM: sample buffers are real ctypes pointers; what each recorded is kept here by address ----
    gpm_buffers: dict[int, Any] = {}  # address -> the buffer, kept alive while allocated
    gpm_readings: dict[int, tuple[_Mig, int, float, float]] = {}  # address -> (instance, seq, util, dram)
    gpm_seq = iter(range(1, 10**9))

    def address(sample: Any) -> int:
        try:
            where = ctypes.addressof(sample.contents)
        except (ValueError, AttributeError):  # a NULL pointer or not a GPM sample at all
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT) from None
        if where not in gpm_buffers:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return where

    @api
    def nvmlGpmQueryDeviceSupport(device: _Handle) -> Any:
        gpu = check("nvmlGpmQueryDeviceSupport", device, parent_only=True)
        assert gpu is not None
        return real.c_nvmlGpmSupport_t(
            version=real.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(gpu.gpm_supported)
        )

    @api
    def nvmlGpmSampleAlloc() -> Any:
        check("nvmlGpmSampleAlloc")
        buffer = real.c_nvmlGpmSample_t(real.struct_c_nvmlGpmSample_t())
        gpm_buffers[ctypes.addressof(buffer.contents)] = buffer
        return buffer

    @api
    def nvmlGpmSampleFree(gpmSample: Any) -> None:
        check("nvmlGpmSampleFree")
        where = address(gpmSample)
        del gpm_buffers[where]
        gpm_readings.pop(where, None)

    @api
    def nvmlGpmMigSampleGet(device: _Handle, gpuInstanceId: int, gpmSample: Any) -> Any:
        gpu = check("nvmlGpmMigSampleGet", device, parent_only=True)
        assert gpu is not None
        if not gpu.gpm_supported:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        mig = next((m for m in layouts[device._index] if m is not None and m.gi_id == gpuInstanceId), None)
        if mig is None:
            raise _error(real.NVML_ERROR_NOT_FOUND)
        util = gpu.mig_utilization.get(mig.start, 0.0)
        gpm_readings[address(gpmSample)] = (
            mig,
            next(gpm_seq),
            util,
            gpu.mig_memory_utilization.get(mig.start, 0.0),
        )
        return gpmSample

    @api
    def nvmlGpmMetricsGet(metricsGet: Any) -> Any:
        check("nvmlGpmMetricsGet")
        if metricsGet.version != real.NVML_GPM_METRICS_GET_VERSION:
            raise _error(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = gpm_readings.get(address(metricsGet.sample1))
        second = gpm_readings.get(address(metricsGet.sample2))
        if first is None or second is None or first[0] is not second[0] or first[1] >= second[1]:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)  # unread buffers, two instances, or wrong order
        if "nvmlGpmMetricsGet" in first[0].gpu.errors:
            raise _error(first[0].gpu.errors["nvmlGpmMetricsGet"])
        values = {real.NVML_GPM_METRIC_GRAPHICS_UTIL: second[2], real.NVML_GPM_METRIC_SM_UTIL: second[2]}
        values[real.NVML_GPM_METRIC_DRAM_BW_UTIL] = second[3]
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            if metric.metricId in values:
                metric.value, metric.nvmlReturn = values[metric.metricId], real.NVML_SUCCESS
            else:
                metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return metricsGet

    # ---- XID errors through event sets ----
    event_sets: dict[int, list[FakeGpu]] = {}

    @api
    def nvmlEventSetCreate() -> c_uint:
        check("nvmlEventSetCreate")
        key = len(event_sets) + 1
        event_sets[key] = []
        return c_uint(key)

    @api
    def nvmlDeviceRegisterEvents(handle: _Handle, eventTypes: int, eventSet: c_uint) -> None:
        gpu = check("nvmlDeviceRegisterEvents", handle, parent_only=True)
        assert gpu is not None
        if not gpu.events:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        if eventSet.value not in event_sets:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        event_sets[eventSet.value].append(gpu)

    @api
    def nvmlEventSetWait_v2(eventSet: c_uint, timeoutms: int) -> Any:
        check("nvmlEventSetWait_v2")
        for gpu in event_sets.get(eventSet.value, ()):
            if gpu.lost:
                raise _error(real.NVML_ERROR_GPU_IS_LOST)
            if gpu.xids:
                code, instance = gpu.xids.pop(0)
                return real.c_nvmlEventData_t(
                    eventType=real.nvmlEventTypeXidCriticalError, eventData=code, gpuInstanceId=instance
                )
        raise _error(real.NVML_ERROR_TIMEOUT)

    module.nvmlEventSetWait = nvmlEventSetWait_v2  # type: ignore[attr-defined]

    @api
    def nvmlEventSetFree(eventSet: c_uint) -> None:
        check("nvmlEventSetFree")
        if event_sets.pop(eventSet.value, None) is None:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)

    @api
    def nvmlDeviceGetP2PStatus(device1: _Handle, device2: _Handle, p2pIndex: int) -> int:
        check("nvmlDeviceGetP2PStatus", device1, parent_only=True)
        check("nvmlDeviceGetP2PStatus", device2, parent_only=True)
        if p2p_error is not None:
            raise _error(p2p_error)
        if p2pIndex != real.NVML_P2P_CAPS_INDEX_NVLINK or (device1._index, device2._index) in linked:
            return int(real.NVML_P2P_STATUS_OK)
        return int(real.NVML_P2P_STATUS_NOT_SUPPORTED)

    @api
    def nvmlDeviceGetMigMode(device: _Handle) -> list[int]:
        gpu = check("nvmlDeviceGetMigMode", device, parent_only=True)
        assert gpu is not None
        if not gpu.mig_capable:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        mode = real.NVML_DEVICE_MIG_ENABLE if gpu.mig is not None else real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    @api
    def nvmlDeviceGetMaxMigDeviceCount(device: _Handle) -> int:
        gpu = check("nvmlDeviceGetMaxMigDeviceCount", device, parent_only=True)
        assert gpu is not None
        if not gpu.mig_capable:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return _MAX_MIG_DEVICES

    @api
    def nvmlDeviceGetMigDeviceHandleByIndex(device: _Handle, index: int) -> _Handle:
        check("nvmlDeviceGetMigDeviceHandleByIndex", device, parent_only=True)
        if not 0 <= index < _MAX_MIG_DEVICES:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        slots = layouts[device._index]
        mig = slots[index] if index < len(slots) else None
        if mig is None:
            raise _error(real.NVML_ERROR_NOT_FOUND)
        return _Handle(device._gpu, device._index, mig)

    @api
    def nvmlDeviceIsMigDeviceHandle(device: _Handle) -> c_uint:
        check("nvmlDeviceIsMigDeviceHandle", device)
        return c_uint(1 if device._mig else 0)

    @api
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice: _Handle) -> _Handle:
        check("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice)
        if migDevice._mig is None:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(migDevice._gpu, migDevice._index)

    def mig_of(device: _Handle) -> _Mig:
        if device._mig is None:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return device._mig

    @api
    def nvmlDeviceGetGpuInstanceId(device: _Handle) -> int:
        check("nvmlDeviceGetGpuInstanceId", device)
        return mig_of(device).gi_id

    @api
    def nvmlDeviceGetComputeInstanceId(device: _Handle) -> int:
        check("nvmlDeviceGetComputeInstanceId", device)
        mig_of(device)
        return 0

    @api
    def nvmlDeviceGetGpuInstanceById(device: _Handle, gpuInstanceId: int) -> _GpuInstance:
        check("nvmlDeviceGetGpuInstanceById", device, parent_only=True)
        for mig in layouts[device._index]:
            if mig is not None and mig.gi_id == gpuInstanceId:
                return _GpuInstance(mig)
        raise _error(real.NVML_ERROR_NOT_FOUND)

    @api
    def nvmlGpuInstanceGetInfo(gpuInstance: _GpuInstance) -> Any:
        check("nvmlGpuInstanceGetInfo", gpuInstance)
        mig = gpuInstance._mig
        placement = real.c_nvmlGpuInstancePlacement_t(start=mig.start, size=mig.slices)
        return real.c_nvmlGpuInstanceInfo_t(id=mig.gi_id, profileId=mig.profile_id, placement=placement)

    module.struct_c_nvmlGpmSample_t = real.struct_c_nvmlGpmSample_t  # type: ignore[attr-defined]
    module._fake = state  # type: ignore[attr-defined]
    module._gpm_buffers = gpm_buffers  # type: ignore[attr-defined]
    module._event_sets = event_sets  # type: ignore[attr-defined]
    return module


def state_of(module: ModuleType) -> FakeState:
    """The record of calls kept by a module from :func:`fake_pynvml`."""
    state: FakeState = module._fake
    return state


# ---- hosts ----------------------------------------------------------------------------------------------------

H100_MIG_BALANCED = ["3g.40gb@4", "2g.20gb@0", "1g.10gb@2", "1g.10gb@3"]


def dgx_h100(mig: Sequence[str | None] | None = None, count: int = 8) -> ModuleType:
    """An HGX/DGX H100: ``count`` H100 80GB HBM3 GPUs, all on one NVSwitch fabric."""
    return fake_pynvml([h100_80gb(mig) for _ in range(count)], nvlink=[list(range(count))])


def no_library() -> ModuleType:
    """A host without the NVIDIA driver: ``libnvidia-ml.so.1`` cannot be loaded."""
    return fake_pynvml(init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)


def driver_not_loaded() -> ModuleType:
    """The driver's user-space library is installed but the kernel module is not loaded."""
    return fake_pynvml(init_error=real.NVML_ERROR_DRIVER_NOT_LOADED)


def gpu_lost() -> ModuleType:
    """Two NVLinked H100s; the second fell off the bus (Xid 79) and answers every query with GpuIsLost."""
    return fake_pynvml([h100_80gb(), h100_80gb(lost=True)], nvlink=[[0, 1]])
