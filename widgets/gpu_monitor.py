"""``GpuMonitor()``: live cards for the devices of this server's lease, refreshed without blocking the kernel.

A server that gpupool spawned has ``GPUPOOL_LEASE_ID`` in its environment; the monitor reads that lease's
devices (whole GPUs, MIG slices, GPU shares), then every ``refresh`` seconds the service's recent samples of
them (``GET telemetry``, only the new ones), what the pool has free (``GET pool``), any pending idle
warning (:func:`fetch_warnings`) and the server's CPU and memory against its profile's limits
(:func:`fetch_resources`). Each card shows utilisation, memory, temperature and power, each with a
sparkline of the last ten minutes; a metric the device cannot report reads "N/A", never 0. Numbers from a
simulated pool (a pool file's, or the nodes of ``gpupool kube up``) are labelled "simulated".

What the monitor shows is built by plain functions (:func:`sparkline_svg`, :func:`device_card`,
:func:`pool_free_line`, :func:`monitor_html`), tested without a kernel or a browser; the widget only holds
their output.
"""

from __future__ import annotations

import asyncio
import html
import os
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import ipywidgets as w  # type: ignore[import-untyped]
from traitlets import Float, Unicode, default, observe

from ._api import Connection, GpupoolError, shares_worth
from .poller import Poller

WAITING = "waiting for the gpupool service…"
REPLACED = "replaced by a newer GpuMonitor (a cell ran again): this one no longer refreshes"

WINDOW_SECONDS = 600.0  # the sparklines' span
MAX_POINTS = 600  # samples kept per device (10 minutes at 1 s)
_MIB_PER_GIB = 1024
NA = "N/A"


def _percent(value: float) -> str:
    return f"{value:.0f}%"


def _celsius(value: float) -> str:
    return f"{value:.0f} °C"


def _watts(value: float) -> str:
    return f"{value:.0f} W"


def sparkline_svg(
    points: Sequence[tuple[float, float | None]],
    *,
    now: float,
    window: float = WINDOW_SECONDS,
    top: float | None = None,
    width: int = 160,
    height: int = 28,
) -> str:
    """An inline SVG line of ``(time, value)`` over the ``window`` seconds before ``now``; a value of None
    (not available) breaks the line rather than drawing a 0. ``top`` fixes the scale (100 for percentages);
    None scales to the largest value. No points with values: an empty frame."""
    start = now - window
    shown = [(t, v) for t, v in points if t >= start]
    values = [v for _, v in shown if v is not None]
    scale = top if top is not None else max(values, default=0.0)
    scale = scale if scale > 0 else 1.0
    runs: list[list[str]] = [[]]
    for t, v in shown:
        if v is None:
            if runs[-1]:
                runs.append([])
            continue
        x = (t - start) / window * width
        y = height - 1 - min(max(v / scale, 0.0), 1.0) * (height - 2)
        runs[-1].append(f"{x:.1f},{y:.1f}")
    lines = "".join(
        f'<polyline points="{" ".join(run)}" fill="none" stroke="#2b7bb9" stroke-width="1.5"/>'
        for run in runs
        if run
    )
    return (
        f'<svg class="gpupool-spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg"><rect width="{width}" height="{height}" fill="#f4f6f8"/>'
        f"{lines}</svg>"
    )


def _memory_line(sample: Mapping[str, Any] | None, memory_mib: float | None) -> str:
    used = sample.get("memory_used_mib") if sample else None
    total = (sample.get("memory_total_mib") if sample else None) or memory_mib
    if used is None:
        return NA if total is None else f"{NA} / {total / _MIB_PER_GIB:.1f} GiB"
    if total is None:
        return f"{used / _MIB_PER_GIB:.1f} GiB / {NA}"
    return f"{used / _MIB_PER_GIB:.1f} / {total / _MIB_PER_GIB:.1f} GiB"


def _power_line(sample: Mapping[str, Any] | None) -> str:
    power = sample.get("power_w") if sample else None
    if power is None:
        return NA
    limit = sample.get("power_limit_w") if sample else None
    return _watts(power) + (f" / {limit:.0f} W" if limit is not None else "")


def device_title(device: Mapping[str, Any]) -> str:
    """``node · GPU 2 · MIG 3g.40gb`` (or ``… · share 50%`` for a fraction of a GPU)."""
    parts = [str(device.get("node") or "?"), f"GPU {device.get('gpu', '?')}"]
    if device.get("mig_profile"):
        parts.append(f"MIG {device['mig_profile']}")
    milli = device.get("milli")
    if not device.get("mig_profile") and milli is not None and milli < 1000:
        parts.append(f"share {milli / 10:g}%")
    return " · ".join(parts)


def device_card(
    device: Mapping[str, Any], samples: Sequence[Mapping[str, Any]], *, now: float, out: str | None = None
) -> str:
    """One device's card: title, UUID, what an admin's mark on it means (``out``: "unhealthy" or "drained"),
    and per metric its latest value (or "N/A") with a sparkline."""
    latest = samples[-1] if samples else None

    def series(key: str) -> list[tuple[float, float | None]]:
        return [(float(s["time"]), s.get(key)) for s in samples]

    def value(key: str, fmt: Any) -> str:
        reading = latest.get(key) if latest else None
        return NA if reading is None else str(fmt(reading))

    total = (latest.get("memory_total_mib") if latest else None) or device.get("memory_mib")
    rows = [
        ("Utilisation", value("gpu_utilization", _percent), sparkline_svg(
            series("gpu_utilization"), now=now, top=100.0)),
        ("Memory", _memory_line(latest, device.get("memory_mib")), sparkline_svg(
            series("memory_used_mib"), now=now, top=float(total) if total else None)),
        ("Temperature", value("temperature_c", _celsius), sparkline_svg(
            series("temperature_c"), now=now, top=100.0)),
        ("Power", _power_line(latest), sparkline_svg(
            series("power_w"), now=now, top=latest.get("power_limit_w") if latest else None)),
    ]  # fmt: skip
    body = "".join(
        f'<tr><th>{name}</th><td class="gpupool-value{" gpupool-na" if shown.startswith(NA) else ""}">'
        f"{html.escape(shown)}</td><td>{spark}</td></tr>"
        for name, shown, spark in rows
    )
    return (
        f'<div class="gpupool-card"><div class="gpupool-card-title">{html.escape(device_title(device))}</div>'
        f'<div class="gpupool-uuid">{html.escape(str(device.get("uuid", "")))}</div>'
        f"{_out_note(out)}"
        f'<table class="gpupool-metrics">{body}</table></div>'
    )


# what a researcher on a device an admin took out of the pool reads on its card (a failure trial saw nothing)
OUT_OF_POOL = {
    "unhealthy": "This GPU was marked failed: nothing new is placed on it. What runs here keeps running; save "
    "your work and restart your server to move to a healthy GPU.",
    "drained": "This GPU was drained for maintenance: nothing new is placed on it. What runs here keeps "
    "running; save your work and restart your server when you can.",
}


def _out_note(out: str | None) -> str:
    if out is None:
        return ""
    said = OUT_OF_POOL.get(out, f"This GPU is {out}: nothing new is placed on it.")
    return f'<div class="gpupool-warning">{html.escape(said)}</div>'


def out_of_pool(pool: Mapping[str, Any]) -> dict[str, str]:
    """Device UUID (a GPU, or a MIG slice of it) -> ``unhealthy`` or ``drained``, from ``GET pool``, for each
    device that a mark on it or on its node takes out of the pool (its ``out``)."""
    return {
        str(uuid): gpu["out"]
        for node in pool.get("nodes", [])
        for gpu in node.get("gpus", [])
        if gpu.get("out")
        for uuid in (gpu.get("uuid"), *(m.get("uuid") for m in gpu.get("mig") or ()))
    }


def pool_free_line(summary: Mapping[str, Any]) -> str:
    """What the pool has free right now, from ``GET pool``'s summary, in one sentence."""
    whole = int(summary.get("whole_gpus_free", 0))
    mig = ", ".join(f"{p} ×{n}" for p, n in (summary.get("mig_slices_free") or {}).items()) or "none"
    shares = shares_worth(float(summary.get("shared_milli_free", 0)))
    return f"Pool free now: {whole} whole GPU{'' if whole == 1 else 's'}; MIG slices {mig}; {shares}"


def warning_lines(warnings: Iterable[Mapping[str, Any]], *, now: float, lease_id: str | None = None) -> str:
    """Pending cull warnings (the service's ``GET warnings``) as HTML, one line each: when the server will be
    stopped and why. With ``lease_id``, only the warnings of that lease (or naming none). Empty when none."""
    lines = []
    for warning in warnings:
        if lease_id and warning.get("lease_id") not in (None, lease_id):
            continue
        cull_at = warning.get("cull_at")
        when = "soon"
        if isinstance(cull_at, (int, float)):
            left = cull_at - now
            when = f"in {left / 60:.0f} min" if left >= 60 else ("in under a minute" if left > 0 else "now")
            when += time.strftime(" (at %H:%M)", time.localtime(cull_at))  # the server's clock, as the log's
        reason = str(warning.get("reason") or "idle")
        text = f"This server will be stopped {when}: {reason}"
        lines.append(f'<div class="gpupool-warning">⚠ {html.escape(text)}</div>')
    return "".join(lines)


def resources_line(resources: Mapping[str, Any] | None) -> str:
    """The server's CPU and memory against its profile's limits, from ``GET leases/{id}/resources``:
    "CPU 1.2 of 4 cores · memory 3.1 of 16.0 GiB"; a dash where the use is not known (yet)."""
    if not resources:
        return ""
    cpu = resources.get("cpu_used")
    memory = resources.get("memory_used_mib")
    used_cpu = "–" if cpu is None else f"{cpu:.1f}"
    used_memory = "–" if memory is None else f"{memory / 1024:.1f}"
    held_by = {"kubernetes": " (limits held by Kubernetes)", "none": " (limits not enforced on this host)"}
    return (
        f"CPU {used_cpu} of {resources['cpu_limit']:g} cores · memory {used_memory} of "
        f"{resources['memory_limit_mib'] / 1024:.1f} GiB{held_by.get(str(resources.get('limits_by')), '')}"
    )


async def fetch_resources(connection: Connection, lease_id: str) -> dict[str, Any] | None:
    """``GET leases/{id}/resources``; None from a service that has no such route (an older one)."""
    try:
        return dict(await connection.acall("GET", f"leases/{lease_id}/resources"))
    except GpupoolError as error:
        if error.status in (404, 405):
            return None
        raise


def monitor_html(
    devices: Sequence[Mapping[str, Any]] | None,
    samples: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    now: float,
    simulated: bool | None,
    pool_line: str = "",
    warnings: str = "",
    message: str = "",
    host_line: str = "",
    waiting: Sequence[str] = (),
    out: Mapping[str, str] | None = None,
) -> str:
    """The whole monitor: the simulated label, warnings, one card per device, the pool line, a message.
    ``devices`` None: not known yet (no answer from the service so far), so no cards and no "no GPU".
    ``waiting``: what each followed lease still in the queue says (its place and expected start); ``out``:
    :func:`out_of_pool`."""
    head = '<span class="gpupool-simulated">simulated</span> ' if simulated else ""
    out = out or {}
    cards = "".join(
        device_card(d, samples.get(str(d["uuid"]), ()), now=now, out=out.get(str(d["uuid"])))
        for d in devices or ()
    )
    if devices is not None and not devices and not waiting:
        cards = "<p>This server holds no GPU (its lease has no devices).</p>"
    cards += "".join(f'<p class="gpupool-waiting">{html.escape(line)}</p>' for line in waiting)
    note = f'<div class="gpupool-message">{html.escape(message)}</div>' if message else ""
    return (
        f'<style>{_CSS}</style><div class="gpupool-monitor-body">{head}{warnings}'
        f'<div class="gpupool-cards">{cards}</div>'
        f'<div class="gpupool-host">{html.escape(host_line)}</div>'
        f'<div class="gpupool-pool">{html.escape(pool_line)}</div>{note}</div>'
    )


SIMULATED_STYLE = "background:#fd7;padding:1px 6px;border-radius:4px"  # the "simulated" label, JobPanel's too
_CSS = (
    ".gpupool-cards{display:flex;flex-wrap:wrap;gap:8px}"
    ".gpupool-card{border:1px solid #ccd;border-radius:6px;padding:6px 10px;background:#fff}"
    ".gpupool-card-title{font-weight:bold}.gpupool-uuid{font-size:80%;color:#667}"
    ".gpupool-metrics th{text-align:left;padding-right:8px}.gpupool-value{min-width:9em}"
    f".gpupool-na{{color:#999}}.gpupool-simulated{{{SIMULATED_STYLE}}}"
    ".gpupool-warning{background:#fee;border:1px solid #c66;padding:4px;margin:4px 0}"
)


async def fetch_warnings(connection: Connection) -> list[dict[str, Any]]:
    """The caller's pending cull warnings from ``GET warnings``; a service without that endpoint (404, an
    older service) means no warnings, not an error."""
    try:
        answer = await connection.acall("GET", "warnings")
    except GpupoolError as error:
        if error.status in (404, 405):
            return []
        raise
    items = answer.get("warnings", []) if isinstance(answer, dict) else answer
    return [dict(item) for item in items if isinstance(item, Mapping)]


async def _nothing() -> None:
    return None


class GpuMonitor(w.VBox):  # type: ignore[misc]  # ipywidgets is untyped
    """The monitor; display it as a cell's last expression. ``close()`` stops its refreshing.

    It returns at once: every call to the service is a task on the kernel's event loop (see
    :mod:`.poller`), and until the first answer the monitor says it is waiting. One monitor refreshes per
    kernel: a new one (a cell run again) stops the previous one's refreshing.
    """

    refresh = Float(1.5, min=0.1, help="Seconds between refreshes, e.g. ``GpuMonitor(refresh=5)``.")
    lease_id = Unicode(
        help="The lease whose devices to show (default: ``$GPUPOOL_LEASE_ID``, the server's own); empty shows "
        'every device of the user\'s granted leases, e.g. ``GpuMonitor(lease_id="")``.',
    )

    @default("lease_id")
    def _default_lease_id(self) -> str:
        return os.environ.get("GPUPOOL_LEASE_ID", "")

    def __init__(self, connection: Connection | None = None, **traits: Any) -> None:
        if traits.get("lease_id", "") is None:  # the old spelling of "the default"
            del traits["lease_id"]
        self._poller: Poller | None = None  # first: ipywidgets calls close() when __init__ fails
        self.connection = connection or Connection()
        self.devices: list[dict[str, Any]] | None = None  # None until the service has answered
        self.samples: dict[str, deque[dict[str, Any]]] = {}
        self.simulated: bool | None = None
        self.waiting: list[str] = []  # what followed leases still queued say: their place and expected start
        self.out: dict[str, str] = {}  # the devices taken out of the pool (out_of_pool)
        self.updates = 0  # completed refreshes, for tests and the curious
        self._since: float | None = None
        self.view = w.HTML()
        super().__init__([self.view], **traits)
        self._show(WAITING)
        self.add_class("gpupool-gpu-monitor")
        self._poller = Poller("gpu-monitor", self.update, lambda: self.refresh, self._replaced)
        self._poller.start()

    @observe("lease_id")
    def _lease_changed(self, _change: Any) -> None:
        """Another lease: forget the old one's devices and samples, and show the new one now."""
        self.devices, self.samples, self._since = None, {}, None
        if self._poller is not None:
            self._poller.poke()

    async def _lease_devices(self) -> list[dict[str, Any]]:
        if self.lease_id:
            leases = [await self.connection.acall("GET", f"leases/{self.lease_id}")]
        else:
            leases = list(await self.connection.acall("GET", "leases", params={"active_only": True}))
        self.waiting = [
            str(lease.get("waiting_message") or "") for lease in leases if lease.get("state") == "queued"
        ]
        return [
            dict(d) for lease in leases if lease.get("state") == "granted" for d in lease.get("devices", [])
        ]

    def _take_samples(self, telemetry: Mapping[str, Any]) -> None:
        self.simulated = telemetry.get("simulated")
        by_uuid = {str(d["uuid"]): d for d in telemetry.get("devices", [])}
        for device in self.devices or ():
            found = by_uuid.get(str(device["uuid"]))
            if found is None:
                continue
            for key in ("node", "gpu", "mig_profile"):
                device.setdefault(key, found.get(key))
            kept = self.samples.setdefault(str(device["uuid"]), deque(maxlen=MAX_POINTS))
            kept.extend(found.get("samples", []))
            if kept:
                self._since = max(self._since or 0.0, float(kept[-1]["time"]))

    async def update(self) -> None:
        """Read the lease, new samples, the pool and warnings once, and show them (or what went wrong)."""
        message = pool_line = warnings = host_line = ""
        try:
            # a granted lease never changes its devices; a queued one, or "all my leases", may
            if not self.devices or not self.lease_id or self.waiting:
                self.devices = await self._lease_devices()
            params = {"since": self._since} if self._since is not None else {}
            telemetry, pool, pending, resources = await asyncio.gather(
                self.connection.acall("GET", "telemetry", params=params),
                self.connection.acall("GET", "pool"),
                fetch_warnings(self.connection),
                fetch_resources(self.connection, self.lease_id) if self.lease_id else _nothing(),
            )
            self._take_samples(telemetry)
            host_line = resources_line(resources)
            pool_line = pool_free_line(pool.get("summary", {}))
            self.out = out_of_pool(pool)
            warnings = warning_lines(pending, now=time.time(), lease_id=self.lease_id)
        except GpupoolError as error:
            message = str(error)
        self._show(message, pool_line, warnings, host_line)
        self.updates += 1

    def _show(self, message: str, pool_line: str = "", warnings: str = "", host_line: str = "") -> None:
        self.view.value = monitor_html(
            self.devices,
            {u: list(s) for u, s in self.samples.items()},
            now=self._since if self._since is not None else 0.0,
            simulated=self.simulated,
            pool_line=pool_line,
            warnings=warnings,
            message=message,
            host_line=host_line,
            waiting=self.waiting,
            out=self.out,
        )

    def _replaced(self) -> None:
        self._show(REPLACED)

    def close(self) -> None:
        if self._poller is not None:
            self._poller.stop()
        super().close()
