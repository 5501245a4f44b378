"""What the routes work on, built once by :func:`..assembly.assemble` and kept on ``app.state``.

Routes are plain module-level functions that name what they need as FastAPI dependencies (``PartsDep``,
``CallerDep``), so a route module has no factory and no closure, and a test builds the app the way the
service does.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the aliases in route signatures.
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Header, HTTPException, Request, status

from ...limits import job_group, server_group
from ...names import API_PATH
from ...pool.leases import Lease, LeaseState
from ...pool.profiles import (
    Profile,
    environments_never_fit,
    find_profile,
    fits_pool,
    preselected_environment,
)
from ...pool.requests import Request as PoolRequest  # what a server or job asks of the pool
from ...telemetry.activity import ActivityTracker
from ..jobs.job_manager import JobManager
from ..leasing.culls import Culls
from ..leasing.health import HealthKeeper
from ..leasing.lease_manager import LeaseManager
from ..store.usage_store import UsageStore
from ..telemetry.host_usage import HostUsage, HostUse
from ..telemetry.telemetry_loop import Telemetry
from .auth import Authenticator, Caller

if TYPE_CHECKING:
    from .browser_login import BrowserLogin

log = logging.getLogger(__name__)


@dataclass
class ServiceParts:
    """The managers, stores and settings the routes read; one per service process."""

    manager: LeaseManager
    jobs: JobManager
    profiles: Sequence[Profile]
    auth: Authenticator
    telemetry: Telemetry
    usage: UsageStore
    culls: Culls  # the culler's warnings and cull counts
    tracker: ActivityTracker
    health: HealthKeeper
    backend: str  # where the pool comes from: "simulated", "nvml" or "kubernetes"
    simulated: bool  # its GPUs are made up (pool_is_simulated): every page, form and widget says "simulated"
    source: str  # the pool file or cluster it was read from, shown in GET pool and on the pages
    prefix: str  # the service's URL prefix, "/services/gpupool/"
    public_metrics: bool = False
    host_usage: HostUsage | None = None  # servers' and jobs' CPU and memory; None on Kubernetes
    login: "BrowserLogin | None" = None  # the pages' OAuth login; None: the pages take tokens only
    idle_after: float = 60.0  # the dashboard lists a held device as idle after this many seconds
    clock: Callable[[], float] = field(default=time.time)
    # since when the pool's source (a cluster's API server) has not answered; None while it answers
    unreachable_since: Callable[[], float | None] = field(default=lambda: None)
    # users the hub is deleting, and until when nothing new starts for them (DELETE users/{user}: while it runs,
    # and with hold=true until the spawner's next call, as it retires their account)
    retiring: dict[str, float] = field(default_factory=dict)
    # whether the hub has a user (its API, as the service); None where the service has no token for it
    hub_has_user: Callable[[str], Awaitable[bool]] | None = None

    async def check_hub_has(self, user: str | None, caller: Caller, answer: Sequence[Any]) -> None:
        """404 naming ``user`` when ``answer``, asked about them, is empty and the hub has no such user: a
        misspelt name otherwise looks like a user who used nothing (an admin trial). Only a person asking about
        another is checked (the hub's services ask about users they know), and a hub that cannot be asked
        leaves the empty answer as it is."""
        if (
            answer
            or user is None
            or self.hub_has_user is None
            or caller.kind != "user"
            or user == caller.name
        ):
            return
        if "/" in user:  # NAME/deleted …: a deleted user's filed-away records
            return
        try:
            known = await self.hub_has_user(user)
        except Exception as error:  # the hub down or a scope missing: not this caller's error
            log.warning("could not ask the hub whether it has %s: %s", user, error)
            return
        if not known:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"user: the hub has no user {user!r}")

    def check_not_retiring(self, user: str) -> None:
        """409 for a user the hub is deleting: a job or lease made meanwhile would outlive them."""
        if self.retiring.get(user, 0.0) > self.clock():
            raise HTTPException(status.HTTP_409_CONFLICT, f"user: {user} is being deleted from the hub")

    @property
    def api_base(self) -> str:
        """Where the API's routes live: ``/services/gpupool/api/v1``."""
        return "/" + self.prefix.strip("/") + "/" + API_PATH

    def host_use(self, lease: Lease) -> HostUse:
        """What ``lease``'s server or job uses of its CPU and memory; on Kubernetes only its limits (the pod's
        use is the kubelet's to tell)."""
        if self.host_usage is None:
            return HostUse.limits_of(lease, "kubernetes")
        return self.host_usage.of(lease, self._run_group(lease))

    def _run_group(self, lease: Lease) -> str | None:
        """The control group of the server or job running on ``lease``; None when nothing runs on it."""
        if lease.state is not LeaseState.GRANTED:
            return None
        if lease.owner_kind != "job":
            return server_group(lease.id)
        try:
            job = self.jobs.get(lease.owner_name)
        except LookupError:  # no such job (JobNotFound)
            return None
        return job_group(job.id, job.attempts) if job.lease_id == lease.id else None

    @cached_property
    def never_fits(self) -> dict[str, str | None]:
        """Per profile, why no node of the pool could ever serve it (None: some node could), judged in the
        environment it is offered in (:meth:`offered_request`): a default environment no GPU can run closes
        that environment, not the profile. The nodes are fixed for the service's life, so this is worked out
        once, not at every ``GET profiles``."""
        nodes = [ns.node for ns in self.manager.pool.nodes]
        return {p.slug: fits_pool(p, nodes, self._offered_environment(p)) for p in self.profiles}

    @cached_property
    def environments_never_fit(self) -> dict[str, dict[str, str]]:
        """Per profile, each environment no GPU of the pool can ever run, with why (see
        :func:`environments_never_fit`): GET profiles says it, POST leases refuses it. Worked out once, as
        :attr:`never_fits` is."""
        nodes = [ns.node for ns in self.manager.pool.nodes]
        return {p.slug: environments_never_fit(p, nodes) for p in self.profiles}

    def offered_request(self, profile: Profile) -> PoolRequest:
        """What ``profile`` asks of the pool in the environment the form preselects: what GET profiles counts
        as free now, and judges the quota and the expected start by."""
        return profile.request(None, self._offered_environment(profile))

    def _offered_environment(self, profile: Profile) -> str | None:
        chosen = preselected_environment(profile, self.environments_never_fit[profile.slug])
        return chosen.slug if chosen is not None else None

    def profile(self, slug: str) -> Profile | None:
        return next((p for p in self.profiles if p.slug == slug), None)


def service_parts(request: Request) -> ServiceParts:
    parts: ServiceParts = request.app.state.parts
    return parts


async def request_caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """The caller of this request, as the hub describes its token; 401 or 403 saying what is wrong."""
    return await service_parts(request).auth.caller(request, authorization)


PartsDep = Annotated[ServiceParts, Depends(service_parts)]
CallerDep = Annotated[Caller, Depends(request_caller)]


def require_manager(caller: Caller, what: str) -> None:
    """403 unless ``caller`` is an administrator or the hub (who act for every user)."""
    if not caller.sees_everyone:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"{caller.kind} {caller.name} may not {what}: they need custom:gpupool:admin or custom:gpupool:leases",
        )


def usable_profile(profiles: Sequence[Profile], slug: str, groups: Iterable[str], admin: bool) -> Profile:
    """The profile ``slug`` if a user of ``groups`` (a hub admin if ``admin``) may use it: 400 listing only
    the profiles they may use when there is none of that name, 403 naming the groups when it is closed."""
    groups = frozenset(groups)
    open_to_them = [profile for profile in profiles if profile.visible_to(groups, admin)]
    profile = find_profile(profiles, slug, offered=open_to_them)
    require_may_use(profile, groups, admin)
    return profile


def require_may_use(profile: Profile, groups: Iterable[str], admin: bool) -> None:
    """403 naming the groups unless a user of ``groups`` (a hub admin if ``admin``) may use ``profile``."""
    if not profile.visible_to(groups, admin):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"profile: only members of {' or '.join(sorted(profile.groups))} may use {profile.slug}",
        )


def manager(what: str) -> Any:
    """A dependency giving the caller, or 403 as :func:`require_manager` says, before the body is validated:
    a caller without the scope learns nothing from how their body was wrong."""

    async def caller_who_manages(caller: CallerDep) -> Caller:
        require_manager(caller, what)
        return caller

    return Depends(caller_who_manages)


def administrator(what: str) -> Any:
    """A dependency giving the caller, or 403 ``admin_required`` unless they hold ``custom:gpupool:admin``,
    before the body is validated, as :func:`manager` does for the hub's scope."""

    async def caller_who_administers(caller: CallerDep) -> Caller:
        caller.check_admin(what)
        return caller

    return Depends(caller_who_administers)
