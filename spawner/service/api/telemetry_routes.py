"""Telemetry over HTTP: Prometheus metrics at ``{prefix}metrics`` and recent samples at ``api/v1/telemetry``.

:data:`metrics_router` holds ``GET /metrics`` (the app includes it under the prefix, so it answers at
``/services/gpupool/metrics``); :data:`router` holds ``GET /telemetry`` (included under ``{prefix}api/v1``).
The metrics themselves (names, labels, units) are built in :mod:`..telemetry.metrics`; :func:`render_metrics`
is re-exported here. The sampling loop that fills the history is started by the service's lifespan
(:mod:`..assembly`), not by these routes.

Who may read what: ``GET {prefix}metrics`` needs an administrator's token (``custom:gpupool:admin``), as
JupyterHub's own ``/hub/metrics`` needs one, unless the service runs with ``public_metrics``;
``GET {prefix}api/v1/telemetry`` gives administrators and the hub every device, and a user the devices of
their own granted leases.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response, status
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ...telemetry.samples import Sample
from ..telemetry.metrics import device_users, pool_devices, render_metrics
from .auth import Caller
from .context import CallerDep, PartsDep

__all__ = ["metrics_router", "render_metrics", "router"]

router = APIRouter()
metrics_router = APIRouter()


async def metrics_caller(
    request: Request, parts: PartsDep, authorization: Annotated[str | None, Header()] = None
) -> Caller | None:
    """None when metrics are public; else the caller, who must be an administrator (403 otherwise)."""
    if parts.public_metrics:
        return None
    caller = await parts.auth.caller(request, authorization)
    if not caller.is_admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"{caller.kind} {caller.name} may not read metrics: they need custom:gpupool:admin",
        )
    return caller


@metrics_router.get(
    "/metrics", summary="Prometheus metrics of the pool and its devices", include_in_schema=False
)
async def get_metrics(
    parts: PartsDep, _caller: Annotated[Caller | None, Depends(metrics_caller)]
) -> Response:
    body = render_metrics(parts.manager, parts.telemetry, usage=parts.usage, culls=parts.culls.counts)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/telemetry", summary="Recent samples of the devices the caller may see")
async def get_telemetry(
    parts: PartsDep,
    caller: CallerDep,
    since: Annotated[
        float | None,
        Query(allow_inf_nan=False, description="only samples taken after this time (epoch s)"),
    ] = None,
) -> dict[str, Any]:
    everything = caller.sees_everyone
    users = device_users(parts.manager)
    devices = parts.manager.inspect(pool_devices)
    if not everything:
        devices = [d for d in devices if caller.name in users.get(d.uuid, [])]
    telemetry = parts.telemetry
    history = telemetry.history
    return {
        "simulated": telemetry.simulated,
        "backend": telemetry.sampler.backend,
        "interval_seconds": telemetry.interval,
        "window_seconds": history.window_seconds,
        "devices": [
            {
                "uuid": d.uuid,
                "node": d.node,
                "gpu": d.gpu,
                "mig_profile": d.mig_profile,
                "memory_mib": d.memory_mib,
                "users": users.get(d.uuid, []) if everything else [caller.name],
                "samples": [_sample_json(s) for s in history.recent(d.uuid, since)],
            }
            for d in devices
        ],
    }


def _sample_json(sample: Sample) -> dict[str, Any]:
    data = sample.to_json()
    for key in ("uuid", "node", "gpu_index", "mig_profile"):  # said once per device
        del data[key]
    return data
