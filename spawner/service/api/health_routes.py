"""The health API: admins drain and undrain a node or one GPU, and read what is out of the pool and why.

- ``POST api/v1/admin/drain`` ``{node, gpu_index?}``: nothing new is placed there; jobs running there are
  stopped (SIGTERM, the grace period, SIGKILL) and requeued; servers keep running. Kept across restarts.
- ``POST api/v1/admin/undrain`` ``{node, gpu_index?}``: placeable again (unless a fault keeps it unhealthy);
  queued work is admitted.
- ``GET api/v1/admin/health``: every drained or unhealthy node and GPU, with the reason and the leases on it.

All three need ``custom:gpupool:admin`` (403 otherwise); an unknown node or GPU is a 400 naming the field.
:func:`health_router` also re-applies the stored drains and hooks the fault checks into the telemetry, so
wiring health in is one ``include_router`` call. No ``from __future__ import annotations`` here: FastAPI
resolves ``CallerDep`` at run time.
"""

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ..jobs.job_manager import JobManager
from ..leasing.health import DrainStore, HealthKeeper
from ..telemetry.telemetry_loop import Telemetry
from .auth import Caller
from .models import Problem


class DeviceRequest(BaseModel):
    """A node, or one GPU on it."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1, max_length=253)
    gpu_index: int | None = Field(default=None, ge=0, description="the GPU's index; leave out for the node")


class DrainOut(BaseModel):
    node: str
    gpu_index: int | None
    health: str
    stopped_jobs: list[str] = Field(
        description="jobs stopped to be requeued (or failed, with no retries left)"
    )
    servers: list[str] = Field(description="server leases on it, which keep running")


class HealthOut(BaseModel):
    node: str
    gpu_index: int | None
    health: str


class MarkOut(BaseModel):
    node: str
    gpu_index: int | None
    health: str
    reasons: dict[str, str] = Field(description="each mark (drained, unhealthy) and why")
    leases: list[str] = Field(description="granted leases on it (servers and jobs)")


def health_router(
    jobs: JobManager,
    telemetry: Telemetry | None,
    auth: Callable[..., Coroutine[Any, Any, Caller]],
    *,
    prefix: str = "/services/gpupool/",
) -> APIRouter:
    """The routes under ``prefix``; stored drains are applied now, and telemetry snapshots are watched."""
    keeper = HealthKeeper(jobs, DrainStore(jobs.leases.store.engine))
    keeper.restore()
    if telemetry is not None:
        telemetry.add_observer(keeper.observe)
    base = "/" + prefix.strip("/") + "/api/v1/admin"
    errors: dict[int | str, dict[str, Any]] = {code: {"model": Problem} for code in (400, 401, 403)}
    router = APIRouter(prefix=base, responses=errors)
    CallerDep = Annotated[Caller, Depends(auth)]

    def admin_only(caller: Caller, what: str) -> None:
        if not caller.is_admin:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"{caller.kind} {caller.name} may not {what}: it needs custom:gpupool:admin",
            )

    @router.post("/drain", response_model=DrainOut, summary="Drain a node or GPU: no new work; jobs requeued")
    async def post_drain(body: DeviceRequest, caller: CallerDep) -> Any:
        admin_only(caller, "drain")
        try:
            stopped, servers = keeper.drain(body.node, body.gpu_index, f"{caller.kind} {caller.name}")
        except KeyError as error:
            return _unknown(body, error)
        health = jobs.leases.health_of(body.node, body.gpu_index)
        return DrainOut(
            node=body.node, gpu_index=body.gpu_index, health=health, stopped_jobs=stopped, servers=servers
        )

    @router.post(
        "/undrain", response_model=HealthOut, summary="Undrain a node or GPU; queued work is admitted"
    )
    async def post_undrain(body: DeviceRequest, caller: CallerDep) -> Any:
        admin_only(caller, "undrain")
        try:
            health = keeper.undrain(body.node, body.gpu_index)
        except KeyError as error:
            return _unknown(body, error)
        return HealthOut(node=body.node, gpu_index=body.gpu_index, health=health)

    @router.get("/health", summary="Drained and unhealthy nodes and GPUs, why, and the leases on them")
    async def get_health(caller: CallerDep) -> list[MarkOut]:
        admin_only(caller, "read pool health")
        marks = []
        for (node, gpu_index), reasons in sorted(
            jobs.leases.health_marks().items(),
            key=lambda item: (item[0][0], -1 if item[0][1] is None else item[0][1]),
        ):
            marks.append(
                MarkOut(
                    node=node,
                    gpu_index=gpu_index,
                    health=jobs.leases.health_of(node, gpu_index),
                    reasons={health.value: why for health, why in reasons.items()},
                    leases=[lease.id for lease in jobs.leases.leases_on(node, gpu_index)],
                )
            )
        return marks

    return router


def _unknown(body: DeviceRequest, error: KeyError) -> JSONResponse:
    field = "gpu_index" if body.gpu_index is not None and "GPU" in str(error) else "node"
    detail = f"{field}: no such {field.replace('_', ' ')} ({error.args[0]})"
    problem = Problem(error="invalid_request", detail=detail, fields=[field])
    return JSONResponse(problem.model_dump(), status_code=400)
