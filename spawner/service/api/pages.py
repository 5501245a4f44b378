"""The pages at ``{prefix}`` (``/services/gpupool/``): the admin dashboard and a user's own usage page.

An administrator (``custom:gpupool:admin``) sees the pool as nodes → GPUs → MIG slices and shares with who
holds what and each device's health, a utilisation heat map from the latest samples (each square labelled),
the queue, servers beside jobs, and the held devices that have been idle (at or below the culler's
``GPUPOOL_GPU_IDLE_THRESHOLD`` for at least ``idle_after`` seconds, with fresh readings as the culler wants
them: what the dashboard calls idle is what culling calls idle), and the MIG layouts advised for the leases
and queue (:mod:`.mig_routes`); the admin's console (:mod:`.admin_console`) adds buttons that drain, release and
cancel through the REST API. Any other user with access to the service
sees their own leases, their devices' latest readings, their idle devices and their GPU-hours held against
used, and no buttons. Both pages carry the hub's navigation bar.

Authentication: a browser logged in to the hub is let in through JupyterHub's OAuth (:mod:`.browser_login`:
no token to paste; the hub decides who the caller is and whether they are an admin). Scripts may send a
JupyterHub API token as ``?token=…`` or in the ``Authorization`` header instead. Every request is checked
with the hub like an API call (:class:`.auth.Authenticator`); the page's script refreshes it every few
seconds from the same address.

``GET {prefix}my/warnings`` answers the caller's pending cull warnings as JSON for the hub's home page
(``hub_config/templates/home.html``), through the same login.

:data:`router` holds ``GET /`` and ``GET /my/warnings``; the app includes it under the prefix (without its
trailing slash), and includes the login's own router (its OAuth callback) beside it. What the pages read
(manager, telemetry, usage, culls, login, ``idle_after``, clock) comes from :class:`.context.ServiceParts`.

Pure HTML building lives in :mod:`.page_html`; :func:`held_idle` is the idle finder, pure too.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
import html
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response, status
from fastapi.responses import HTMLResponse, JSONResponse

from ...inventory import describe_pool
from ...mig_report import advice_html, describe_advice
from ...pool.expected_start import in_words, time_of_day
from ...pool.job_states import Job, JobState
from ...pool.leases import Lease, LeaseState
from ...pool.requests import describe
from ...telemetry.activity import DEFAULT_THRESHOLD_PERCENT
from ...telemetry.aggregates import MinuteAggregate
from ...telemetry.samples import Sample
from .admin_console import CONSOLE_SCRIPT, JobRow, ServerRow, device_controls, hub_nav, servers_and_jobs
from .auth import TOKEN_COOKIE, Caller
from .context import PartsDep, ServiceParts
from .idle_routes import stale_after
from .mig_routes import LIVE_SOURCE, live_advice
from .page_html import (
    IdleDevice,
    QueuedLease,
    cull_list,
    device_cell,
    heat_map,
    host_table,
    idle_list,
    my_jobs_table,
    page,
    pool_tree,
    queue_table,
    section,
    summary_line,
    usage_table,
)


@dataclass(frozen=True)
class HeldDevice:
    """A device a granted lease holds, as the idle finder needs it."""

    uuid: str
    label: str
    user: str
    lease_id: str
    granted_at: float


class RecentSamples(Protocol):
    def recent(self, uuid: str, since: float | None = None) -> list[Sample]: ...


def held_idle(
    held: Iterable[HeldDevice],
    history: RecentSamples,
    minutes: Iterable[MinuteAggregate],
    *,
    threshold: float = DEFAULT_THRESHOLD_PERCENT,
    min_seconds: float = 60.0,
    max_gap: float = 10.0,
    now: float | None = None,
    stale_after: float = float("inf"),
) -> list[IdleDevice]:
    """Held devices whose utilisation stayed at or below ``threshold`` percent (the culler's, by default) from
    some time up to their latest sample, for at least ``min_seconds``, longest first. The span runs back
    through the recent samples and, past them, through contiguous per-minute aggregates of the same lease that
    were idle too. A device whose utilisation is not available, or whose latest sample is more than
    ``stale_after`` seconds older than ``now`` (the sampler stopped), is never called idle: the culler calls it
    unknown."""
    by_device: dict[tuple[str, str], list[MinuteAggregate]] = {}
    for aggregate in minutes:
        if aggregate.holder is not None:
            by_device.setdefault((aggregate.uuid, aggregate.holder.lease_id), []).append(aggregate)
    found = []
    for device in held:
        samples = history.recent(device.uuid, device.granted_at - 1e-9)
        if not samples or (now is not None and now - samples[-1].time > stale_after):
            continue
        idle_tail = []
        for sample in reversed(samples):
            util = sample.gpu_utilization
            if util is None or util > threshold:
                break
            idle_tail.append(util)
        if not idle_tail:
            continue
        latest = samples[-1]
        since, peak = samples[-len(idle_tail)].time, max(idle_tail)
        whole_buffer = len(idle_tail) == len(samples)
        if whole_buffer:
            ordered = sorted(by_device.get((device.uuid, device.lease_id), []), key=lambda a: -a.minute)
            for aggregate in ordered:
                if aggregate.minute >= since:
                    continue
                if aggregate.minute + 60 < since - max_gap:
                    break  # a hole in the record: idleness before it is not known to continue
                if aggregate.seconds_unknown or aggregate.utilization_max is None:
                    break
                if aggregate.utilization_max > threshold:
                    break
                since, peak = aggregate.minute, max(peak, aggregate.utilization_max)
        since = max(since, device.granted_at)
        seconds = latest.time - since
        if seconds >= min_seconds:
            found.append(IdleDevice(device.uuid, device.label, device.user, device.lease_id, seconds, peak))
    return sorted(found, key=lambda i: -i.seconds)


def device_labels(pool: Mapping[str, Any]) -> dict[str, str]:
    """UUID -> ``H100-80GB #5 (node-a)`` or ``MIG 3g.40gb on A100 #2 (node-a)``."""
    labels = {}
    for node in pool["nodes"]:
        for gpu in node["gpus"]:
            name = f"{gpu['product']} #{gpu['index']} ({node['name']})"
            labels[gpu["uuid"]] = name
            for instance in gpu["mig"]:
                labels[instance["uuid"]] = f"MIG {instance['profile']} on {name}"
    return labels


def holder_phrase(lease: Lease) -> str:
    """Who holds a lease, in a sentence: ``alice's server``, ``alice's server big``, ``alice's job x``."""
    what = "job" if lease.owner_kind == "job" else "server"
    return f"{lease.user}'s {what}" + (f" {lease.owner_name}" if lease.owner_name else "")


def holder_name(lease: Lease) -> str:
    """Who holds a lease, as the pages say it: ``alice``, ``alice/big`` (a named server), ``alice · job x``."""
    if lease.owner_kind == "job":
        return f"{lease.user} · job {lease.owner_name}"
    return f"{lease.user}/{lease.owner_name}" if lease.owner_name else lease.user


router = APIRouter()


async def browser_caller(
    request: Request,
    parts: PartsDep,
    token: Annotated[str | None, Query(description="a JupyterHub API token")] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> Caller | None:
    """The caller, or None when the browser must log in first (no credentials, and a login to send it to)."""
    login = parts.login
    if token:
        authorization = f"token {token}"
    if login is not None and authorization is None and not request.cookies.get(TOKEN_COOKIE):
        return None
    try:
        return await parts.auth.caller(request, authorization)
    except HTTPException as error:
        if error.status_code == status.HTTP_403_FORBIDDEN and login is not None and not authorization:
            return None  # the cookie's token expired or was revoked: log in again
        raise


BrowserCaller = Annotated[Caller | None, Depends(browser_caller)]


@router.get("/my/warnings", include_in_schema=False)
async def my_warnings(request: Request, parts: PartsDep, caller: BrowserCaller) -> Response:
    """The caller's pending cull warnings, for the hub's home page."""
    if caller is None:
        return _log_in(parts, request)
    warnings = parts.culls.pending(parts.clock(), caller.name)
    return JSONResponse([asdict(w) | {"holds_gpus": _holds_gpus(parts, w.lease_id)} for w in warnings])


def _holds_gpus(parts: ServiceParts, lease_id: str | None) -> bool:
    """Whether the warned server's lease holds GPUs (what the home page says goes back to the pool)."""
    try:
        return bool(lease_id and parts.manager.get(lease_id).devices)
    except LookupError:
        return False


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def dashboard(request: Request, parts: PartsDep, caller: BrowserCaller) -> Response:
    """The admin dashboard, or the caller's own page (its GPU-hours are the stored ones ``GET usage`` reports)."""
    if caller is None:
        return _log_in(parts, request)
    view = _gather(parts)
    telemetry = parts.telemetry
    simulated = telemetry.simulated if telemetry.history.last_time is not None else parts.simulated
    if caller.is_admin:
        title, body, script = "gpupool — pool", _admin_body(parts, view), CONSOLE_SCRIPT
    else:  # no buttons and no script: the routes would refuse their requests anyway
        title, body, script = f"gpupool — {caller.name}", _user_body(parts, view, caller.name), ""
    cookie = request.cookies.get(TOKEN_COOKIE)
    return HTMLResponse(
        page(
            title,
            body,
            simulated=simulated,
            nav=hub_nav(parts.auth.hub_auth.hub_prefix, caller.name, hub_admin=caller.hub_admin),
            xsrf=parts.auth.xsrf_token(cookie) if cookie else "",  # the console's, with the login cookie
            script=script,
        )
    )


def _log_in(parts: ServiceParts, request: Request) -> Response:
    assert parts.login is not None  # browser_caller says "log in" only when there is a login
    return parts.login.start(request)


@dataclass(frozen=True)
class _View:
    """What both pages show, read once per request."""

    pool: dict[str, Any]
    leases: list[Lease]
    latest: dict[str, dict[str, Any]]
    idle: list[IdleDevice]
    note: str  # how the idle sections' headings say "idle"


def _gather(parts: ServiceParts) -> _View:
    manager, telemetry = parts.manager, parts.telemetry
    pool = manager.inspect(lambda state: describe_pool(state, parts.backend, parts.source))
    leases = manager.all_leases(active_only=True)
    latest = {u: s.to_json() for u, s in telemetry.history.latest_all().items()}
    labels = device_labels(pool)
    threshold = parts.tracker.threshold  # the culler's (GPUPOOL_GPU_IDLE_THRESHOLD): idle here is idle there
    held = [
        HeldDevice(g.uuid, labels.get(g.uuid, g.label), holder_name(lease), lease.id, lease.granted_at or 0)
        for lease in leases
        if lease.state is LeaseState.GRANTED
        for g in lease.devices
    ]
    idle = held_idle(
        *(held, telemetry.history, telemetry.minutes),
        threshold=threshold,
        min_seconds=parts.idle_after,
        now=parts.clock(),
        stale_after=stale_after(telemetry),  # a stopped sampler: unknown to the culler, so not idle here
    )
    note = f"at most {threshold:g}% for at least {parts.idle_after / 60:g} min"
    return _View(pool, leases, latest, idle, note)


def _admin_body(parts: ServiceParts, view: _View) -> str:
    """The whole pool: utilisation heat map, idle devices, the queue, servers beside jobs, and the pool tree,
    with the console's buttons."""
    users_of = {lease.id: holder_name(lease) for lease in view.leases}
    phrases = {lease.id: holder_phrase(lease) for lease in view.leases}
    now = parts.clock()
    queue = sorted(
        (
            QueuedLease(
                parts.manager.position(x.id) or 0,
                x.user,
                x.profile,
                describe(x.request),
                now - x.created_at,
                x.id,
            )
            for x in view.leases
            if x.state is LeaseState.QUEUED
        ),
        key=lambda q: q.position,
    )
    return (
        f'<p class="summary">{summary_line(view.pool["summary"])}</p>'
        + section("Utilisation", heat_map(view.pool, view.latest, phrases), "heat")
        + section(f"Held but idle ({view.note})", idle_list(view.idle, view.note), "idle")
        + section("Queue", queue_table(queue), "queue")
        + section("Culls", cull_list(parts.culls, now), "culls")
        + servers_and_jobs(_servers(view, now), _jobs(parts, now), parts.api_base)
        + _host_section(parts, view)
        + _mig_section(parts, view)
        + section(
            "Pool", pool_tree(view.pool, users_of, view.latest, device_controls(parts.api_base)), "pool"
        )
    )


def _mig_section(parts: ServiceParts, view: _View) -> str:
    """MIG layouts advised from the leases and the queue (admins only; none when no GPU is in MIG mode)."""
    if not any(gpu["mode"] == "mig" for node in view.pool["nodes"] for gpu in node["gpus"]):
        return ""
    description = describe_advice(live_advice(parts.manager, parts.profiles), LIVE_SOURCE)
    return section("MIG advice", advice_html(description), "mig-advice")


def _servers(view: _View, now: float) -> list[ServerRow]:
    labels = device_labels(view.pool)
    return [
        ServerRow(
            lease.user,
            lease.owner_name,
            lease.profile,
            lease.state.value,
            ", ".join(labels.get(g.uuid, g.label) for g in lease.devices),
            now - lease.created_at,
            lease.id,
        )
        for lease in view.leases
        if lease.owner_kind != "job"
    ]


def _jobs(parts: ServiceParts, now: float) -> list[JobRow]:
    """Jobs not finished, running first, then the queue by submission."""
    jobs = parts.jobs.unfinished()
    jobs.sort(key=lambda j: (j.state is not JobState.RUNNING, j.submitted_at))
    return [JobRow(j.id, j.name, j.user, j.profile, j.state.value, now - j.submitted_at) for j in jobs]


def _host_section(parts: ServiceParts, view: _View) -> str:
    """Each running server's and job's CPU and memory against its limits (not on Kubernetes: the kubelet's)."""
    if parts.host_usage is None:
        return ""
    rows = [
        (holder_name(lease), lease.profile, lease.id, parts.host_use(lease))
        for lease in view.leases
        if lease.state is LeaseState.GRANTED
    ]
    title = "CPU and memory" + (
        "" if parts.host_usage.host.enforced else " (limits not enforced on this host)"
    )
    return section(title, host_table(rows), "host")


def _user_body(parts: ServiceParts, view: _View, user: str) -> str:
    """One user's devices, their unfinished jobs, their idle devices and their GPU-hours, then the pool's
    summary line."""
    mine = [x for x in view.leases if x.user == user]
    now = parts.clock()
    jobs = [
        (j.id, j.name, j.profile, j.state.value, _why(parts, j, now))
        for j in parts.jobs.unfinished()
        if j.user == user
    ]
    return (
        section("My devices", _my_devices(mine, view.latest, device_labels(view.pool)), "mine")
        + section("My jobs", my_jobs_table(jobs), "my-jobs")
        + section(
            f"Idle ({view.note})",
            idle_list([i for i in view.idle if i.lease_id in {x.id for x in mine}], view.note),
            "idle",
        )
        + section("My usage (GPU-hours)", usage_table(_my_usage(parts, user)), "usage")
        + f'<p class="summary">{summary_line(view.pool["summary"])}</p>'
    )


def _why(parts: ServiceParts, job: Job, now: float) -> str:
    """A waiting job's place and expected start, as its lease says them; else its state's reason."""
    position = parts.jobs.position(job)
    if position is None or job.lease_id is None:
        return job.reason
    start = parts.manager.expected_start(job.lease_id)
    return f"#{position + 1} in the queue, {in_words(start, now, time_of_day)}; {job.reason}"


def _my_usage(parts: ServiceParts, user: str) -> list[tuple[str, float, float, float]]:
    return [
        (r.profile, r.gpu_hours_held, r.gpu_hours_used, r.gpu_hours_unknown)
        for r in parts.usage.report(0, parts.clock() + 60, user=user)
    ]


def _my_devices(
    leases: Iterable[Lease], latest: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str]
) -> str:
    rows = []
    for lease in leases:
        if lease.state is LeaseState.QUEUED:
            rows.append(
                f"<li>{html.escape(lease.profile)}: waiting in the queue (lease {html.escape(lease.id)})</li>"
            )
            continue
        cells = "".join(
            device_cell(
                labels.get(g.uuid, g.label), g.uuid, [holder_name(lease)], "healthy", latest.get(g.uuid)
            )
            for g in lease.devices
        )
        rows.append(
            f"<li>{html.escape(lease.profile)} (lease {html.escape(lease.id)}){cells or ' — no GPU'}</li>"
        )
    return f"<ul>{''.join(rows)}</ul>" if rows else "<p>You hold no devices now.</p>"
