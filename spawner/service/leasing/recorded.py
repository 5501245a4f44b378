"""Restoring the store's leases after a restart: granted ones at exactly their recorded devices, queued ones
back in the queue in their order."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ...pool.leases import Lease, LeaseState
from ...pool.node_state import Option
from ...pool.queue import AdmissionQueue, QueuedRequest
from ...pool.requests import describe
from ...pool.state import CannotRestore, PoolState
from ..store.lease_store import LeaseStore

log = logging.getLogger(__name__)

DEVICES_GONE = "devices gone"


def restore_leases(
    store: LeaseStore, pool: PoolState, queue: AdmissionQueue, clock: Callable[[], float]
) -> tuple[Lease, ...]:
    """Put every active lease of ``store`` back in ``pool`` or ``queue``; the leases whose devices the pool no
    longer has, released now with reason "devices gone: …"."""
    gone: list[Lease] = []
    for lease in store.active():
        if lease.state is LeaseState.QUEUED:
            queue.add(queue_entry(lease))  # arrival order, so ties keep their order too
            continue
        try:
            pool.restore(lease.id, lease.request, lease.node or "", recorded_option(pool, lease))
        except CannotRestore as error:
            released = store.mark_released(lease.id, f"{DEVICES_GONE}: {error}", clock())
            log.warning("lease %s of %s released at start-up: %s", lease.id, lease.user, error)
            gone.append(released)
    return tuple(gone)


def queue_entry(lease: Lease) -> QueuedRequest:
    """The queue's entry for a queued lease; a job's may backfill, since its max_runtime is enforced."""
    request = lease.request
    backfills = lease.owner_kind == "job" and request.seconds is not None
    return QueuedRequest(
        *(lease.id, lease.id, lease.user, request, lease.priority, lease.created_at, describe(request)),
        backfills,
    )


def recorded_option(pool: PoolState, lease: Lease) -> Option:
    """The node positions of the lease's recorded devices; CannotRestore when any is no longer there."""
    try:
        node = pool.node(lease.node or "")
    except KeyError:
        raise CannotRestore(f"node {lease.node} is not in the pool") from None
    gpus = {gpu.uuid: position for position, gpu in enumerate(node.gpus)}
    instances = {
        instance.uuid: (position, index)
        for position, gpu in enumerate(node.gpus)
        for index, instance in enumerate(gpu.mig_instances)
    }
    option: list[int] = []
    for grant in lease.devices:
        if grant.kind == "mig" and grant.uuid in instances:
            option.extend(instances[grant.uuid])
        elif grant.kind != "mig" and grant.uuid in gpus:
            option.append(gpus[grant.uuid])
        else:
            raise CannotRestore(f"{grant.label} ({grant.uuid}) is no longer on node {node.node.name}")
    return tuple(option)
