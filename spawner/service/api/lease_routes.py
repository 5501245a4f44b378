"""The lease API: the pool, the profiles a caller may use, and leases asked for, read and released.

Handlers are ``async def`` and call the manager on the event loop: every manager call holds its one lock for
well under a millisecond, so handing it to a worker thread (FastAPI's way with plain ``def``) costs more than
it saves and only adds lock waits under load.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
from collections.abc import Callable
from pathlib import PurePath
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, status

from ...inventory import describe_pool
from ...kube.resources import kube_grant
from ...pool.environments import UnknownEnvironment
from ...pool.leases import Lease, LeaseState
from ...pool.profiles import refuse_environment
from ...pool.quotas import standing, standing_in_words, usage
from ...pool.requests import Request
from ..leasing.lease_manager import LeaseManager
from .auth import Caller
from .context import CallerDep, PartsDep, ServiceParts, usable_profile
from .models import KubePlacement, LeaseOut, LeaseRequest, ProfileOut, QuotaLimitOut, QuotaOut, ResourcesOut

ANOTHER_USER = "another user"

router = APIRouter()


@router.get("/pool", summary="The pool: nodes, GPUs, MIG slices, shares, what is free, health")
async def get_pool(parts: PartsDep, caller: CallerDep) -> dict[str, Any]:
    shown = str if caller.sees_everyone else _holders_shown_to(parts.manager, caller.name)
    # Users see which pool file, not where it lies on the service's host.
    source = parts.source if caller.sees_everyone else PurePath(parts.source).name
    described = parts.manager.inspect(lambda pool: describe_pool(pool, parts.backend, source, shown))
    return {**described, "unreachable_since": parts.unreachable_since()}  # a cluster that stopped answering


def _holders_shown_to(manager: LeaseManager, user: str) -> Callable[[str], str]:
    """A user sees the ids of their own leases on the devices; another user's lease is only "another user"
    (its id would let them read its owner's activity through the culler's API)."""
    own = {lease.id for lease in manager.leases_for(user, active_only=True)}
    return lambda holder: holder if holder in own or holder.startswith("outside:") else ANOTHER_USER


@router.get("/profiles", summary="The profiles the caller may use, with availability")
async def get_profiles(
    parts: PartsDep,
    caller: CallerDep,
    user: str | None = None,
    groups: Annotated[list[str] | None, Query()] = None,
) -> list[ProfileOut]:
    """``over_quota`` and ``quota_forbids`` are judged for ``user`` (the caller's own by default) with
    ``groups`` (see ``quota``)."""
    name, counted = _quota_subject(caller, user, groups)
    # The hub's spawners show every profile (with why one is closed), so they get availability for all.
    usable = [
        p
        for p in parts.profiles
        if caller.acts_for_others or p.visible_to(caller.groups, caller.uses_every_profile)
    ]
    never_fits = parts.never_fits
    manager = parts.manager
    asks = {p.slug: parts.offered_request(p) for p in usable}
    counts = manager.availability({slug: ask for slug, ask in asks.items() if never_fits[slug] is None})
    simulated = parts.simulated
    rows = []
    for p in usable:
        now, queued = counts.get(p.slug, (0, 0))
        ask = asks[p.slug]
        start = manager.expected_start_of_new(ask) if not now and not never_fits[p.slug] else None
        over, forbids = (None, None) if never_fits[p.slug] else _quota_says(manager, name, counted, ask)
        closed = parts.environments_never_fit[p.slug]
        row = ProfileOut.from_profile(
            p, now, queued, never_fits[p.slug], start, environments_never_fit=closed, simulated=simulated
        )
        rows.append(row.model_copy(update={"over_quota": over, "quota_forbids": forbids}))
    return rows


def _quota_says(
    manager: LeaseManager, user: str, groups: frozenset[str], request: Request
) -> tuple[str | None, str | None]:
    """Why ``user``'s quota refuses ``request``: now, until they hold less (``over_quota``); or even while
    they hold nothing (``quota_forbids``: a limit of 0, or below what the profile asks), which no stopped
    server or cancelled job mends."""
    quotas = manager.quotas
    over = manager.quota_refusal(user, groups, request)  # said with what they hold now
    if over is None or quotas is None:
        return None, None
    forbids = quotas.check(user, groups, request, []) is not None
    return (None, str(over)) if forbids else (str(over), None)


@router.get("/quota", summary="A user's quota and what they hold against it (the caller's own by default)")
async def get_quota(
    parts: PartsDep,
    caller: CallerDep,
    user: str | None = None,
    groups: Annotated[list[str] | None, Query()] = None,
) -> QuotaOut:
    """``groups`` (the hub's spawners only, which know a user's groups) replace the caller's own groups."""
    name, counted = _quota_subject(caller, user, groups)
    quotas = parts.manager.quotas
    limits = quotas.limits_for(name, counted) if quotas is not None else []
    totals = usage(lease.request for lease in parts.manager.leases_for(name, active_only=True))
    rows = [
        QuotaLimitOut(
            resource=limit.resource,
            scope=limit.scope,
            subject=limit.subject,
            limit=limit.value,
            held=totals[limit.resource],
            words=words,
        )
        for limit, words in standing(limits, totals)
    ]
    # the hub's spawners show it to the user on their form; an admin reads someone else's
    whose = "Your quota" if name == caller.name or caller.acts_for_others else f"{name}'s quota"
    return QuotaOut(user=name, limits=rows, summary=standing_in_words(limits, totals, whose))


def _quota_subject(caller: Caller, user: str | None, groups: list[str] | None) -> tuple[str, frozenset[str]]:
    """Whose quota a read is about (``user``, else the caller; 403 unless the caller may see it) and the
    groups it counts: ``groups`` as the hub's spawners or an admin give them (the hub knows a user's groups,
    the service does not), else the caller's own for themselves, and none for anyone else."""
    name = user or caller.name
    caller.check_may_see(name, f"the quota of {name}")
    if groups is not None and caller.sees_everyone:
        return name, frozenset(groups)
    return name, caller.groups if name == caller.name else frozenset()


async def hubs_spawner(caller: CallerDep) -> Caller:
    """The caller, if it is the hub's spawner (``custom:gpupool:leases``); 403 otherwise, before the body is
    read, so that no one else learns what a lease request holds from how theirs was wrong."""
    if not caller.acts_for_others:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"{caller.kind} {caller.name} may not make leases: a server gets its lease from the hub's spawner "
            "when it starts, a job with POST jobs",
        )
    return caller


@router.post("/leases", status_code=status.HTTP_201_CREATED, summary="Ask for a lease (granted or queued)")
async def post_lease(
    body: LeaseRequest, parts: PartsDep, caller: Annotated[Caller, Depends(hubs_spawner)]
) -> LeaseOut:
    """Only the hub's spawners make leases, each for the server it starts; a job's lease comes with the job
    (``POST jobs``). A lease anyone else made would have no server or job behind it to give it back."""
    if body.owner_kind == "job":
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "owner_kind: job leases are made by POST jobs, with the job that holds them",
        )
    if body.user is None:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "user: name the user whose server the lease is for")
    parts.check_not_retiring(body.user)
    groups = frozenset(body.groups or ())
    # the spawner vouches for the user's groups and admin flag
    admin = body.admin or caller.uses_every_profile
    profile = usable_profile(parts.profiles, body.profile, groups, admin)
    if (
        body.walltime is not None
        and profile.max_lifetime is not None
        and body.walltime > profile.max_lifetime
    ):
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            f"walltime: {profile.slug} servers live at most {profile.max_lifetime:g} s, got {body.walltime:g}",
        )
    try:
        request = profile.request(body.walltime, body.environment)
    except UnknownEnvironment as error:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(error)) from None
    refuse_environment(profile, body.environment, parts.environments_never_fit[profile.slug])
    lease = parts.manager.request_lease(
        body.user, groups, body.owner_kind, body.owner_name, profile.slug, request
    )
    return lease_out(parts, lease)


@router.get("/leases", summary="The caller's leases; every lease (or one user's) for admins and the hub")
async def list_leases(
    parts: PartsDep, caller: CallerDep, active_only: bool = False, user: str | None = None
) -> list[LeaseOut]:
    if user is not None and user != caller.name and not caller.sees_everyone:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"user: {caller.name} may list only their own leases")
    manager = parts.manager
    if user is not None:
        leases = manager.leases_for(user, active_only=active_only)
        await parts.check_hub_has(user, caller, leases)
    elif caller.sees_everyone:
        leases = manager.all_leases(active_only=active_only)
    else:
        leases = manager.leases_for(caller.name, active_only=active_only)
    return [lease_out(parts, lease) for lease in leases]


@router.get("/leases/{lease_id}", summary="One lease")
async def get_lease(lease_id: str, parts: PartsDep, caller: CallerDep) -> LeaseOut:
    return lease_out(parts, _visible_lease(parts.manager, caller, lease_id))


@router.get(
    "/leases/{lease_id}/resources",
    summary="CPU and memory the lease's server or job uses, against its limits",
)
async def get_lease_resources(lease_id: str, parts: PartsDep, caller: CallerDep) -> ResourcesOut:
    lease = _visible_lease(parts.manager, caller, lease_id)
    use = parts.host_use(lease)
    return ResourcesOut(
        limits_by=use.limits_by,
        cpu_limit=use.cpu_limit,
        memory_limit_mib=use.memory_limit_mib,
        cpu_used=None if use.cpu_used is None else round(use.cpu_used, 3),
        memory_used_mib=None if use.memory_used_mib is None else round(use.memory_used_mib, 1),
    )


@router.delete(
    "/leases/{lease_id}",
    summary="Release a lease (the hub's spawners and admins); releasing twice changes nothing",
)
async def delete_lease(lease_id: str, parts: PartsDep, caller: CallerDep) -> LeaseOut:
    """A user gives devices back by stopping the server or cancelling the job that holds them: a lease released
    under a running server would hand its devices to the next user while the server still uses them. Admins
    may (the console's "Release lease"); the service's reconciliation then stops the server."""
    lease = _visible_lease(parts.manager, caller, lease_id)
    if not caller.sees_everyone and lease.state is not LeaseState.RELEASED:
        raise HTTPException(status.HTTP_409_CONFLICT, _give_back_instead(lease))
    reason = f"released by {caller.kind} {caller.name}"
    if lease.state is not LeaseState.RELEASED and (cull := parts.culls.of_lease(lease.id)) is not None:
        # the spawner gives a culled server's lease back like any other: say why it stopped (an admin trial)
        reason = f"its server was culled ({cull.limit}): {cull.reason}"[:1000]  # the column's length
    return lease_out(parts, parts.manager.release(lease_id, reason))


def _give_back_instead(lease: Lease) -> str:
    if lease.owner_kind == "job":
        return f"lease {lease.id} is job {lease.owner_name}'s: cancel the job (gpupool cancel {lease.owner_name})"
    server = f"server {lease.owner_name!r}" if lease.owner_name else "default server"
    return (
        f"lease {lease.id} is your {server}'s: stop the server (File > Hub Control Panel > Stop My Server) "
        "and its devices go back"
    )


def lease_out(parts: ServiceParts, lease: Lease) -> LeaseOut:
    """The lease as the API shows it: with its place in the queue in words, and on Kubernetes its node."""
    message, start = (parts.manager.waiting(lease.id) if lease.position is not None else None) or (None, None)
    placement = _placement(parts.manager, lease) if parts.backend == "kubernetes" else None
    return LeaseOut.from_lease(lease, message, placement, start)


def _visible_lease(manager: LeaseManager, caller: Caller, lease_id: str) -> Lease:
    """The lease; 404 when there is none, 403 when it is not the caller's to see."""
    lease = manager.get(lease_id)
    caller.check_may_see(lease.user, f"lease {lease_id}")
    return lease


def _placement(manager: LeaseManager, lease: Lease) -> KubePlacement | None:
    """A granted lease's node and resource limits on Kubernetes (None until granted)."""
    if lease.state is not LeaseState.GRANTED or lease.node is None:
        return None
    grant = kube_grant(manager.pool.node(lease.node).node, lease.devices)
    return KubePlacement(
        node=grant.node, limits=dict(grant.limits), environment=dict(grant.environment), note=grant.note
    )
