"""Records of a hub user the hub deleted, filed under a name no hub user can have.

Jobs, leases, culls and usage are kept by user name. A hostile-user trial deleted ``grace`` and let a new
``grace`` in: she listed the old one's jobs, read their ``env`` (an API key among it) and could cancel them.
Once nothing of the deleted user runs or waits, their rows are renamed ``grace/deleted 2026-12-07 17:40:03``:
JupyterHub refuses ``/`` in a user name, so no user reads them as their own again, and an admin still finds
them, and their GPU-hours, under that name.
"""

from __future__ import annotations

import math
import time

from sqlalchemy import Engine, Table, update

from ...pool.job_states import FINISHED
from ...pool.leases import LeaseState
from .cull_store import CULLS
from .job_store import JobRow
from .lease_store import LeaseRow
from .usage_store import MINUTES


def retired_name(user: str, at: float) -> str:
    """``grace/deleted 2026-12-07 17:40:03`` (UTC): what the deleted user's records are filed under."""
    return f"{user}/deleted {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(at))}"


def file_away(engine: Engine, user: str, as_name: str, before: float | None = None) -> int:
    """Rename ``user``'s finished jobs, released leases, culls and usage to ``as_name``, in one transaction;
    what still runs or waits keeps its name, and so does what was submitted, made or recorded from ``before`` on
    (a newcomer's, given the name since). Returns the rows renamed."""
    jobs: Table = JobRow.__table__  # type: ignore[assignment]
    leases: Table = LeaseRow.__table__  # type: ignore[assignment]
    finished = [str(state) for state in FINISHED]
    until = math.inf if before is None else before
    statements = [
        update(jobs).where(jobs.c.user == user, jobs.c.state.in_(finished), jobs.c.submitted_at < until),
        update(leases).where(
            leases.c.user == user, leases.c.state == str(LeaseState.RELEASED), leases.c.created_at < until
        ),
        update(CULLS).where(CULLS.c.user == user, CULLS.c.at < until),
        update(MINUTES).where(MINUTES.c.user == user, MINUTES.c.minute < until),
    ]
    with engine.begin() as connection:
        return sum(connection.execute(s.values(user=as_name)).rowcount for s in statements)
