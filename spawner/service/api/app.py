"""The service's HTTP API: a FastAPI app over one :class:`LeaseManager`, mounted under the service prefix.

JupyterHub's proxy forwards ``/services/gpupool/…`` with the prefix intact, so every route lives under
``{prefix}api/v1/``, the OpenAPI document included. Handlers are ``async def`` and call the manager on the
event loop: every manager call holds its one lock for well under a millisecond, so handing it to a worker
thread (FastAPI's way with plain ``def``) costs more than it saves and only adds lock waits under load. This module has no
``from __future__ import annotations``: FastAPI must resolve the local ``CallerDep`` alias at run time.

Status codes, mapped once in :func:`_problem_handlers`:

- 400 — a body or field the API cannot use (``fields`` names it), or an unknown profile (the detail lists the
  valid slugs);
- 401 — no token; 403 — a token the hub refuses, a missing scope, a profile the user's groups may not use,
  or a quota (``error: "quota_exceeded"``, the detail names the limit: releasing a lease, not waiting, is
  what helps, so it is not a 429);
- 403 also for a lease of another user (whose it is is not said), 404 — no such lease;
- 409 — a profile this pool can never serve (queueing it would wait forever).
"""

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...inventory import describe_pool
from ...kube.resources import kube_grant
from ...pool.profiles import Profile, UnknownProfile, find_profile, fits_pool
from ...pool.quotas import QuotaExceeded
from ..jobs.job_manager import JobManager
from ..leasing.lease_manager import LeaseManager, NeverFits
from ..settings import DEFAULT_PREFIX
from ..store.lease_store import Lease, LeaseNotFound, LeaseState
from .auth import Authenticator, Caller
from .job_routes import add_job_error_handlers, jobs_router
from .models import KubePlacement, LeaseOut, LeaseRequest, Problem, ProfileOut

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": Problem} for code in (400, 401, 403, 404, 409)}


def create_app(
    manager: LeaseManager,
    profiles: Sequence[Profile],
    *,
    backend: str,
    auth: Authenticator,
    source: str = "",
    prefix: str = DEFAULT_PREFIX,
    jobs: JobManager | None = None,
) -> FastAPI:
    """The API for ``manager``'s pool; ``backend`` ("simulated" or "nvml") is shown in ``GET pool``. With
    ``jobs``, the jobs API too (:mod:`.job_routes`). The loops run in :mod:`..assembly`'s lifespan."""
    base = "/" + prefix.strip("/") + "/api/v1"
    nodes = manager.pool.nodes
    kube = backend == "kubernetes"

    def _out(lease: Lease) -> LeaseOut:
        message = manager.waiting_message(lease.id) if lease.position is not None else None
        return LeaseOut.from_lease(lease, message, _placement(manager, lease) if kube else None)

    never_fits = {p.slug: fits_pool(p, [ns.node for ns in nodes]) for p in profiles}

    app = FastAPI(
        title="gpupool",
        version="1",
        description="Leases of GPUs, MIG slices and GPU shares for JupyterHub servers and jobs.",
        openapi_url=f"{base}/openapi.json",
        docs_url=f"{base}/docs",
        redoc_url=None,
    )
    _problem_handlers(app)
    router = APIRouter(prefix=base, responses=_ERRORS)
    CallerDep = Annotated[Caller, Depends(auth)]

    @router.get("/pool", summary="The pool: nodes, GPUs, MIG slices, shares, what is free, health")
    async def get_pool(_caller: CallerDep) -> dict[str, Any]:
        return manager.inspect(lambda pool: describe_pool(pool, backend, source))

    @router.get("/profiles", summary="The profiles the caller may use, with availability")
    async def get_profiles(caller: CallerDep) -> list[ProfileOut]:
        # The hub's spawners show every profile (with why one is closed), so they get availability for all.
        usable = [
            p for p in profiles if caller.acts_for_others or p.visible_to(caller.groups, caller.is_admin)
        ]
        counts = manager.availability({p.slug: p.request() for p in usable if never_fits[p.slug] is None})
        return [
            ProfileOut.from_profile(p, *counts.get(p.slug, (0, 0)), never_fits=never_fits[p.slug])
            for p in usable
        ]

    @router.post(
        "/leases", status_code=status.HTTP_201_CREATED, summary="Ask for a lease (granted or queued)"
    )
    async def post_lease(body: LeaseRequest, caller: CallerDep) -> LeaseOut:
        if (body.user is not None or body.groups is not None) and not caller.acts_for_others:
            field = "user" if body.user is not None else "groups"
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"{field}: only a token with custom:gpupool:leases may ask on behalf of a user",
            )
        user = body.user or caller.name
        groups = frozenset(body.groups) if body.groups is not None else caller.groups
        profile = find_profile(profiles, body.profile)
        if not profile.visible_to(groups, caller.is_admin):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"profile: only members of {' or '.join(sorted(profile.groups))} may use {profile.slug}",
            )
        lease = manager.request_lease(
            user, groups, body.owner_kind, body.owner_name, profile.slug, profile.request()
        )
        return _out(lease)

    @router.get("/leases", summary="The caller's leases; every lease (or one user's) for admins and the hub")
    async def list_leases(
        caller: CallerDep, active_only: bool = False, user: str | None = None
    ) -> list[LeaseOut]:
        if user is not None and user != caller.name and not (caller.is_admin or caller.acts_for_others):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"user: {caller.name} may list only their own leases"
            )
        if user is not None:
            leases = manager.leases_for(user, active_only=active_only)
        elif caller.is_admin or caller.acts_for_others:
            leases = manager.all_leases(active_only=active_only)
        else:
            leases = manager.leases_for(caller.name, active_only=active_only)
        return [_out(lease) for lease in leases]

    @router.get("/leases/{lease_id}", summary="One lease")
    async def get_lease(lease_id: str, caller: CallerDep) -> LeaseOut:
        return _out(_visible_lease(manager, caller, lease_id))

    @router.delete("/leases/{lease_id}", summary="Release a lease; releasing twice changes nothing")
    async def delete_lease(lease_id: str, caller: CallerDep) -> LeaseOut:
        _visible_lease(manager, caller, lease_id)
        return _out(manager.release(lease_id, f"released by {caller.kind} {caller.name}"))

    app.include_router(router)
    if jobs is not None:
        app.include_router(jobs_router(jobs, auth, base))
        add_job_error_handlers(app)
    return app


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
    return KubePlacement(node=grant.node, limits=dict(grant.limits))


def _problem_handlers(app: FastAPI) -> None:
    """Typed errors to status codes, once; every error body is a :class:`Problem`."""

    def problem(code: int, error: str, detail: str, fields: list[str] | None = None) -> JSONResponse:
        body = Problem(error=error, detail=detail, fields=fields or [])
        return JSONResponse(body.model_dump(), status_code=code)

    async def invalid(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        fields, sentences = [], []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"] if part not in ("body", "query", "path"))
            where = where or "body"
            fields.append(where)
            sentences.append(f"{where}: {error['msg']}")
        return problem(400, "invalid_request", "; ".join(sentences), fields)

    async def http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        names = {401: "unauthenticated", 403: "forbidden", 404: "not_found", 502: "hub_unreachable"}
        field = str(exc.detail).split(":", 1)[0] if exc.status_code == 403 else ""
        response = problem(
            exc.status_code,
            names.get(exc.status_code, "error"),
            str(exc.detail),
            [field] if field in ("user", "groups", "profile") else [],
        )
        response.headers.update(exc.headers or {})
        return response

    async def unknown_profile(_request: Request, exc: Exception) -> JSONResponse:
        return problem(400, "unknown_profile", str(exc), ["profile"])

    async def quota(_request: Request, exc: Exception) -> JSONResponse:
        return problem(403, "quota_exceeded", str(exc))

    async def never(_request: Request, exc: Exception) -> JSONResponse:
        return problem(409, "never_fits", str(exc), ["profile"])

    async def not_found(_request: Request, exc: Exception) -> JSONResponse:
        return problem(404, "not_found", str(exc))

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(UnknownProfile, unknown_profile)
    app.add_exception_handler(QuotaExceeded, quota)
    app.add_exception_handler(NeverFits, never)
    app.add_exception_handler(LeaseNotFound, not_found)
