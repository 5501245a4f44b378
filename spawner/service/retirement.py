"""Retiring a hub user: nothing of theirs runs, waits or stays under their name once the hub has deleted them.

Two callers. The hub's spawner asks as JupyterHub deletes the user (``DELETE users/{user}``,
:mod:`.api.user_routes`), and asks again for a day while the service does not answer. Reconciliation
(:mod:`.leasing.reconcile`) retires a user the hub no longer has in two passes in a row, which covers what the
hub never asks for: a deletion whose asking ended with a hub restart, or JupyterHub's ``delete_invalid_users``,
which removes users from its database at start without their spawners.

Each unfinished job is cancelled (SIGTERM, the grace period, SIGKILL), every lease left is released, the jobs are
waited for, and the user's records are filed away under a name no hub user can have
(:mod:`.store.retired_users`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .store.retired_users import file_away, retired_name

if TYPE_CHECKING:  # the parts are the API's; retiring only uses them
    from .api.context import ServiceParts

log = logging.getLogger(__name__)

DELETED = "the hub: the user was deleted"  # the reason a retired user's jobs and leases end with
NOT_IN_THE_HUB = "the service: the hub no longer has the user"  # ... when reconciliation found them gone
POLL_S = 0.1
SETTLE_S = 10.0  # beyond the jobs' grace period: a SIGKILLed process group takes a moment to be reaped
HOLD_S = 600.0  # ``hold``: should the hub never call again, the user is let in again after this
MOST_WAIT_S = 100.0  # within the hub's patience (RETIRE_TIMEOUT_S, 120 s), whatever the grace period


@dataclass(frozen=True)
class Retired:
    """What retiring a user did."""

    user: str
    jobs_cancelled: int
    leases_released: int
    still_running: int  # jobs that had not ended when the wait was over
    records_filed_as: str | None  # None when nothing was filed


async def retire(
    parts: ServiceParts, user: str, *, hold: bool = False, before: float | None = None, by: str = DELETED
) -> Retired:
    """Retire ``user``; with ``before``, only what was submitted, made or recorded before that time (a newcomer
    may have the name since). Without it, new jobs and leases for them are refused meanwhile, and with ``hold``
    for :data:`HOLD_S` after (the hub retires their account, then asks again)."""
    # Being deleted now: nothing new for them from here (they may be submitting). Asked again later, for a user
    # deleted before (``before``), the name's holds are a newcomer's, and left alone.
    holding = before is None
    if holding:
        parts.retiring[user] = math.inf
    try:
        cancelled, released, running = await _end_everything_of(parts, user, before, by)
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
    return Retired(user, cancelled, released, running, filed_as if filed else None)


async def _end_everything_of(
    parts: ServiceParts, user: str, before: float | None, by: str
) -> tuple[int, int, int]:
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
                parts.jobs.cancel(job.id, by)
                cancelled.add(job.id)
        held_by_jobs = {j.lease_id for j in unfinished}
        for lease in parts.manager.leases_for(user, active_only=True):
            if lease.id not in held_by_jobs and lease.created_at < until:  # a job's goes when its run ends
                parts.manager.release(lease.id, by)
                released += 1
        if not unfinished or time.monotonic() >= deadline:
            return len(cancelled), released, len(unfinished)
        await asyncio.sleep(POLL_S)
