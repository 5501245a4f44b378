"""The pool, its leases and its devices' latest samples as Prometheus metrics (the text ``GET {prefix}metrics``
serves).

Metrics follow Prometheus conventions: base units (bytes, seconds, hertz, watts), ratios from 0 to 1, one
series per device labelled ``node``, ``gpu`` (index), ``uuid``, ``mig_profile`` (empty for a whole GPU) and
``user`` (who holds it, comma-joined on a shared GPU; empty when free). A metric the device cannot report
("not available") has no series at all, rather than a fake 0. ``gpupool_telemetry_simulated`` is 1 when the
numbers are of simulated GPUs (a pool file's, or the nodes of ``gpupool kube up``).

:func:`render_metrics` builds the text from the manager, the telemetry and (optionally) the usage store at
one moment; :func:`pool_devices` and :func:`device_users` are the device list and holders the telemetry API
shows too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ...pool.devices import GpuMode
from ...pool.leases import LeaseState
from ...pool.state import PoolState
from ...telemetry.history import SampleHistory
from ...telemetry.samples import Sample
from ..leasing.culls import CULL_LIMITS
from ..leasing.lease_manager import LeaseManager
from ..store.usage_store import UsageStore
from .telemetry_loop import Telemetry

_MIB = 2**20
# dcgm-exporter's names, so a GPU Operator site joins gpupool's series with its own on them: Hostname, gpu
# (index), UUID (the physical GPU's, for a MIG slice its parent's), GPU_I_PROFILE and GPU_I_ID (MIG slices;
# the id where the backend reads it). ``device`` is gpupool's own name of the device (the GPU-…/MIG-… UUID a
# lease grants). Who holds a device is gpupool_lease_info's, not a label on every device series.
_DEVICE_LABELS = ("Hostname", "gpu", "UUID", "GPU_I_PROFILE", "GPU_I_ID", "device")


@dataclass(frozen=True)
class Device:
    """A device of the pool as the metrics label it."""

    node: str
    gpu: int
    uuid: str
    mig_profile: str | None
    memory_mib: int
    split: bool = False  # a GPU in MIG mode: leased only through its instances
    parent_uuid: str = ""  # a MIG slice's GPU
    gpu_instance_id: int | None = None
    health: str = "healthy"  # else its node's or GPU's: unhealthy (failed) or drained, out of service

    def labels(self) -> list[str]:
        instance = "" if self.gpu_instance_id is None else str(self.gpu_instance_id)
        return [
            self.node,
            str(self.gpu),
            self.parent_uuid or self.uuid,
            self.mig_profile or "",
            instance,
            self.uuid,
        ]


def pool_devices(pool: PoolState) -> list[Device]:
    """Every GPU and MIG instance of the pool, in pool order (a MIG GPU before its instances)."""
    found: list[Device] = []
    for ns in pool.nodes:
        for position, gpu in enumerate(ns.gpus):
            split = gpu.mode is GpuMode.MIG
            health = (ns.health if not ns.healthy else ns.gpu_health[position]).value
            found.append(
                Device(ns.node.name, gpu.index, gpu.uuid, None, gpu.memory_mib, split, health=health)
            )
            if split:
                found.extend(
                    Device(
                        ns.node.name,
                        gpu.index,
                        i.uuid,
                        i.profile,
                        i.memory_mib,
                        parent_uuid=gpu.uuid,
                        gpu_instance_id=i.gpu_instance_id,
                        health=health,
                    )
                    for i in gpu.mig_instances
                )
    return found


def device_users(manager: LeaseManager) -> dict[str, list[str]]:
    """Device UUID -> the users of the granted leases that hold it, sorted, each once."""
    users: dict[str, set[str]] = {}
    for lease in manager.all_leases(active_only=True):
        if lease.state is LeaseState.GRANTED:
            for grant in lease.devices:
                users.setdefault(grant.uuid, set()).add(lease.user)
    return {uuid: sorted(names) for uuid, names in users.items()}


def render_metrics(
    manager: LeaseManager,
    telemetry: Telemetry,
    now: float | None = None,
    usage: UsageStore | None = None,
    culls: Mapping[str, int] | None = None,
) -> bytes:
    """The Prometheus text exposition of the pool's devices, leases and queue at this moment; with ``usage``,
    the GPU-hours held and used so far per user and profile, the same figures ``GET usage`` reports; with
    ``culls``, the culls made so far by the limit reached (:class:`..leasing.culls.Culls`)."""
    now = time.time() if now is None else now
    devices = manager.inspect(pool_devices)
    users = device_users(manager)
    readings = _Readings(devices, users, telemetry.history.latest_all(d.uuid for d in devices))
    families = [
        *_utilization_families(readings),
        *_board_families(readings),
        *_error_families(readings, telemetry.history),
        *_lease_families(manager, now, culls or {}),
        _lease_info_family(manager, {d.uuid: d for d in devices}),
        _device_count_family(devices, users),
        *_telemetry_families(telemetry),
    ]
    if usage is not None:
        families += _usage_families(usage, now)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(families))
    return generate_latest(registry)


@dataclass(frozen=True)
class _Readings:
    """The pool's devices, who holds each, and each device's latest sample (when it has one)."""

    devices: list[Device]
    users: dict[str, list[str]]
    latest: dict[str, Sample]

    def gauge(self, name: str, help_text: str, value: Callable[[Sample], float | None]) -> GaugeMetricFamily:
        """One series per device whose latest sample has the reading; none for a device without it."""
        family = GaugeMetricFamily(name, help_text, labels=_DEVICE_LABELS)
        for device in self.devices:
            sample = self.latest.get(device.uuid)
            reading = value(sample) if sample is not None else None
            if reading is not None:
                family.add_metric(device.labels(), reading)
        return family


def _ratio(percent: float | None) -> float | None:
    return percent / 100 if percent is not None else None


def _bytes(mib: float | None) -> float | None:
    return mib * _MIB if mib is not None else None


def _utilization_families(readings: _Readings) -> list[Metric]:
    """How busy each device is and how much of its memory is in use."""
    total = GaugeMetricFamily(
        "gpupool_gpu_memory_total_bytes",
        "Device memory in all, as last sampled (else as the pool has it)",
        labels=_DEVICE_LABELS,
    )
    for device in readings.devices:
        sample = readings.latest.get(device.uuid)
        sampled = sample.memory_total_mib if sample is not None else None
        total.add_metric(device.labels(), (sampled if sampled is not None else device.memory_mib) * _MIB)
    return [
        readings.gauge(
            "gpupool_gpu_utilization_ratio",
            "Fraction of time the device's engines were busy over the last sample period (0-1)",
            lambda s: _ratio(s.gpu_utilization),
        ),
        readings.gauge(
            "gpupool_gpu_memory_utilization_ratio",
            "Fraction of time the device's memory was being read or written (0-1)",
            lambda s: _ratio(s.memory_utilization),
        ),
        readings.gauge(
            "gpupool_gpu_memory_used_bytes", "Device memory in use", lambda s: _bytes(s.memory_used_mib)
        ),
        total,
    ]


def _board_families(readings: _Readings) -> list[Metric]:
    """Temperature, power and clock of each device."""
    return [
        readings.gauge("gpupool_gpu_temperature_celsius", "GPU die temperature", lambda s: s.temperature_c),
        readings.gauge("gpupool_gpu_power_watts", "Board power draw", lambda s: s.power_w),
        readings.gauge(
            "gpupool_gpu_power_limit_watts", "Enforced board power limit", lambda s: s.power_limit_w
        ),
        readings.gauge(
            "gpupool_gpu_sm_clock_hertz",
            "SM clock",
            lambda s: s.sm_clock_mhz * 1e6 if s.sm_clock_mhz is not None else None,
        ),
    ]


def _error_families(readings: _Readings, history: SampleHistory) -> list[Metric]:
    """ECC and XID error counters of each device that reports them."""
    ecc = CounterMetricFamily(
        "gpupool_gpu_ecc_errors",
        "Volatile ECC error counts since the driver loaded",
        labels=(*_DEVICE_LABELS, "type"),
    )
    xid = CounterMetricFamily(
        "gpupool_gpu_xid_errors", "XID errors seen since the service started", labels=_DEVICE_LABELS
    )
    for device in readings.devices:
        sample = readings.latest.get(device.uuid)
        if sample is None:
            continue
        labels = device.labels()
        for kind, count in (("corrected", sample.ecc_corrected), ("uncorrected", sample.ecc_uncorrected)):
            if count is not None:
                ecc.add_metric([*labels, kind], count)
        if sample.xid_errors is not None:
            xid.add_metric(labels, history.xid_total(device.uuid))
    return [ecc, xid]


def _lease_families(manager: LeaseManager, now: float, cull_counts: Mapping[str, int]) -> list[Metric]:
    """Leases by state, the queue, refused requests and culls."""
    leases = manager.all_leases(active_only=True)
    queued = [lease for lease in leases if lease.state is LeaseState.QUEUED]
    by_state = GaugeMetricFamily("gpupool_leases", "Active leases by state", labels=["state"])
    for state in (LeaseState.GRANTED, LeaseState.QUEUED):
        by_state.add_metric([state.value], sum(1 for lease in leases if lease.state is state))
    refused = CounterMetricFamily(
        "gpupool_placement_refusals",
        "Requests not granted at once since the service started, by reason: queued (no room now), quota, "
        "never_fits",
        labels=["reason"],
    )
    for reason in ("queued", "quota", "never_fits"):
        refused.add_metric([reason], manager.refusals[reason])
    culls = CounterMetricFamily(
        "gpupool_culls",
        "Servers the idle culler stopped, by the profile limit they reached (every cull kept: a restart does "
        "not reset it)",
        labels=["limit"],
    )
    for limit in CULL_LIMITS:
        culls.add_metric([limit], cull_counts.get(limit, 0))
    return [
        by_state,
        GaugeMetricFamily("gpupool_queue_length", "Leases waiting in the queue", value=len(queued)),
        refused,
        culls,
        GaugeMetricFamily(
            "gpupool_queue_wait_seconds_max",
            "How long the longest-waiting queued lease has waited (0 when the queue is empty)",
            value=max((now - lease.created_at for lease in queued), default=0.0),
        ),
    ]


def _lease_info_family(manager: LeaseManager, devices: Mapping[str, Device]) -> Metric:
    """1 per device of each granted lease, labelled with the lease, its user and profile and the device's
    labels: join it onto any device series (``* on (device) group_left (user, profile)``)."""
    info = GaugeMetricFamily(
        "gpupool_lease_info",
        "Who holds each device: 1 per device of a granted lease",
        labels=["lease", "user", "profile", "owner_kind", *_DEVICE_LABELS],
    )
    for lease in manager.all_leases(active_only=True):
        if lease.state is not LeaseState.GRANTED:
            continue
        for grant in lease.devices:
            device = devices.get(grant.uuid)
            if device is not None:
                info.add_metric(
                    [lease.id, lease.user, lease.profile, lease.owner_kind, *device.labels()], 1.0
                )
    return info


def _device_count_family(devices: Iterable[Device], users: Mapping[str, list[str]]) -> Metric:
    """Leasable devices by kind (``gpu`` or ``mig``), whether anyone holds them and their health: a failed or
    drained device that nobody holds is not free (a trial's Grafana counted them in "Free devices")."""
    held = GaugeMetricFamily(
        "gpupool_devices",
        "Leasable devices by kind, whether anyone holds them, and health (healthy, unhealthy or drained)",
        labels=["kind", "held", "health"],
    )
    counts: dict[tuple[str, str, str], int] = {}
    for device in devices:
        if device.split:
            continue  # a GPU in MIG mode is leased through its instances
        kind, is_held = "mig" if device.mig_profile else "gpu", "true" if users.get(device.uuid) else "false"
        counts[kind, is_held, device.health] = counts.get((kind, is_held, device.health), 0) + 1
    for labels, count in sorted(counts.items()):
        held.add_metric(list(labels), count)
    return held


def _telemetry_families(telemetry: Telemetry) -> list[Metric]:
    """Whether the readings are simulated, and when they were last taken (no series before the first)."""
    simulated = GaugeMetricFamily(
        "gpupool_telemetry_simulated", "1 when device readings are of simulated GPUs, not hardware"
    )
    simulated.add_metric([], 1.0 if telemetry.simulated else 0.0)
    last = telemetry.history.last_time
    if last is None:
        return [simulated]
    stamp = GaugeMetricFamily(
        "gpupool_telemetry_last_sample_timestamp_seconds", "When the devices were last sampled", value=last
    )
    return [simulated, stamp]


def _usage_families(usage: UsageStore, now: float) -> list[Metric]:
    """GPU-hours held, used and unknown per user and profile, from the stored minutes: ``GET usage``'s idle
    share is 1 − used / (held − unknown), and a dashboard needs the unknown hours to say the same."""
    held = CounterMetricFamily(
        "gpupool_gpu_hours_held",
        "GPU-hours held (in GPU-equivalents), stored minutes",
        labels=["user", "profile"],
    )
    used = CounterMetricFamily(
        "gpupool_gpu_hours_used",
        "GPU-hours held above the idle threshold, gpu_idle_threshold (in GPU-equivalents)",
        labels=["user", "profile"],
    )
    unknown = CounterMetricFamily(
        "gpupool_gpu_hours_unknown",
        "GPU-hours held while utilisation could not be read (in GPU-equivalents): neither used nor idle",
        labels=["user", "profile"],
    )
    for row in usage.report(0, now + 60):
        held.add_metric([row.user, row.profile], row.gpu_hours_held)
        used.add_metric([row.user, row.profile], row.gpu_hours_used)
        unknown.add_metric([row.user, row.profile], row.gpu_hours_unknown)
    return [held, used, unknown]


class _Collector:
    """Hands prometheus_client the families already built."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families
