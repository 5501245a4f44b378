"""Telemetry over HTTP: Prometheus metrics at ``{prefix}metrics`` and recent samples at ``api/v1/telemetry``.

Metrics follow Prometheus conventions: base units (bytes, seconds, hertz, watts), ratios from 0 to 1, one
series per device labelled ``node``, ``gpu`` (index), ``uuid``, ``mig_profile`` (empty for a whole GPU) and
``user`` (who holds it, comma-joined on a shared GPU; empty when free). A metric the device cannot report
("not available") has no series at all, rather than a fake 0. ``gpupool_telemetry_simulated`` is 1 when the
numbers come from the simulated backend.

Who may read what: ``GET {prefix}metrics`` needs an administrator's token (``custom:gpupool:admin``), as
JupyterHub's own ``/hub/metrics`` needs one, unless the router is made with ``public_metrics=True``;
``GET {prefix}api/v1/telemetry`` gives administrators and the hub every device, and a user the devices of
their own granted leases.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures, which name
# dependencies local to telemetry_router.
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request, Response, status
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ...pool.devices import GpuMode
from ...pool.state import PoolState
from ...telemetry.samples import Sample
from ..leasing.lease_manager import LeaseManager
from ..store.lease_store import LeaseState
from ..store.usage_store import UsageStore
from ..telemetry.telemetry_loop import Telemetry
from .auth import Authenticator, Caller
from .idle_routes import CULL_LIMITS

SERVICE_PREFIX = "/services/gpupool/"
_MIB = 2**20
_DEVICE_LABELS = ("node", "gpu", "uuid", "mig_profile", "user")


@dataclass(frozen=True)
class _Device:
    """A device of the pool as the metrics label it."""

    node: str
    gpu: int
    uuid: str
    mig_profile: str | None
    memory_mib: int
    split: bool = False  # a GPU in MIG mode: leased only through its instances

    def labels(self, users: dict[str, list[str]]) -> list[str]:
        return [
            self.node,
            str(self.gpu),
            self.uuid,
            self.mig_profile or "",
            ",".join(users.get(self.uuid, [])),
        ]


def telemetry_router(
    manager: LeaseManager,
    telemetry: Telemetry,
    auth: Authenticator,
    *,
    prefix: str = SERVICE_PREFIX,
    public_metrics: bool = False,
    run_loop: bool = True,
    usage: UsageStore | None = None,
) -> APIRouter:
    """The routes, to ``app.include_router`` next to the lease API (same ``prefix`` as the service).

    With ``run_loop`` the router's lifespan runs ``telemetry.run()`` while the app serves (FastAPI merges an
    included router's lifespan into the app's), so wiring telemetry in is one ``include_router`` call.
    """
    base = "/" + prefix.strip("/")

    @contextlib.asynccontextmanager
    async def sampling(_app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(telemetry.run(), name="gpupool-telemetry") if run_loop else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    router = APIRouter(prefix=base, lifespan=sampling)
    CallerDep = Annotated[Caller, Depends(auth)]

    async def metrics_caller(
        request: Request, authorization: Annotated[str | None, Depends(_authorization_header)] = None
    ) -> Caller | None:
        if public_metrics:
            return None
        caller = await auth(request, authorization)
        if not caller.is_admin:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"{caller.kind} {caller.name} may not read metrics: they need custom:gpupool:admin",
            )
        return caller

    @router.get("/metrics", summary="Prometheus metrics of the pool and its devices", include_in_schema=False)
    async def get_metrics(_caller: Annotated[Caller | None, Depends(metrics_caller)]) -> Response:
        return Response(render_metrics(manager, telemetry, usage=usage), media_type=CONTENT_TYPE_LATEST)

    @router.get("/api/v1/telemetry", summary="Recent samples of the devices the caller may see")
    async def get_telemetry(
        caller: CallerDep,
        since: Annotated[
            float | None, Query(description="only samples taken after this time (epoch s)")
        ] = None,
    ) -> dict[str, Any]:
        everything = caller.is_admin or caller.acts_for_others
        users = _device_users(manager)
        devices = manager.inspect(_devices)
        if not everything:
            devices = [d for d in devices if caller.name in users.get(d.uuid, [])]
        history = telemetry.history
        return {
            "simulated": telemetry.simulated,
            "backend": telemetry.sampler.backend,
            "interval_seconds": telemetry.interval,
            "window_seconds": history.window_seconds,
            "devices": [
                {
                    "uuid": d.uuid,
                    "node": d.node,
                    "gpu": d.gpu,
                    "mig_profile": d.mig_profile,
                    "memory_mib": d.memory_mib,
                    "users": users.get(d.uuid, []) if everything else [caller.name],
                    "samples": [_sample_json(s) for s in history.recent(d.uuid, since)],
                }
                for d in devices
            ],
        }

    return router


def render_metrics(
    manager: LeaseManager, telemetry: Telemetry, now: float | None = None, usage: UsageStore | None = None
) -> bytes:
    """The Prometheus text exposition of the pool's devices, leases and queue at this moment; with ``usage``,
    the GPU-hours held and used so far per user and profile, the same figures ``GET usage`` reports."""
    now = time.time() if now is None else now
    families = list(_families(manager, telemetry, now))
    if usage is not None:
        families += _usage_families(usage, now)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(families))
    return generate_latest(registry)


def _usage_families(usage: UsageStore, now: float) -> list[Metric]:
    held = CounterMetricFamily(
        "gpupool_gpu_hours_held",
        "GPU-hours held (in GPU-equivalents), stored minutes",
        labels=["user", "profile"],
    )
    used = CounterMetricFamily(
        "gpupool_gpu_hours_used", "GPU-hours held while busy (in GPU-equivalents)", labels=["user", "profile"]
    )
    for row in usage.report(0, now + 60):
        held.add_metric([row.user, row.profile], row.gpu_hours_held)
        used.add_metric([row.user, row.profile], row.gpu_hours_used)
    return [held, used]


class _Collector:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def _families(manager: LeaseManager, telemetry: Telemetry, now: float) -> Iterable[Metric]:
    devices = manager.inspect(_devices)
    users = _device_users(manager)
    latest = telemetry.history.latest_all(d.uuid for d in devices)

    def gauge(name: str, help_text: str, value: Callable[[Sample], float | None]) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, help_text, labels=_DEVICE_LABELS)
        for device in devices:
            sample = latest.get(device.uuid)
            reading = value(sample) if sample is not None else None
            if reading is not None:
                family.add_metric(device.labels(users), reading)
        return family

    def ratio(percent: float | None) -> float | None:
        return percent / 100 if percent is not None else None

    def mib(value: float | None) -> float | None:
        return value * _MIB if value is not None else None

    yield gauge(
        "gpupool_gpu_utilization_ratio",
        "Fraction of time the device's engines were busy over the last sample period (0-1)",
        lambda s: ratio(s.gpu_utilization),
    )
    yield gauge(
        "gpupool_gpu_memory_utilization_ratio",
        "Fraction of time the device's memory was being read or written (0-1)",
        lambda s: ratio(s.memory_utilization),
    )
    yield gauge("gpupool_gpu_memory_used_bytes", "Device memory in use", lambda s: mib(s.memory_used_mib))
    total = GaugeMetricFamily(
        "gpupool_gpu_memory_total_bytes",
        "Device memory in all, as last sampled (else as the pool has it)",
        labels=_DEVICE_LABELS,
    )
    for device in devices:
        sample = latest.get(device.uuid)
        sampled = sample.memory_total_mib if sample is not None else None
        total.add_metric(device.labels(users), (sampled if sampled is not None else device.memory_mib) * _MIB)
    yield total
    yield gauge("gpupool_gpu_temperature_celsius", "GPU die temperature", lambda s: s.temperature_c)
    yield gauge("gpupool_gpu_power_watts", "Board power draw", lambda s: s.power_w)
    yield gauge("gpupool_gpu_power_limit_watts", "Enforced board power limit", lambda s: s.power_limit_w)
    yield gauge(
        "gpupool_gpu_sm_clock_hertz",
        "SM clock",
        lambda s: s.sm_clock_mhz * 1e6 if s.sm_clock_mhz is not None else None,
    )
    ecc = CounterMetricFamily(
        "gpupool_gpu_ecc_errors",
        "Volatile ECC error counts since the driver loaded",
        labels=(*_DEVICE_LABELS, "type"),
    )
    xid = CounterMetricFamily(
        "gpupool_gpu_xid_errors", "XID errors seen since the service started", labels=_DEVICE_LABELS
    )
    for device in devices:
        sample = latest.get(device.uuid)
        if sample is None:
            continue
        labels = device.labels(users)
        for kind, count in (("corrected", sample.ecc_corrected), ("uncorrected", sample.ecc_uncorrected)):
            if count is not None:
                ecc.add_metric([*labels, kind], count)
        if sample.xid_errors is not None:
            xid.add_metric(labels, telemetry.history.xid_total(device.uuid))
    yield ecc
    yield xid

    leases = manager.all_leases(active_only=True)
    queued = [lease for lease in leases if lease.state is LeaseState.QUEUED]
    by_state = GaugeMetricFamily("gpupool_leases", "Active leases by state", labels=["state"])
    for state in (LeaseState.GRANTED, LeaseState.QUEUED):
        by_state.add_metric([state.value], sum(1 for lease in leases if lease.state is state))
    yield by_state
    yield GaugeMetricFamily("gpupool_queue_length", "Leases waiting in the queue", value=len(queued))
    refused = CounterMetricFamily(
        "gpupool_placement_refusals",
        "Requests not granted at once since the service started, by reason: queued (no room now), quota, "
        "never_fits",
        labels=["reason"],
    )
    for reason in ("queued", "quota", "never_fits"):
        refused.add_metric([reason], manager.refusals[reason])
    yield refused
    culls = CounterMetricFamily(
        "gpupool_culls",
        "Servers the idle culler stopped since the service started, by the profile limit they reached",
        labels=["limit"],
    )
    for limit in CULL_LIMITS:
        culls.add_metric([limit], manager.culls[limit])
    yield culls
    yield GaugeMetricFamily(
        "gpupool_queue_wait_seconds_max",
        "How long the longest-waiting queued lease has waited (0 when the queue is empty)",
        value=max((now - lease.created_at for lease in queued), default=0.0),
    )
    held = GaugeMetricFamily(
        "gpupool_devices", "Leasable devices by kind and whether anyone holds them", labels=["kind", "held"]
    )
    counts: dict[tuple[str, str], int] = {}
    for device in devices:
        if device.split:
            continue  # a GPU in MIG mode is leased through its instances
        key = ("mig" if device.mig_profile else "gpu", "true" if users.get(device.uuid) else "false")
        counts[key] = counts.get(key, 0) + 1
    for (kind, is_held), count in sorted(counts.items()):
        held.add_metric([kind, is_held], count)
    yield held
    simulated = GaugeMetricFamily(
        "gpupool_telemetry_simulated", "1 when device readings come from the simulated backend, not hardware"
    )
    simulated.add_metric([], 1.0 if telemetry.simulated else 0.0)
    yield simulated
    last = telemetry.history.last_time
    if last is not None:
        yield GaugeMetricFamily(
            "gpupool_telemetry_last_sample_timestamp_seconds",
            "When the devices were last sampled",
            value=last,
        )


def _devices(pool: PoolState) -> list[_Device]:
    """Every GPU and MIG instance of the pool, in pool order (a MIG GPU before its instances)."""
    found: list[_Device] = []
    for ns in pool.nodes:
        for gpu in ns.gpus:
            split = gpu.mode is GpuMode.MIG
            found.append(_Device(ns.node.name, gpu.index, gpu.uuid, None, gpu.memory_mib, split))
            if split:
                found.extend(
                    _Device(ns.node.name, gpu.index, i.uuid, i.profile, i.memory_mib)
                    for i in gpu.mig_instances
                )
    return found


def _device_users(manager: LeaseManager) -> dict[str, list[str]]:
    """Device UUID -> the users of the granted leases that hold it, sorted, each once."""
    users: dict[str, set[str]] = {}
    for lease in manager.all_leases(active_only=True):
        if lease.state is LeaseState.GRANTED:
            for grant in lease.devices:
                users.setdefault(grant.uuid, set()).add(lease.user)
    return {uuid: sorted(names) for uuid, names in users.items()}


def _sample_json(sample: Sample) -> dict[str, Any]:
    data = sample.to_json()
    for key in ("uuid", "node", "gpu_index", "mig_profile"):  # said once per device
        del data[key]
    return data


def _authorization_header(authorization: Annotated[str | None, Header()] = None) -> str | None:
    return authorization
