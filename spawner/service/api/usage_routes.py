"""``GET api/v1/usage``: GPU-hours held against GPU-hours used, per user and profile, from the stored minutes.

Users see their own rows; admins (``custom:gpupool:admin``) and the hub's spawners every user's, or one user's
with ``user=``, as they see every lease. The
span defaults to the last 30 days; ``since`` and ``until`` are Unix seconds or ISO 8601 dates and times (UTC
unless they say otherwise), since an admin asking for last week writes ``since=2026-12-01``. This module has no
``from __future__ import annotations``: FastAPI must evaluate the route signatures.
"""

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, Field

from .context import CallerDep, PartsDep
from .instants import INSTANT, unix_seconds

_DAY = 86400.0


class UsageOut(BaseModel):
    user: str
    profile: str
    gpu_hours_held: float
    gpu_hours_used: float = Field(
        description="held with utilisation above the idle threshold (gpu_idle_threshold)"
    )
    gpu_hours_unknown: float = Field(description="held while utilisation could not be read")
    idle_share: float | None = Field(description="part of the known held hours that were idle")


router = APIRouter()


@router.get("/usage", summary="GPU-hours held and used, per user and profile")
async def get_usage(
    parts: PartsDep,
    caller: CallerDep,
    since: Annotated[datetime | None, Query(description=f"from this time: {INSTANT}")] = None,
    until: Annotated[datetime | None, Query(description=f"to this time: {INSTANT}")] = None,
    user: str | None = None,
) -> list[UsageOut]:
    if user is not None and not caller.may_see(user):  # admins and the hub see everyone's, as for leases
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"user: {caller.name} may read only their own usage")
    end = unix_seconds(until) if until is not None else parts.clock()
    start = unix_seconds(since) if since is not None else end - 30 * _DAY
    if start >= end:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "since: must be before until")
    who = user if user is not None else (None if caller.sees_everyone else caller.name)
    rows = parts.usage.report(start, end, who)
    await parts.check_hub_has(user, caller, rows)
    return [
        UsageOut(
            user=row.user,
            profile=row.profile,
            gpu_hours_held=round(row.gpu_hours_held, 4),
            gpu_hours_used=round(row.gpu_hours_used, 4),
            gpu_hours_unknown=round(row.gpu_hours_unknown, 4),
            idle_share=None if row.idle_share is None else round(row.idle_share, 4),
        )
        for row in rows
    ]
