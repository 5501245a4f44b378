"""The health API: admins drain and undrain a node or one GPU, and read what is out of the pool and why.

- ``POST api/v1/admin/drain`` ``{node, gpu_index?}``: nothing new is placed there; jobs running there are
  stopped (SIGTERM, the grace period, SIGKILL) and requeued; servers keep running. Kept across restarts.
- ``POST api/v1/admin/undrain`` ``{node, gpu_index?}``: placeable again (unless a fault keeps it unhealthy);
  queued work is admitted.
- ``POST api/v1/admin/faults`` ``{node, gpu_index?}``: unhealthy until repaired, kept across restarts; jobs
  there are stopped and requeued, as on a drain.
- ``POST api/v1/admin/repair`` ``{node, gpu_index?}``: the device was reset or replaced; its unhealthy marks
  (an admin's or the telemetry's) are lifted and queued work is admitted.
- ``GET api/v1/admin/health``: every drained or unhealthy node and GPU, with the reason and the leases on it.
- ``POST api/v1/admin/simulated-xid`` ``{node, gpu_index, xid}``: on a simulated pool only (409 elsewhere),
  the next telemetry sample reports the XID on that GPU, so a demo tries what a real failure does.

All need ``custom:gpupool:admin`` (403 otherwise, before the body is read); an unknown node or GPU is a 400
naming the field. The drains and faults themselves live in :class:`..leasing.health.HealthKeeper`. No
``from __future__ import annotations`` here: FastAPI must evaluate the route signatures.
"""

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ...pool.devices import Health
from ..leasing.health import CRITICAL_XIDS
from .auth import Caller
from .context import CallerDep, PartsDep, ServiceParts, administrator
from .models import Problem


class DeviceRequest(BaseModel):
    """A node, or one GPU on it."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1, max_length=253)
    gpu_index: int | None = Field(
        default=None, ge=0, strict=True, description="the GPU's index, a number; leave out for the node"
    )


class MarkedOut(BaseModel):
    """A device just drained or marked unhealthy, and what that did to the work on it."""

    node: str
    gpu_index: int | None
    health: str
    stopped_jobs: list[str] = Field(description="jobs stopped: requeued, unless in failed_jobs")
    failed_jobs: list[str] = Field(
        description="of those, the jobs that end failed: a fault spends a retry and none was left (a drain "
        "spends none); their checkpoints stay for a new job to resume from"
    )
    servers: list[str] = Field(description="server leases on it, which keep running")


class SimulatedXidRequest(BaseModel):
    """An XID for a simulated pool's telemetry to report on one GPU."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1, max_length=253)
    gpu_index: int = Field(ge=0, strict=True, description="the GPU's index, a number")
    xid: int = Field(ge=1, le=1_000_000, strict=True, description="the XID, e.g. 79 (fell off the bus)")


class SimulatedXidOut(BaseModel):
    node: str
    gpu_index: int
    xid: int
    effect: str = Field(description="what the health keeper does when the next sample reports it")


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


router = APIRouter(prefix="/admin")


@router.post("/drain", response_model=MarkedOut, summary="Drain a node or GPU: no new work; jobs requeued")
async def post_drain(
    body: DeviceRequest, parts: PartsDep, caller: Annotated[Caller, administrator("drain")]
) -> Any:
    return _marked(parts, body, caller, parts.health.drain)


@router.post("/undrain", response_model=HealthOut, summary="Undrain a node or GPU; queued work is admitted")
async def post_undrain(
    body: DeviceRequest, parts: PartsDep, caller: Annotated[Caller, administrator("undrain")]
) -> Any:
    return _lifted(body, parts.health.undrain)


@router.post("/faults", response_model=MarkedOut, summary="Mark a node or GPU unhealthy until it is repaired")
async def post_fault(
    body: DeviceRequest, parts: PartsDep, caller: Annotated[Caller, administrator("mark devices unhealthy")]
) -> Any:
    return _marked(parts, body, caller, parts.health.fault)


@router.post(
    "/repair", response_model=HealthOut, summary="A node or GPU was repaired: lift its unhealthy marks"
)
async def post_repair(
    body: DeviceRequest, parts: PartsDep, caller: Annotated[Caller, administrator("repair")]
) -> Any:
    return _lifted(body, parts.health.repair)


Mark = Callable[[str, int | None, str], tuple[list[str], list[str]]]


def _marked(parts: ServiceParts, body: DeviceRequest, caller: Caller, mark: Mark) -> Any:
    """Apply ``mark`` (drain or fault) as the caller; what it did, or a 400 naming an unknown device."""
    try:
        stopped, servers = mark(body.node, body.gpu_index, f"{caller.kind} {caller.name}")
    except KeyError as error:
        return _unknown(body, error)
    health = parts.manager.health_of(body.node, body.gpu_index)
    failed = [
        job.id for job in map(parts.jobs.get, stopped) if job.stop and job.requeue_fails(job.stop.reason)
    ]
    return MarkedOut(
        node=body.node,
        gpu_index=body.gpu_index,
        health=health,
        stopped_jobs=stopped,
        failed_jobs=failed,
        servers=servers,
    )


def _lifted(body: DeviceRequest, lift: Callable[[str, int | None], Health]) -> Any:
    try:
        health = lift(body.node, body.gpu_index)
    except KeyError as error:
        return _unknown(body, error)
    return HealthOut(node=body.node, gpu_index=body.gpu_index, health=health)


@router.post(
    "/simulated-xid",
    response_model=SimulatedXidOut,
    summary="A simulated pool's next sample reports an XID on a GPU: try the path a real failure takes",
)
async def post_simulated_xid(
    body: SimulatedXidRequest, parts: PartsDep, caller: Annotated[Caller, administrator("simulate an XID")]
) -> Any:
    simulate = getattr(parts.telemetry.sampler, "simulate_xid", None)
    if simulate is None or not parts.telemetry.simulated:
        raise HTTPException(status.HTTP_409_CONFLICT, "only a simulated pool's telemetry can be given an XID")
    if parts.telemetry.interval <= 0:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            "telemetry sampling is off (GPUPOOL_SAMPLE_SECONDS=0): no sample would say it",
        )
    try:
        simulate(body.node, body.gpu_index, body.xid)
    except KeyError as error:
        return _unknown(DeviceRequest(node=body.node, gpu_index=body.gpu_index), error)
    meaning = CRITICAL_XIDS.get(body.xid)
    effect = (
        f"critical ({meaning}): the GPU is marked unhealthy, its jobs requeued (failed where no retries are "
        "left), until it is repaired or the service restarts"
        if meaning
        else "not critical: the GPU stays in the pool"
    )
    return SimulatedXidOut(node=body.node, gpu_index=body.gpu_index, xid=body.xid, effect=effect)


@router.get("/health", summary="Drained and unhealthy nodes and GPUs, why, and the leases on them")
async def get_health(parts: PartsDep, caller: CallerDep) -> list[MarkOut]:
    caller.check_admin("read pool health")
    manager = parts.manager
    marks = sorted(
        manager.health_marks().items(),
        key=lambda item: (item[0][0], -1 if item[0][1] is None else item[0][1]),
    )
    return [
        MarkOut(
            node=node,
            gpu_index=gpu_index,
            health=manager.health_of(node, gpu_index),
            reasons={health.value: why for health, why in reasons.items()},
            leases=[lease.id for lease in manager.leases_on(node, gpu_index)],
        )
        for (node, gpu_index), reasons in marks
    ]


def _unknown(body: DeviceRequest, error: KeyError) -> JSONResponse:
    field = "gpu_index" if body.gpu_index is not None and "GPU" in str(error) else "node"
    detail = f"{field}: no such {field.replace('_', ' ')} ({error.args[0]})"
    problem = Problem(error="invalid_request", detail=detail, fields=[field])
    return JSONResponse(problem.model_dump(), status_code=400)
