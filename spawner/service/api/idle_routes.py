"""What the idle culler asks the service: a server's GPU activity and its profile's limits, and cull warnings.

The culler's hook (:mod:`gpupool.spawner.hub.cull`) runs in another process and sees only the hub's server
model, so the service answers what only it knows:

- ``GET {prefix}api/v1/activity/leases/{id}`` and ``GET {prefix}api/v1/activity/users/{user}?server=NAME``:
  the lease, its profile's ``idle_timeout``, ``gpu_idle_timeout`` and ``max_lifetime`` (the service's
  profiles file is the one source of them), and its devices' activity from the telemetry history: ``busy``,
  ``idle`` with the seconds since every device was last above ``GPUPOOL_GPU_IDLE_THRESHOLD`` percent
  (default 10), ``unknown`` when some device has no fresh utilisation (never to be taken for idle), or
  ``none`` for a lease without devices.
- ``POST {prefix}api/v1/warnings``: the hook records "this server will be culled at T because …" before it
  culls; ``GET {prefix}api/v1/warnings`` lists the pending ones (for ``GpuMonitor`` and the hub's pages);
  ``DELETE {prefix}api/v1/warnings/{user}?server=NAME`` withdraws one when the server is active again.
- ``POST {prefix}api/v1/culls``: the hook reports the cull itself as it orders it, with the limit reached;
  kept in the store once per lease and counted in ``gpupool_culls_total{limit=…}`` on the metrics page.
  ``GET {prefix}api/v1/culls?since=&user=&limit=`` lists the kept ones, newest first.

Warnings live in memory: a restarted service forgets them, so the hook warns again and the cull comes one
warning period later, the safe direction. A warning whose lease has been released is dropped when read.

Who may do what: reading activity, warnings and culls needs a token allowed to see the user (users their
own, ``custom:gpupool:admin`` and ``custom:gpupool:leases`` everyone's); recording and withdrawing warnings
and reporting culls needs ``custom:gpupool:admin`` or ``custom:gpupool:leases`` (the culler's role).
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
import asyncio
import logging
from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, Field

from ...pool.leases import Lease
from ...telemetry.activity import ActivityTracker
from ..leasing.culls import CullLimit, CullWarning
from ..store.cull_store import CullRecord
from ..telemetry.telemetry_loop import Telemetry
from .auth import Caller
from .context import CallerDep, PartsDep, ServiceParts, manager
from .instants import INSTANT, unix_seconds

log = logging.getLogger(__name__)


class WarningIn(BaseModel):
    """``POST warnings``: the culler says it will stop a server, when and why."""

    user: str = Field(min_length=1)
    server: str = Field("", description="the server's name; empty for the default server")
    lease_id: str | None = Field(None, description="the server's lease; the warning ends with it")
    cull_at: float = Field(
        strict=True,
        allow_inf_nan=False,
        description="when the server will be stopped at the earliest (epoch s)",
    )
    reason: str = Field(min_length=1, description="why, in words a user reads")


class CullIn(BaseModel):
    """``POST culls``: the culler says it is stopping a server now, and which limit it reached."""

    user: str = Field(min_length=1)
    server: str = Field("", description="the server's name; empty for the default server")
    lease_id: str | None = Field(None, description="the server's lease")
    limit: CullLimit = Field(description="the profile limit the server reached")
    reason: str = Field(min_length=1, description="why, in words a user reads")


router = APIRouter()


def stale_after(telemetry: Telemetry) -> float:
    """Seconds after which a device's latest reading counts as none: a reading older than a few sampling
    periods means the sampler stopped (unknown, never idle). The dashboard's idle list uses it too."""
    return max(15.0, 5 * telemetry.interval) if telemetry.interval > 0 else -1.0


def activity_of(parts: ServiceParts, lease: Lease) -> dict[str, Any]:
    """A lease's GPU activity as the culler reads it, with its profile's limits."""
    telemetry, tracker = parts.telemetry, parts.tracker
    tracker.fold(telemetry.history)
    now = parts.clock()
    since = lease.granted_at if lease.granted_at is not None else lease.created_at
    uuids = [g.uuid for g in lease.devices]
    gpu = tracker.activity(uuids, since=since, now=now, stale_after=stale_after(telemetry))
    profile = parts.profile(lease.profile)
    return {
        "lease_id": lease.id,
        "state": lease.state.value,
        "user": lease.user,
        "owner_kind": lease.owner_kind,
        "owner_name": lease.owner_name,
        "profile": lease.profile,
        "granted_at": lease.granted_at,
        "devices": [g.uuid for g in lease.devices],
        "limits": {
            "idle_timeout": profile.idle_timeout if profile else None,
            "gpu_idle_timeout": profile.gpu_idle_timeout if profile else None,
            "max_lifetime": profile.max_lifetime if profile else None,
        },
        "gpu": {
            "state": gpu.state.value,
            "idle_seconds": gpu.idle_seconds,
            "last_busy_at": gpu.last_busy_at,
            "threshold_percent": tracker.threshold,
            "simulated": telemetry.simulated,
        },
        "time": now,
    }


def _may_see(caller: Caller, user: str, what: str) -> None:
    if not caller.may_see(user):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"user: {what} of {user} are theirs and admins' to read, not {caller.name}'s",
        )


@router.get("/activity/leases/{lease_id}", summary="A lease's GPU activity and its profile's limits")
async def lease_activity(lease_id: str, parts: PartsDep, caller: CallerDep) -> dict[str, Any]:
    lease = parts.manager.get(lease_id)
    caller.check_may_see(lease.user, f"lease {lease_id}")  # not whose: the caller named only the lease
    return activity_of(parts, lease)


@router.get(
    "/activity/users/{user}", summary="The GPU activity of a user's server (its active lease) and limits"
)
async def server_activity(
    user: str,
    parts: PartsDep,
    caller: CallerDep,
    server: Annotated[str, Query(description="the server's name; empty for the default")] = "",
) -> dict[str, Any]:
    _may_see(caller, user, "servers")
    leases = [
        lease
        for lease in parts.manager.leases_for(user, active_only=True)
        if lease.owner_kind == "server" and lease.owner_name == server
    ]
    if not leases:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{user}'s server {server!r} holds no active lease")
    return activity_of(parts, leases[-1])


@router.post("/warnings", status_code=status.HTTP_201_CREATED, summary="Record a cull warning")
async def post_warning(
    body: WarningIn, parts: PartsDep, caller: Annotated[Caller, manager("record cull warnings")]
) -> dict[str, Any]:
    # a new reason for the same lease keeps the time of the first warning: the user has known since then
    before = parts.culls.get(body.user, body.server)
    warned_at = before.warned_at if before is not None and before.lease_id == body.lease_id else parts.clock()
    warning = CullWarning(body.user, body.server, body.lease_id, body.cull_at, body.reason, warned_at)
    parts.culls.put(warning)
    return asdict(warning)


@router.post("/culls", status_code=status.HTTP_204_NO_CONTENT, summary="Record that a server is culled")
async def post_cull(
    body: CullIn, parts: PartsDep, caller: Annotated[Caller, manager("report culls")]
) -> None:
    parts.culls.record(
        CullRecord(parts.clock(), body.user, body.server, body.lease_id, body.limit, body.reason)
    )
    log.info("%s/%s (lease %s) culled: %s", body.user, body.server, body.lease_id, body.reason)


@router.get("/warnings", summary="Pending cull warnings: the caller's own, or a user's, or all (admins)")
async def get_warnings(
    parts: PartsDep,
    caller: CallerDep,
    user: Annotated[str | None, Query(description="whose; default the caller's own")] = None,
) -> list[dict[str, Any]]:
    if user is not None:
        _may_see(caller, user, "warnings")
    elif not caller.sees_everyone:
        user = caller.name
    pending = parts.culls.pending(parts.clock(), user)
    await parts.check_hub_has(user, caller, pending)
    return [asdict(w) for w in pending]


@router.get("/culls", summary="The culls made since a time: the caller's own, or a user's, or all (admins)")
async def get_culls(
    parts: PartsDep,
    caller: CallerDep,
    user: Annotated[str | None, Query(description="whose; default the caller's own")] = None,
    since: Annotated[
        datetime | None, Query(description=f"from this time (default 7 days ago): {INSTANT}")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=5000, description="at most this many, newest first")] = 500,
) -> list[dict[str, Any]]:
    if user is not None:
        _may_see(caller, user, "culls")
    elif not caller.sees_everyone:
        user = caller.name
    start = unix_seconds(since) if since is not None else parts.clock() - 7 * 86400
    culls = parts.culls.since(start, user, limit)
    await parts.check_hub_has(user, caller, culls)
    return [asdict(c) for c in culls]


@router.delete(
    "/warnings/{user}", status_code=status.HTTP_204_NO_CONTENT, summary="Withdraw a server's cull warning"
)
async def delete_warning(
    user: str,
    parts: PartsDep,
    caller: Annotated[Caller, manager("withdraw cull warnings")],
    server: Annotated[str, Query()] = "",
) -> None:
    parts.culls.withdraw(user, server)


async def fold_activity_forever(tracker: ActivityTracker, telemetry: Telemetry) -> None:
    """Fold the telemetry history into ``tracker`` every few seconds, so a GPU's idle time can outgrow the
    history's window (a 30-minute ``gpu_idle_timeout`` against a 10-minute window)."""
    every = min(30.0, telemetry.history.window_seconds / 4)
    while True:
        tracker.fold(telemetry.history)
        await asyncio.sleep(every)
