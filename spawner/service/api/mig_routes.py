"""``GET api/v1/admin/mig-advice``: which MIG layout each MIG GPU of the live pool should have, from the
leases granted and queued in the store (admins only, 403 otherwise), keeping a slice for each MIG profile the
service offers and leaving GPUs out of service as they are. The dashboard shows the same advice.

The demand is every active lease's request: granted leases (what is held now) and the queue (what waits). The
search is pure (:mod:`...pool.mig_advice`) and cached on its inputs, so the dashboard's refresh every few
seconds recomputes it only when the pool's layouts or the leases change.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
import functools
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter

from ...mig_report import describe_advice
from ...pool.mig_advice import Advice, Ask, MigGpu, advise, demand_of, mig_gpus, mig_products, offered_asks
from ...pool.profiles import Profile
from ...pool.state import PoolState
from ..leasing.lease_manager import LeaseManager
from .context import CallerDep, PartsDep

LIVE_SOURCE = "the leases granted and queued in the gpupool service's store"

router = APIRouter(prefix="/admin")


def live_advice(manager: LeaseManager, profiles: Sequence[Profile]) -> Advice:
    """The advice for the manager's MIG GPUs in service and its active leases, keeping a slice for each MIG
    profile of ``profiles`` (no GPUs in MIG mode: an empty advice)."""
    gpus = manager.inspect(_in_service)
    requests = [lease.request for lease in manager.all_leases(active_only=True)]
    demand = demand_of(requests, {gpu.product for gpu in gpus})
    products = manager.inspect(lambda pool: mig_products(ns.node for ns in pool.nodes))
    keep = offered_asks((p.request() for p in profiles), products)
    return _advice(
        tuple(gpus),
        tuple(sorted(demand.items(), key=lambda item: (item[0].label, item[0].serves))),
        tuple(sorted(set(keep), key=lambda ask: (ask.label, ask.serves))),
    )


def _in_service(pool: PoolState) -> list[MigGpu]:
    """The MIG GPUs that are neither marked unhealthy nor drained, nor on a node that is."""
    out = {
        (ns.node.name, gpu.index)
        for ns in pool.nodes
        for gpu, ok in zip(ns.gpus, ns.gpu_ok, strict=True)
        if not (ns.healthy and ok)
    }
    return [gpu for gpu in mig_gpus(ns.node for ns in pool.nodes) if (gpu.node, gpu.index) not in out]


@functools.lru_cache(maxsize=32)
def _advice(gpus: tuple[MigGpu, ...], demand: tuple[tuple[Ask, int], ...], keep: tuple[Ask, ...]) -> Advice:
    return advise(gpus, dict(demand), keep)


@router.get("/mig-advice", summary="MIG layouts advised for the MIG GPUs, from the leases and queue (admins)")
async def get_mig_advice(parts: PartsDep, caller: CallerDep) -> dict[str, Any]:
    """Each MIG GPU's layout now and advised, the figures replayed on the demand, a mig-parted config and
    pool-file fragments. Advice only: gpupool never changes a layout."""
    caller.check_admin("read MIG advice")
    return describe_advice(live_advice(parts.manager, parts.profiles), LIVE_SOURCE)
