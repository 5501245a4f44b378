"""``DELETE {prefix}api/v1/users/{user}``: the hub deleted a user; nothing of theirs runs, waits or stays theirs.

The hub's spawner asks this as JupyterHub deletes the user (``GpuLeasing.delete_forever``). A hostile-user
trial found a deleted user's jobs still running, and a new user given the same name listing, reading and
cancelling them. Now the service cancels each unfinished job (SIGTERM, the grace period, SIGKILL), releases
every lease left, waits for the jobs to end, and files the user's records away under a name no hub user can
have (:mod:`..store.retired_users`). Meanwhile a new job or lease for the user is refused (409): JupyterHub
deletes the user only after its spawner's ``delete_forever``, so their token still works. The spawner asks
with ``hold=true`` first, retires the account, then asks again without it, which lets a new user of the name
in; asking finds anything made in between.

Only the hub (``custom:gpupool:leases``) and admins (``custom:gpupool:admin``) may ask.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
import asyncio
import logging
import math
import time
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, Field

from ..store.retired_users import file_away, retired_name
from .context import CallerDep, PartsDep, ServiceParts

log = logging.getLogger(__name__)
router = APIRouter()

BY = "the hub: the user was deleted"
POLL_S = 0.1
SETTLE_S = 10.0  # beyond the jobs' grace period: a SIGKILLed process group takes a moment to be reaped
HOLD_S = 600.0  # ``hold``: should the hub never call again, the user is let in again after this
MOST_WAIT_S = 100.0  # within the hub's patience (RETIRE_TIMEOUT_S, 120 s), whatever the grace period


class RetiredUser(BaseModel):
    """What retiring a deleted user did."""

    user: str
    jobs_cancelled: int = Field(description="unfinished jobs cancelled")
    leases_released: int = Field(description="leases released that no job of theirs held")
    still_running: int = Field(description="jobs that had not ended when the service stopped waiting")
    records_filed_as: str | None = Field(description="the name their records now carry; null if none had")


@router.delete(
    "/users/{user}",
    summary="The hub deleted this user: cancel their jobs, release their leases, file their records away",
)
async def retire_user(
    user: str,
    parts: PartsDep,
    caller: CallerDep,
    hold: Annotated[
        bool,
        Query(
            description="go on refusing new jobs and leases for the user (10 minutes at most) until a call "
            "without it: the hub's spawner holds them out this way while it retires their account"
        ),
    ] = False,
    before: Annotated[
        float | None,
        Query(
            allow_inf_nan=False,
            description="only what was submitted, made or recorded before this time (epoch s): the hub asking "
            "again, once the service answers, for a user deleted while it was down, whose name a newcomer may "
            "have been given since",
        ),
    ] = None,
) -> RetiredUser:
    if not (caller.acts_for_others or caller.is_admin):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"user: {caller.name} may not retire a user; it needs custom:gpupool:leases or custom:gpupool:admin",
        )
    # Being deleted now: nothing new for them from here (they may be submitting). Asked again later, for a user
    # deleted before (``before``), the name's holds are a newcomer's, and left alone.
    holding = before is None
    if holding:
        parts.retiring[user] = math.inf
    try:
        cancelled, released, running = await _end_everything_of(parts, user, before)
    finally:
        if holding and hold:
            parts.retiring[user] = parts.clock() + HOLD_S
        elif holding:
            parts.retiring.pop(user, None)
    parts.telemetry.close_minutes_of(user)  # what they held in the minute now is filed with the rest
    filed_as = retired_name(user, parts.clock())
    filed = await asyncio.to_thread(file_away, parts.manager.store.engine, user, filed_as, before)
    said = "%s deleted: %d jobs cancelled, %d leases released, %d records filed away, %d jobs still running"
    (log.warning if running else log.info)(said, user, cancelled, released, filed, running)
    return RetiredUser(
        user=user,
        jobs_cancelled=cancelled,
        leases_released=released,
        still_running=running,
        records_filed_as=filed_as if filed else None,
    )


async def _end_everything_of(parts: ServiceParts, user: str, before: float | None) -> tuple[int, int, int]:
    """Cancel ``user``'s unfinished jobs and release the leases no job of theirs holds (those submitted or made
    ``before`` alone, if given), again until nothing is left or the wait is over; (jobs cancelled, leases
    released, jobs still running)."""
    until = math.inf if before is None else before
    deadline = time.monotonic() + min(parts.jobs.grace + SETTLE_S, MOST_WAIT_S)
    cancelled: set[str] = set()
    released = 0
    while True:
        # from memory, not the store
        unfinished = [j for j in parts.jobs.unfinished() if j.user == user and j.submitted_at < until]
        for job in unfinished:
            if job.id not in cancelled:
                parts.jobs.cancel(job.id, BY)
                cancelled.add(job.id)
        held_by_jobs = {j.lease_id for j in unfinished}
        for lease in parts.manager.leases_for(user, active_only=True):
            if lease.id not in held_by_jobs and lease.created_at < until:  # a job's goes when its run ends
                parts.manager.release(lease.id, BY)
                released += 1
        if not unfinished or time.monotonic() >= deadline:
            return len(cancelled), released, len(unfinished)
        await asyncio.sleep(POLL_S)
