"""What is free on one node right now, and which devices on it could serve a request.

This is the hot path of every placement (a decision on a 1,213-node cluster visits every node), so it
keeps plain lists and counters instead of re-deriving them from the allocations. Whether a device could
ever serve a need (:func:`gpu_kind_matches`) and why it cannot right now (:meth:`NodeState.gpu_busy_reason`)
are asked in one place, so placement and the refusal messages never disagree.
"""

from __future__ import annotations

from .devices import FULL_MILLI, Gpu, GpuMode, Health, MigInstance, Node
from .mig import GEOMETRIES, profile_memory_gb
from .requests import GpuNeed, GpuShare, MigSlice, Request, WholeGpus

Option = tuple[int, ...]
"""Devices on one node that would serve a request: GPU positions for whole GPUs, ``(position,)`` for a
share, ``(position, instance)`` for a MIG slice, ``()`` for CPU only."""

ANY_WHOLE_GPU = WholeGpus(1)


def gpu_kind_matches(gpu: Gpu, need: GpuNeed) -> bool:
    """Whether ``gpu`` is the right kind for ``need`` when empty and healthy (product, mode, memory, and the
    CUDA version and compute capability it needs)."""
    if need.products and gpu.product not in need.products:
        return False
    if need.software and need.software.refusal(gpu) is not None:
        return False
    if isinstance(need, MigSlice):
        return gpu.mode is GpuMode.MIG
    if isinstance(need, GpuShare):
        return gpu.mode is GpuMode.SHARED and need.memory_mib <= gpu.memory_mib
    whole_possible = gpu.mode is GpuMode.WHOLE or (gpu.mode is GpuMode.SHARED and not gpu.shares_only)
    return whole_possible and gpu.memory_mib >= need.min_memory_mib


def instance_matches(instance: MigInstance, need: MigSlice) -> bool:
    if need.profile is not None:
        return instance.profile == need.profile
    return need.min_memory_gb is not None and profile_memory_gb(instance.profile) >= need.min_memory_gb


class NodeState:
    """Free CPU, memory and devices of one node; changed only through :meth:`take`, :meth:`give_back`
    and :meth:`set_health`."""

    __slots__ = (
        "cpu_free",
        "free",
        "gpu_health",
        "gpu_ok",
        "gpu_state_id",
        "health",
        "healthy",
        "holders",
        "mem_free",
        "mig_free",
        "node",
        "rank",
        "share_count",
        "share_mem_free",
        "state_id",
        "type_key",
    )

    def __init__(self, node: Node, rank: int) -> None:
        self.node = node
        self.rank = rank  # ties between equally good nodes go to the lower rank
        self.cpu_free = node.cpu_milli
        self.mem_free = node.memory_mib
        self.free = [FULL_MILLI for _ in node.gpus]  # milli free; a MIG GPU's share of free memory slices
        self.share_mem_free = [g.memory_mib for g in node.gpus]
        self.share_count = [0 for _ in node.gpus]
        self.mig_free = [set(range(len(g.mig_instances))) for g in node.gpus]
        self.health = node.health
        self.gpu_health = [g.health for g in node.gpus]
        self.healthy = self.health is Health.HEALTHY  # the booleans are what the hot path reads
        self.gpu_ok = [h is Health.HEALTHY for h in self.gpu_health]
        self.holders: dict[str, tuple[Request, Option]] = {}
        # Everything about the node except its name and device identities: equal nodes share cached work.
        self.type_key = (
            node.cpu_milli,
            node.memory_mib,
            tuple(
                (
                    g.product,
                    g.memory_mib,
                    g.compute_capability,
                    g.driver_version,
                    g.cuda_version,
                    g.mode,
                    g.nvlink_group,
                    g.max_shares,
                    tuple((m.profile, m.start, m.memory_mib) for m in g.mig_instances),
                )
                for g in node.gpus
            ),
        )
        self.state_id = -1  # set by the pool: equal ids mean equal type and equal free resources
        self.gpu_state_id = -1  # set by the pool: equal ids mean equal devices, equally free

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return self.node.gpus

    def state_key(self) -> tuple[object, ...]:
        """The node's type and everything free on it: nodes with equal keys serve requests identically."""
        return (self.healthy, self.cpu_free, self.mem_free, self.gpu_state_key())

    def gpu_state_key(self) -> tuple[object, ...]:
        """The node's devices and what is free on them: equal keys offer the same devices to a GPU need."""
        return (
            self.type_key,
            tuple(self.free),
            tuple(self.share_mem_free),
            tuple(self.share_count),
            tuple(self.gpu_ok),
            tuple(frozenset(free) for free in self.mig_free),
        )

    # ---- what could serve a request -------------------------------------------------------------------

    def options(self, request: Request) -> list[Option]:
        """Every way this node could serve ``request`` now (empty when it cannot)."""
        if not self.healthy or request.cpu_milli > self.cpu_free or request.memory_mib > self.mem_free:
            return []
        return [()] if request.gpu is None else self.gpu_options(request.gpu)

    def gpu_options(self, need: GpuNeed) -> list[Option]:
        """The devices that could serve ``need`` now, whatever the node's CPU, memory and health."""
        if isinstance(need, WholeGpus):
            chosen = self._whole_gpu_choice(need)
            return [chosen] if chosen is not None else []
        usable = [p for p, gpu in enumerate(self.node.gpus) if gpu_kind_matches(gpu, need)]
        if isinstance(need, GpuShare):
            return [(p,) for p in usable if self.gpu_busy_reason(p, need) is None]
        return [
            (p, index)
            for p in usable
            if self.gpu_ok[p]
            for index in sorted(self.mig_free[p])
            if instance_matches(self.node.gpus[p].mig_instances[index], need)
        ]

    def gpu_busy_reason(
        self, position: int, need: WholeGpus | GpuShare, *, ignore_health: bool = False
    ) -> str | None:
        """Why a GPU of the right kind cannot take ``need`` now, or None when it can."""
        gpu = self.node.gpus[position]
        if not self.gpu_ok[position] and not ignore_health:
            return self.gpu_health[position].value
        if isinstance(need, WholeGpus):
            return None if self.free[position] == FULL_MILLI and self.share_count[position] == 0 else "in use"
        if self.free[position] < need.milli:
            return "in use"
        if gpu.max_shares is not None and self.share_count[position] >= gpu.max_shares:
            return f"at its limit of {gpu.max_shares} holders"
        if self.share_mem_free[position] < need.memory_mib:
            return "out of GPU memory for shares"
        return None

    def whole_gpu_candidates(self, need: WholeGpus) -> list[int]:
        """Positions of GPUs that are entirely free and acceptable to ``need``."""
        return [
            position
            for position, gpu in enumerate(self.node.gpus)
            if gpu_kind_matches(gpu, need) and self.gpu_busy_reason(position, need) is None
        ]

    def _whole_gpu_choice(self, need: WholeGpus) -> Option | None:
        free = self.whole_gpu_candidates(need)
        if len(free) < need.count:
            return None
        # Prefer one NVLink group, the tightest one that fits, so larger groups stay whole for larger asks.
        groups: dict[int, list[int]] = {}
        for position in free:
            group = self.node.gpus[position].nvlink_group
            if group is not None:
                groups.setdefault(group, []).append(position)
        fitting = [members for members in groups.values() if len(members) >= need.count]
        if fitting:
            return tuple(min(fitting, key=lambda members: (len(members), members[0]))[: need.count])
        return tuple(free[: need.count])

    # ---- changing what is free -------------------------------------------------------------------------

    def take(self, owner: str, request: Request, option: Option) -> None:
        """Hand the devices in ``option`` (from :meth:`options`) and the CPU and memory to ``owner``."""
        self.cpu_free -= request.cpu_milli
        self.mem_free -= request.memory_mib
        self._change_devices(request, option, sign=-1)
        self.holders[owner] = (request, option)

    def give_back(self, owner: str) -> tuple[Request, Option]:
        request, option = self.holders.pop(owner)
        self.cpu_free += request.cpu_milli
        self.mem_free += request.memory_mib
        self._change_devices(request, option, sign=+1)
        return request, option

    def _change_devices(self, request: Request, option: Option, sign: int) -> None:
        need = request.gpu
        if isinstance(need, WholeGpus):
            for position in option:
                self.free[position] += sign * FULL_MILLI
        elif isinstance(need, GpuShare):
            (position,) = option
            self.free[position] += sign * need.milli
            self.share_mem_free[position] += sign * need.memory_mib
            self.share_count[position] -= sign
        elif isinstance(need, MigSlice):
            position, index = option
            if sign < 0:
                self.mig_free[position].discard(index)
            else:
                self.mig_free[position].add(index)
            self.free[position] = mig_free_milli(self.node.gpus[position], self.mig_free[position])

    def set_health(
        self, node_health: Health | None = None, gpu_health: dict[int, Health] | None = None
    ) -> None:
        if node_health is not None:
            self.health = node_health
            self.healthy = node_health is Health.HEALTHY
        for position, health in (gpu_health or {}).items():
            self.gpu_health[position] = health
            self.gpu_ok[position] = health is Health.HEALTHY


def mig_free_milli(gpu: Gpu, free_instances: set[int]) -> int:
    """A MIG GPU's free memory slices as thousandths of the GPU, for policies that weigh free capacity."""
    geo = GEOMETRIES[gpu.product]
    held = sum(
        geo.profile(instance.profile).memory_slices
        for index, instance in enumerate(gpu.mig_instances)
        if index not in free_instances
    )
    return FULL_MILLI - FULL_MILLI * held // geo.memory_slices
