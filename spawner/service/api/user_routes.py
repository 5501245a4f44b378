"""``DELETE {prefix}api/v1/users/{user}``: the hub deleted a user; nothing of theirs runs, waits or stays theirs.

The hub's spawner asks this as JupyterHub deletes the user (``GpuLeasing.delete_forever``). A hostile-user
trial found a deleted user's jobs still running, and a new user given the same name listing, reading and
cancelling them. Now the service cancels each unfinished job (SIGTERM, the grace period, SIGKILL), releases
every lease left, waits for the jobs to end, and files the user's records away under a name no hub user can
have (:mod:`..store.retired_users`). Asking again finds nothing left and changes nothing.

Only the hub (``custom:gpupool:leases``) and admins (``custom:gpupool:admin``) may ask.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
import asyncio
import logging
import time

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, Field

from ..store.retired_users import file_away, retired_name
from .context import CallerDep, PartsDep, ServiceParts

log = logging.getLogger(__name__)
router = APIRouter()

BY = "the hub: the user was deleted"
POLL_S = 0.1
SETTLE_S = 10.0  # beyond the jobs' grace period: a SIGKILLed process group takes a moment to be reaped


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
async def retire_user(user: str, parts: PartsDep, caller: CallerDep) -> RetiredUser:
    if not (caller.acts_for_others or caller.is_admin):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"user: {caller.name} may not retire a user; it needs custom:gpupool:leases or custom:gpupool:admin",
        )
    cancelled = [j.id for j in parts.jobs.jobs_for(user) if not j.state.finished]
    for job_id in cancelled:
        parts.jobs.cancel(job_id, BY)
    held_by_jobs = {j.lease_id for j in parts.jobs.jobs_for(user)}
    released = 0
    for lease in parts.manager.leases_for(user, active_only=True):
        if lease.id not in held_by_jobs:  # a job's lease goes when its run has ended
            parts.manager.release(lease.id, BY)
            released += 1
    running = await _until_ended(parts, user, parts.jobs.grace + SETTLE_S)
    now = time.time()
    filed = await asyncio.to_thread(file_away, parts.manager.store.engine, user, retired_name(user, now))
    log.info(
        "user %s deleted: %d jobs cancelled, %d leases released, %d records filed away, %d jobs still running",
        user,
        len(cancelled),
        released,
        filed,
        running,
    )
    return RetiredUser(
        user=user,
        jobs_cancelled=len(cancelled),
        leases_released=released,
        still_running=running,
        records_filed_as=retired_name(user, now) if filed else None,
    )


async def _until_ended(parts: ServiceParts, user: str, wait_s: float) -> int:
    """Wait up to ``wait_s`` for ``user``'s jobs to finish; how many have not."""
    deadline = time.monotonic() + wait_s
    while True:
        left = sum(not j.state.finished for j in parts.jobs.jobs_for(user))
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(POLL_S)
