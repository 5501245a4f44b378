"""``DELETE {prefix}api/v1/users/{user}``: the hub deleted a user; nothing of theirs runs, waits or stays theirs.

The hub's spawner asks this as JupyterHub deletes the user (``GpuLeasing.delete_forever``). A hostile-user
trial found a deleted user's jobs still running, and a new user given the same name listing, reading and
cancelling them. Now the service retires them (:mod:`..retirement`): it cancels each unfinished job, releases
every lease left, waits for the jobs to end, and files the user's records away under a name no hub user can
have. Meanwhile a new job or lease for the user is refused (409): JupyterHub
deletes the user only after its spawner's ``delete_forever``, so their token still works. The spawner asks
with ``hold=true`` first, retires the account, then asks again without it, which lets a new user of the name
in; asking finds anything made in between.

Only the hub (``custom:gpupool:leases``) and admins (``custom:gpupool:admin``) may ask.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, Field

from ..retirement import retire
from .context import CallerDep, PartsDep

router = APIRouter()


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
    retired = await retire(parts, user, hold=hold, before=before)
    return RetiredUser.model_validate(retired, from_attributes=True)
