"""The pool's allocations: who holds which devices, and the one place that places and releases them.

``PoolState.place`` asks the policy to choose among the nodes that could serve a request and records the
choice; ``release`` gives everything back. ``check_invariants`` recomputes every count from the
allocations and says what is wrong, so tests can call it after any sequence of operations.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .devices import FULL_MILLI, GpuMode, Health, Node
from .explain import explain_refusal
from .gpu_equivalents import mig_instance_milli
from .invariants import node_problems
from .node_state import ANY_WHOLE_GPU, NodeState, Option, gpu_kind_matches, instance_matches
from .outside import hold_outside_use
from .policies import PlacementPolicy, policy_by_name
from .requests import GpuNeed, GpuShare, MigSlice, Request, WholeGpus


@dataclass(frozen=True)
class Grant:
    """One device handed to an owner: a whole GPU, a MIG instance, or a share of a GPU."""

    kind: str  # "gpu" | "mig" | "share"
    uuid: str  # what CUDA_VISIBLE_DEVICES takes: GPU-… or MIG-…
    gpu_uuid: str
    label: str
    milli: int  # thousandths of a GPU: 1000 whole, the share's, a MIG instance's compute part
    memory_mib: int


@dataclass(frozen=True)
class Allocation:
    """Everything one owner holds on one node."""

    owner: str
    node: str
    request: Request
    grants: tuple[Grant, ...]

    @property
    def visible_devices(self) -> str:
        """The value for ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES``."""
        return visible_devices(self.grants)


def visible_devices(grants: Iterable[Grant]) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value for these grants: their ``GPU-…``/``MIG-…`` UUIDs, comma-joined."""
    return ",".join(g.uuid for g in grants)


@dataclass(frozen=True)
class Refusal:
    """Why a request could not be placed now, in words a user reads."""

    request: Request
    reason: str
    never_fits: bool = False  # True when even an empty, healthy pool could not serve it


@dataclass(frozen=True)
class OutsideUse:
    """Devices on one node held by work gpupool did not place (other workloads on a shared cluster).

    Counts only: the backend knows how many devices of each kind are taken, not which. ``mig`` maps a profile
    to its instances taken; the profile ``"*"`` takes instances of any profile.
    """

    whole_gpus: int = 0
    mig: Mapping[str, int] = field(default_factory=dict)
    shares: int = 0


OUTSIDE_OWNER = "outside"  # owners of outside holdings are "outside:<node>:<n>"; no lease id has a colon


class AlreadyHolding(ValueError):
    """An owner asked for devices while it still holds some; an owner holds one allocation at a time."""


class CannotRestore(ValueError):
    """Recorded devices that this pool cannot hand back to their owner; the message says which and why."""


class PoolState:
    """Nodes, what is free on them, and the allocations; the only code that changes who holds what."""

    def __init__(
        self,
        nodes: Iterable[Node],
        policy: str | PlacementPolicy = "gpupool",
        *,
        ranks: Sequence[int] | None = None,
        explain_refusals: bool = True,
    ) -> None:
        node_list = list(nodes)
        names = [n.name for n in node_list]
        if len(set(names)) != len(names):
            duplicate = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"node {duplicate!r} appears more than once in the pool")
        ranks = list(ranks) if ranks is not None else list(range(len(node_list)))
        self.nodes = tuple(NodeState(node, rank) for node, rank in zip(node_list, ranks, strict=True))
        self._by_name = {ns.node.name: ns for ns in self.nodes}
        self._allocations: dict[str, Allocation] = {}
        self.explain_refusals = explain_refusals
        self.policy = policy_by_name(policy) if isinstance(policy, str) else policy
        self._state_ids: dict[tuple[object, ...], int] = {}
        self._options: dict[GpuNeed, dict[int, list[Option]]] = {}
        self._product_masks: dict[frozenset[str], np.ndarray] = {}
        self._cpu_free = np.array([ns.cpu_free for ns in self.nodes], dtype=np.int64)
        self._mem_free = np.array([ns.mem_free for ns in self.nodes], dtype=np.int64)
        self._share_free = np.zeros(len(self.nodes), dtype=np.int64)
        self._whole_free = np.zeros(len(self.nodes), dtype=np.int64)
        self._healthy = np.zeros(len(self.nodes), dtype=bool)
        self._index = {ns.node.name: i for i, ns in enumerate(self.nodes)}
        self._by_rank = np.argsort(np.array(ranks, dtype=np.int64), kind="stable")
        self._state = np.zeros(len(self.nodes), dtype=np.int64)  # each node's state id
        for i in range(len(self.nodes)):
            self._refresh(i)
        self.policy.prepare(self)

    # ---- reading --------------------------------------------------------------------------------------

    @property
    def allocations(self) -> dict[str, Allocation]:
        return dict(self._allocations)

    def allocation(self, owner: str) -> Allocation | None:
        return self._allocations.get(owner)

    def node(self, name: str) -> NodeState:
        return self._by_name[name]

    def comes_back(self, node: str | None, gpu_uuids: Iterable[str]) -> bool:
        """Whether devices held on ``node`` return to the pool when released: a node or GPU drained, failed or
        gone keeps them out (so no wait should count on them)."""
        found = self._by_name.get(node or "")
        if found is None:
            return node is None
        usable = {gpu.uuid for gpu, ok in zip(found.gpus, found.gpu_ok, strict=True) if ok}
        return found.healthy and all(uuid in usable for uuid in gpu_uuids)

    # ---- placing and releasing ------------------------------------------------------------------------

    def candidates(self, request: Request) -> list[tuple[NodeState, list[Option]]]:
        """The nodes that could serve ``request`` now, with the ways each could.

        Nodes in the same state (same type, same things free) serve a request alike. Unless the policy must
        see every node, only the lowest-ranked node of each state is offered, so a decision costs as many
        scores as there are distinct states, not nodes: most of a large pool is a few states.
        """
        mask = self._prefilter(request)  # healthy, with the CPU, memory and devices
        if self.policy.sees_every_node:
            rows = np.flatnonzero(mask).tolist()
        else:
            in_rank_order = self._by_rank[mask[self._by_rank]]
            rows = in_rank_order[_first_of_each(self._state[in_rank_order])].tolist()
        if request.gpu is None:
            anywhere: list[Option] = [()]  # one list for every node: policies only read options
            return [(self.nodes[i], anywhere) for i in rows]
        # Device options depend only on the GPU need and the node's devices, so nodes alike share them.
        cache = self._options.setdefault(request.gpu, {})
        found = []
        for i in rows:
            node_state = self.nodes[i]
            options = cache.get(node_state.gpu_state_id)
            if options is None:
                options = cache[node_state.gpu_state_id] = node_state.gpu_options(request.gpu)
            if options:
                found.append((node_state, options))
        return found

    def _prefilter(self, request: Request) -> np.ndarray:
        # Cheap vector tests that rule out most nodes before any per-node Python runs.
        mask = self._healthy & (self._cpu_free >= request.cpu_milli) & (self._mem_free >= request.memory_mib)
        need = request.gpu
        if isinstance(need, GpuShare):
            mask &= self._share_free >= need.milli
        elif isinstance(need, WholeGpus):
            mask &= self._whole_free >= need.count
        if need is not None and need.products:
            mask &= self._product_mask(need.products)
        return mask

    def _product_mask(self, products: frozenset[str]) -> np.ndarray:
        mask = self._product_masks.get(products)
        if mask is None:
            mask = np.array([bool(ns.node.products & products) for ns in self.nodes], dtype=bool)
            self._product_masks[products] = mask
        return mask

    def place(self, request: Request, owner: str) -> Allocation | Refusal:
        """Give ``owner`` devices for ``request``, or say why none can be given now."""
        if owner in self._allocations:
            raise AlreadyHolding(f"{owner} already holds devices on {self._allocations[owner].node}")
        candidates = self.candidates(request)
        if not candidates:
            if not self.explain_refusals:
                return Refusal(request, "no node can serve this request now")
            reason, never = explain_refusal(self.nodes, request)
            return Refusal(request, reason, never)
        node_state, option = self.policy.select(request, candidates)
        # Checked on the chosen node alone: a scan of the candidates would cost as much as the choice.
        if self._by_name.get(node_state.node.name) is not node_state or option not in node_state.options(
            request
        ):
            raise AssertionError(
                f"policy {self.policy.name} chose {option} on {node_state.node.name}, which cannot serve it"
            )
        node_state.take(owner, request, option)
        self._changed(node_state)
        allocation = Allocation(owner, node_state.node.name, request, _grants(node_state, request, option))
        self._allocations[owner] = allocation
        return allocation

    def release(self, owner: str) -> Allocation | None:
        """Return everything ``owner`` holds to the pool; None when it held nothing."""
        allocation = self._allocations.pop(owner, None)
        if allocation is not None:
            node_state = self._by_name[allocation.node]
            node_state.give_back(owner)
            self._changed(node_state)
        return allocation

    def restore(self, owner: str, request: Request, node: str, option: Option) -> Allocation:
        """Hand ``owner`` exactly the devices ``option`` on ``node`` again, as recorded before a restart.

        Placement is skipped (the devices were chosen once already), but every device must still be of the
        right kind and free, so a restore can never hand out a device twice. Health is not asked: held
        devices stay held on an unhealthy or drained node, as with :meth:`set_health`.
        """
        if owner in self._allocations:
            raise AlreadyHolding(f"{owner} already holds devices on {self._allocations[owner].node}")
        node_state = self._by_name.get(node)
        if node_state is None:
            raise CannotRestore(f"node {node} is not in the pool")
        problem = _restore_problem(node_state, request, option)
        if problem:
            raise CannotRestore(f"{node}: {problem}")
        node_state.take(owner, request, option)
        self._changed(node_state)
        allocation = Allocation(owner, node, request, _grants(node_state, request, option))
        self._allocations[owner] = allocation
        return allocation

    def hold_outside(self, node: str, use: OutsideUse) -> str | None:
        """Make ``use`` what outside work holds on ``node``, replacing what it held before; say what could not
        be held (more than is free), or None.

        Outside holdings are allocations like any other (so every count, invariant and policy sees them),
        owned by ``outside:<node>:<n>``, one device each, taken from the devices free now, whatever their
        health. They are never recorded anywhere: the backend tells them again after a restart.
        """
        node_state = self._by_name[node]  # KeyError for an unknown node
        prefix = f"{OUTSIDE_OWNER}:{node}:"
        for owner in [o for o in node_state.holders if o.startswith(prefix)]:
            self.release(owner)
        owners = (f"{prefix}{n}" for n in itertools.count())
        missing = hold_outside_use(
            node_state, use, lambda request, option: self.restore(next(owners), request, node, option)
        )
        return ", ".join(missing) or None

    def set_health(self, node: str, health: Health, gpu_index: int | None = None) -> None:
        """Mark a node, or one GPU on it, healthy, unhealthy or drained. Held devices stay held."""
        node_state = self._by_name[node]
        if gpu_index is None:
            node_state.set_health(node_health=health)
        else:
            positions = [p for p, g in enumerate(node_state.gpus) if g.index == gpu_index]
            if not positions:
                raise KeyError(f"node {node} has no GPU {gpu_index}")
            node_state.set_health(gpu_health={positions[0]: health})
        self._changed(node_state)

    def _changed(self, node_state: NodeState) -> None:
        self._refresh(self._index[node_state.node.name])

    def _refresh(self, i: int) -> None:
        ns = self.nodes[i]
        if len(self._state_ids) > 1_000_000:  # a long-lived pool: start every cache afresh
            self._state_ids.clear()
            self._options.clear()
            self.policy.prepare(self)
            for j in range(len(self.nodes)):
                self._assign_ids(j)
        self._assign_ids(i)
        self._cpu_free[i] = ns.cpu_free
        self._mem_free[i] = ns.mem_free
        self._healthy[i] = ns.healthy
        shared = [ns.free[p] for p, g in enumerate(ns.gpus) if g.mode is GpuMode.SHARED and ns.gpu_ok[p]]
        self._share_free[i] = max(shared, default=0)
        self._whole_free[i] = len(ns.whole_gpu_candidates(ANY_WHOLE_GPU))

    def _assign_ids(self, i: int) -> None:
        ns = self.nodes[i]
        ns.state_id = self._state_ids.setdefault(ns.state_key(), len(self._state_ids))
        ns.gpu_state_id = self._state_ids.setdefault(ns.gpu_state_key(), len(self._state_ids))
        self._state[i] = ns.state_id

    # ---- invariants -----------------------------------------------------------------------------------

    def check_invariants(self) -> list[str]:
        """Every broken invariant, recomputed from the allocations alone; empty when all hold."""
        problems: list[str] = []
        by_node: dict[str, list[Allocation]] = {name: [] for name in self._by_name}
        for allocation in self._allocations.values():
            by_node[allocation.node].append(allocation)
        for ns in self.nodes:
            problems += node_problems(ns, by_node[ns.node.name])
        return problems


def _first_of_each(values: np.ndarray) -> np.ndarray:
    """The position of the first occurrence of each distinct value, by value.

    ``np.unique(..., return_index=True)`` does the same with a stable argsort, six times slower on 12,000
    nodes; sorting ``value·n + position`` (unique keys, so no stability needed) finds the same positions.
    """
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    keys = values.astype(np.int64) * n + np.arange(n, dtype=np.int64)
    keys.sort()
    grouped = keys // n
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(grouped[1:], grouped[:-1], out=first[1:])
    positions: np.ndarray = keys[first] % n
    return positions


def _restore_problem(ns: NodeState, request: Request, option: Option) -> str | None:
    """Why ``option`` cannot be taken for ``request`` on this node now, or None (health aside)."""
    if request.cpu_milli > ns.cpu_free or request.memory_mib > ns.mem_free:
        return "not enough CPU or memory left"
    need = request.gpu
    if need is None:
        return None if option == () else f"a request without a GPU cannot hold devices {option}"
    size = need.count if isinstance(need, WholeGpus) else 2 if isinstance(need, MigSlice) else 1
    if len(option) != size or (isinstance(need, WholeGpus) and len(set(option)) != size):
        return f"devices {option} do not have the request's shape"
    positions = option[:1] if isinstance(need, MigSlice) else option
    if not all(0 <= p < len(ns.gpus) for p in positions):
        return f"devices {option} are not on this node"
    for p in positions:
        gpu = ns.gpus[p]
        if not gpu_kind_matches(gpu, need):
            return f"{gpu.label} ({gpu.mode.value}) cannot serve this request"
        if not isinstance(need, MigSlice):
            busy = ns.gpu_busy_reason(p, need, ignore_health=True)  # held devices stay held when unhealthy
            if busy:
                return f"{gpu.label} is {busy}"
    if isinstance(need, MigSlice):
        position, index = option
        instances = ns.gpus[position].mig_instances
        if not 0 <= index < len(instances):
            return f"{ns.gpus[position].label} has no MIG instance {index}"
        if not instance_matches(instances[index], need):
            return f"{instances[index].uuid} is now a {instances[index].profile} instance, not what was asked"
        if index not in ns.mig_free[position]:
            return f"{instances[index].uuid} is in use"
    return None


def _grants(ns: NodeState, request: Request, option: Option) -> tuple[Grant, ...]:
    need = request.gpu
    gpus = ns.gpus
    if isinstance(need, WholeGpus):
        return tuple(
            Grant("gpu", gpus[p].uuid, gpus[p].uuid, gpus[p].label, FULL_MILLI, gpus[p].memory_mib)
            for p in option
        )
    if isinstance(need, GpuShare):
        gpu = gpus[option[0]]
        memory = need.memory_mib  # the share's memory cap; 0 means no cap of its own
        return (
            Grant("share", gpu.uuid, gpu.uuid, f"{need.milli / 10:g}% of {gpu.label}", need.milli, memory),
        )
    if isinstance(need, MigSlice):
        gpu = gpus[option[0]]
        instance = gpu.mig_instances[option[1]]
        label = f"{instance.profile} on {gpu.label}"
        milli = mig_instance_milli(gpu.product, instance.profile)  # its GPU-equivalent (gpu_equivalents.py)
        return (Grant("mig", instance.uuid, gpu.uuid, label, milli, instance.memory_mib),)
    return ()
