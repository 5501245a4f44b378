"""Where a stored lease's devices sit on the pool's nodes, for restoring it after a restart."""

from __future__ import annotations

from ...pool.leases import Lease
from ...pool.node_state import Option
from ...pool.state import CannotRestore, PoolState


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
