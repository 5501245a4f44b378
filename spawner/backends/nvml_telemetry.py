"""Sample this host's GPUs and MIG instances through NVML (``pynvml``), read-only, into telemetry records.

Per GPU: utilisation rates, memory, temperature, power and its enforced limit, SM clock, volatile ECC counts,
and XID errors (an NVML event set per GPU, drained without waiting). Per MIG instance: memory from the MIG
device handle; utilisation through GPM (Hopper and newer: two samples of the GPU instance, the metric over
the time between them) where the GPU supports it. Whatever NVML cannot say is None ("not available"): NVML
has no utilisation rates for MIG devices or GPUs in MIG mode, and a fake 0 would make a busy slice look idle.

A MIG instance shares its GPU's die, so it is given the GPU's temperature and SM clock; power, its limit and
ECC counts belong to the whole board and stay None on the instance. The MIG layout is read when the sampler
opens; re-open it after the layout changes.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any

from ..telemetry.samples import Sample, Snapshot
from .nvml_access import MIB, Probe, gpu_count, start, stop, text
from .nvml_mig import MIG_NAME, mig_handles

log = logging.getLogger(__name__)

_MAX_EVENTS_PER_SAMPLE = 32  # an XID storm must not keep one sample busy forever
_XID_CRITICAL = 0x8  # py_XID_CRITICAL (a module constant fakes need not copy)


@dataclass
class _Gpm:
    """Two GPM sample buffers of one MIG instance: the previous reading and the one being taken."""

    previous: Any
    current: Any
    primed: bool = False  # whether ``previous`` holds a reading yet


@dataclass
class _Device:
    handle: Any
    uuid: str
    gpu_index: int
    mig_profile: str | None = None
    parent: _Device | None = None
    gpu_instance_id: int | None = None
    gpm: _Gpm | None = None
    events: Any = None  # an NVML event set registered for XID errors (whole GPUs only)
    instances: list[_Device] = field(default_factory=list)


class NvmlSampler:
    """Reads every GPU and MIG instance NVML shows, once per :meth:`sample` call.

    ``nvml`` replaces the ``pynvml`` module (tests pass a fake). :meth:`open` raises
    :class:`~.nvml.NvmlUnavailable` when NVML cannot start; a device that fails later reads None and says
    why in its sample's ``problems``.
    """

    simulated = False
    backend = "nvml"

    def __init__(self, node: str | None = None, *, nvml: ModuleType | None = None) -> None:
        self.node = node or socket.gethostname()
        self._module = nvml
        self._nvml: ModuleType | None = None
        self._gpus: list[_Device] = []

    # ---- lifecycle --------------------------------------------------------------------------------------

    def open(self) -> None:
        """Start NVML and find the devices: handles, MIG instances, GPM support, XID event sets."""
        if self._nvml is not None:
            return
        nvml = start(self._module)
        self._nvml = nvml
        try:
            for index in range(gpu_count(nvml)):
                gpu = self._open_gpu(nvml, index)
                if gpu is not None:
                    self._gpus.append(gpu)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Free GPM buffers and event sets, then shut NVML down; failures here are only logged."""
        nvml = self._nvml
        if nvml is None:
            return
        for gpu in self._gpus:
            for device in (gpu, *gpu.instances):
                if device.gpm is not None:
                    for buffer in (device.gpm.previous, device.gpm.current):
                        _quietly(nvml, nvml.nvmlGpmSampleFree, buffer)
                if device.events is not None:
                    _quietly(nvml, nvml.nvmlEventSetFree, device.events)
        self._gpus = []
        self._nvml = None
        stop(nvml)

    def __enter__(self) -> NvmlSampler:
        self.open()
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    @property
    def device_count(self) -> int:
        return sum(1 + len(gpu.instances) for gpu in self._gpus)

    # ---- sampling ---------------------------------------------------------------------------------------

    def sample(self, at: float) -> Snapshot:
        """One reading of every device, stamped ``at`` (the caller's clock: the domain keeps none)."""
        self.open()
        nvml = self._nvml
        assert nvml is not None
        samples: list[Sample] = []
        for gpu in self._gpus:
            whole, xids = self._sample_gpu(nvml, gpu, at)
            samples.append(whole)
            for instance in gpu.instances:
                samples.append(self._sample_mig(nvml, instance, whole, xids, at))
        return Snapshot(at, tuple(samples), simulated=False, backend=self.backend)

    def _sample_gpu(self, nvml: ModuleType, gpu: _Device, at: float) -> tuple[Sample, list[tuple[int, int]]]:
        probe = Probe(nvml, f"GPU {gpu.gpu_index} on {self.node}")
        h = gpu.handle
        rates = probe.read("utilization", nvml.nvmlDeviceGetUtilizationRates, h, optional=True)
        memory = probe.read("memory", nvml.nvmlDeviceGetMemoryInfo, h, optional=True)
        temperature = probe.read(
            "temperature", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU, optional=True
        )
        power = probe.read("power", nvml.nvmlDeviceGetPowerUsage, h, optional=True)
        limit = probe.read("power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h, optional=True)
        clock = probe.read("SM clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM, optional=True)
        ecc = [
            probe.read(
                f"ECC {kind}",
                nvml.nvmlDeviceGetTotalEccErrors,
                h,
                error_type,
                nvml.NVML_VOLATILE_ECC,
                optional=True,
            )
            for kind, error_type in (
                ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            )
        ]
        xids = self._drain_xids(nvml, probe, gpu) if gpu.events is not None and not probe.lost else None
        sample = Sample(
            uuid=gpu.uuid,
            node=self.node,
            gpu_index=gpu.gpu_index,
            mig_profile=None,
            time=at,
            gpu_utilization=_percent(rates.gpu) if rates is not None else None,
            memory_utilization=_percent(rates.memory) if rates is not None else None,
            memory_used_mib=int(memory.used) / MIB if memory is not None else None,
            memory_total_mib=int(memory.total) / MIB if memory is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=int(power) / 1000 if power is not None else None,  # NVML gives milliwatts
            power_limit_w=int(limit) / 1000 if limit is not None else None,
            sm_clock_mhz=float(clock) if clock is not None else None,
            ecc_corrected=int(ecc[0]) if ecc[0] is not None else None,
            ecc_uncorrected=int(ecc[1]) if ecc[1] is not None else None,
            xid_errors=tuple(code for code, _ in xids) if xids is not None else None,
            problems=tuple(probe.problems),
        )
        return sample, xids or []

    def _sample_mig(
        self, nvml: ModuleType, device: _Device, parent: Sample, xids: list[tuple[int, int]], at: float
    ) -> Sample:
        probe = Probe(nvml, f"MIG {device.mig_profile} {device.uuid} on {self.node}")
        memory = probe.read("memory", nvml.nvmlDeviceGetMemoryInfo, device.handle, optional=True)
        utilization, dram = self._gpm_read(nvml, probe, device)
        return Sample(
            uuid=device.uuid,
            node=self.node,
            gpu_index=device.gpu_index,
            mig_profile=device.mig_profile,
            time=at,
            gpu_utilization=utilization,
            memory_utilization=dram,
            memory_used_mib=int(memory.used) / MIB if memory is not None else None,
            memory_total_mib=int(memory.total) / MIB if memory is not None else None,
            temperature_c=parent.temperature_c,
            sm_clock_mhz=parent.sm_clock_mhz,
            xid_errors=(
                tuple(code for code, gi in xids if gi == device.gpu_instance_id)
                if parent.xid_errors is not None
                else None
            ),
            problems=tuple(probe.problems),
        )

    def _gpm_read(self, nvml: ModuleType, probe: Probe, device: _Device) -> tuple[float | None, float | None]:
        """Graphics-engine and DRAM-bandwidth utilisation since the previous GPM sample of this instance;
        (None, None) without GPM or before the second sample."""
        gpm = device.gpm
        if gpm is None or device.parent is None:
            return None, None
        got = probe.read(
            "GPM sample",
            nvml.nvmlGpmMigSampleGet,
            device.parent.handle,
            device.gpu_instance_id,
            gpm.current,
            optional=True,
        )
        if got is None:
            gpm.primed = False
            return None, None
        values: tuple[float | None, float | None] = (None, None)
        if gpm.primed:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 2
            request.sample1 = gpm.previous
            request.sample2 = gpm.current
            request.metrics[0].metricId = nvml.NVML_GPM_METRIC_GRAPHICS_UTIL
            request.metrics[1].metricId = nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
            result = probe.read("GPM metrics", nvml.nvmlGpmMetricsGet, request, optional=True)
            if result is not None:
                engine, dram = result.metrics[0], result.metrics[1]
                values = (
                    _percent(engine.value) if int(engine.nvmlReturn) == nvml.NVML_SUCCESS else None,
                    _percent(dram.value) if int(dram.nvmlReturn) == nvml.NVML_SUCCESS else None,
                )
        gpm.previous, gpm.current, gpm.primed = gpm.current, gpm.previous, True
        return values

    def _drain_xids(self, nvml: ModuleType, probe: Probe, gpu: _Device) -> list[tuple[int, int]] | None:
        """XID codes waiting in the GPU's event set, with the GPU instance each names; None on failure."""
        found: list[tuple[int, int]] = []
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                event = nvml.nvmlEventSetWait_v2(gpu.events, 0)
            except nvml.NVMLError_Timeout:
                break
            except nvml.NVMLError as error:
                probe.problems.append(f"XID events: {error}")
                return None
            if int(event.eventType) & _XID_CRITICAL:
                found.append((int(event.eventData), int(event.gpuInstanceId)))
        return found

    # ---- opening ----------------------------------------------------------------------------------------

    def _open_gpu(self, nvml: ModuleType, index: int) -> _Device | None:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as error:
            log.warning("GPU %d on %s cannot be sampled: %s", index, self.node, error)
            return None
        gpu = _Device(handle, uuid, index, events=self._xid_events(nvml, handle, uuid))
        try:
            mig_on = int(nvml.nvmlDeviceGetMigMode(handle)[0]) == nvml.NVML_DEVICE_MIG_ENABLE
        except nvml.NVMLError:  # NotSupported on GPUs without MIG: MIG is simply off
            mig_on = False
        if not mig_on:
            return gpu
        problems: list[str] = []
        gpm_on = self._gpm_supported(nvml, handle, uuid)
        for mig_handle in mig_handles(nvml, handle, problems):
            try:
                mig_uuid = text(nvml.nvmlDeviceGetUUID(mig_handle))
                match = MIG_NAME.search(text(nvml.nvmlDeviceGetName(mig_handle)))
                instance_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig_handle))
            except nvml.NVMLError as error:
                problems.append(f"MIG device: {error}")
                continue
            device = _Device(
                mig_handle, mig_uuid, index, match.group(1) if match else "unknown", gpu, instance_id
            )
            if gpm_on:
                device.gpm = self._gpm_buffers(nvml, mig_uuid)
            gpu.instances.append(device)
        if problems:
            log.warning("GPU %d on %s: some MIG devices cannot be sampled: %s", index, self.node, problems)
        return gpu

    def _gpm_supported(self, nvml: ModuleType, handle: Any, uuid: str) -> bool:
        try:
            supported = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except nvml.NVMLError as error:
            log.info("%s: no GPM (%s); MIG utilisation will read 'not available'", uuid, error)
            return False
        if not supported:
            log.info("%s does not support GPM; MIG utilisation will read 'not available'", uuid)
        return supported

    def _gpm_buffers(self, nvml: ModuleType, uuid: str) -> _Gpm | None:
        try:
            first = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError as error:
            log.warning("%s: GPM sample buffers cannot be allocated: %s", uuid, error)
            return None
        try:
            return _Gpm(first, nvml.nvmlGpmSampleAlloc())
        except nvml.NVMLError as error:
            _quietly(nvml, nvml.nvmlGpmSampleFree, first)
            log.warning("%s: GPM sample buffers cannot be allocated: %s", uuid, error)
            return None

    def _xid_events(self, nvml: ModuleType, handle: Any, uuid: str) -> Any:
        """An event set that collects the GPU's XID errors, or None where NVML cannot deliver them."""
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            log.info("%s: no NVML event set for XID errors: %s", uuid, error)
            return None
        try:
            nvml.nvmlDeviceRegisterEvents(handle, _XID_CRITICAL, events)
        except nvml.NVMLError as error:
            log.info("%s: XID errors cannot be watched: %s", uuid, error)
            _quietly(nvml, nvml.nvmlEventSetFree, events)
            return None
        return events


def _percent(value: float) -> float:
    """NVML percentages, clamped: GPM may report a hair over 100 after rounding."""
    return min(100.0, max(0.0, float(value)))


def _quietly(nvml: ModuleType, call: Any, *args: Any) -> None:
    try:
        call(*args)
    except nvml.NVMLError as error:
        log.debug("%s failed while closing: %s", getattr(call, "__name__", call), error)
