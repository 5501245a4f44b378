"""Quotas: how much of the pool one user may hold at once, by their own limit and their groups' limits.

Two layers apply together, and a request must pass both:

- **The user's quota** always applies: ``QuotaPolicy.user_overrides[user]`` when there is one (it replaces
  the default whole, so an override can lift a limit as well as tighten it), else ``QuotaPolicy.per_user``.
- **Group quotas** limit each member, not the group's total. A user in several configured groups gets, for
  each resource on its own, the most generous of those groups' limits: joining a group can only grant more.
  A configured group that leaves a resource unlimited makes that resource unlimited on the group side.
  Groups without an entry in ``per_group`` are ignored, since most of a user's groups have nothing to do
  with GPUs.

Servers and jobs count together: the caller passes every request the user holds. A request that asks for
none of a resource is never refused for it, so lowering a GPU quota below what a user already holds does not
lock them out of, say, a CPU-only server. Every request asks for CPU and memory, so those limits bound every
lease, CPU-only ones included.

Without a quotas file, :func:`default_policy` still keeps one user from taking the whole pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from .devices import FULL_MILLI, GpuMode, Node
from .requests import GpuShare, MigSlice, Request, WholeGpus


class InvalidQuota(ValueError):
    """A quota that makes no sense (a negative limit); the message names the field."""


@dataclass(frozen=True)
class Quota:
    """Upper limits on what one user holds at once; ``None`` leaves a resource unlimited.

    ``gpu_milli`` bounds whole GPUs (1000 each) and shares (their milli) together. MIG slices are bounded
    by ``mig_slices`` alone: a slice's share of a GPU depends on the product, which a request may leave open.
    """

    whole_gpus: int | None = None
    mig_slices: int | None = None
    gpu_shares: int | None = None
    gpu_milli: int | None = None
    cpu_milli: int | None = None
    memory_mib: int | None = None

    def __post_init__(self) -> None:
        for resource in RESOURCES:
            value = getattr(self, resource.name)
            if value is not None and value < 0:
                raise InvalidQuota(f"{resource.name} must not be negative, got {value}")


class Limit(NamedTuple):
    """One limit that applies to a user: on which resource, set by whom, and how much."""

    resource: str  # a Quota field name
    scope: str  # "user" | "group"
    subject: str  # the user's name, or the group's
    value: int


class QuotaExceeded(ValueError):
    """A request would take a user past a limit; the message names the limit, whose it is, and the numbers."""

    def __init__(self, limit: Limit, held: int, asked: int) -> None:
        self.limit = limit
        self.held = held
        self.asked = asked
        super().__init__(_message(limit, held, asked))


@dataclass(frozen=True)
class _Resource:
    name: str
    one: str  # the noun for one unit, as a user reads it
    many: str
    amount: Callable[[Request], int]
    scale: int = 1  # shown divided by this: milli are shown as GPUs

    def words(self, value: int) -> str:
        """``value`` of this resource as a user reads it: ``1 MIG slice``, ``4 GPUs of whole GPUs and shares``."""
        return f"{value / self.scale:g} {self.one if value == self.scale else self.many}"


def _whole(request: Request) -> int:
    return request.gpu.count if isinstance(request.gpu, WholeGpus) else 0


def _slices(request: Request) -> int:
    return 1 if isinstance(request.gpu, MigSlice) else 0


def _shares(request: Request) -> int:
    return 1 if isinstance(request.gpu, GpuShare) else 0


def _milli(request: Request) -> int:
    return request.gpu_milli if isinstance(request.gpu, WholeGpus | GpuShare) else 0


RESOURCES = (
    _Resource("whole_gpus", "whole GPU", "whole GPUs", _whole),
    _Resource("mig_slices", "MIG slice", "MIG slices", _slices),
    _Resource("gpu_shares", "GPU share", "GPU shares", _shares),
    _Resource(
        "gpu_milli", "GPU of whole GPUs and shares", "GPUs of whole GPUs and shares", _milli, FULL_MILLI
    ),
    _Resource("cpu_milli", "CPU", "CPUs", lambda request: request.cpu_milli, 1000),
    _Resource("memory_mib", "GiB of memory", "GiB of memory", lambda request: request.memory_mib, 1024),
)
_BY_NAME = {r.name: r for r in RESOURCES}


def usage(requests: Iterable[Request]) -> dict[str, int]:
    """What a set of held requests adds up to, per resource (Quota field name)."""
    held = list(requests)
    return {r.name: sum(r.amount(q) for q in held) for r in RESOURCES}


@dataclass(frozen=True)
class QuotaPolicy:
    """Every quota in force: the default per user, per-user overrides, and per-member limits by group."""

    per_user: Quota = Quota()
    per_group: Mapping[str, Quota] = field(default_factory=dict)
    user_overrides: Mapping[str, Quota] = field(default_factory=dict)

    def limits_for(self, user: str, groups: Iterable[str]) -> list[Limit]:
        """Every limit on ``user``: theirs, and per resource the most generous of their configured groups."""
        own = self.user_overrides.get(user, self.per_user)
        configured = sorted((g, self.per_group[g]) for g in set(groups) if g in self.per_group)
        limits = []
        for resource in RESOURCES:
            mine = getattr(own, resource.name)
            if mine is not None:
                limits.append(Limit(resource.name, "user", user, mine))
            values = [(getattr(quota, resource.name), group) for group, quota in configured]
            if values and all(value is not None for value, _ in values):
                best = max(value for value, _ in values)
                group = next(g for value, g in values if value == best)  # ties: the first name in order
                limits.append(Limit(resource.name, "group", group, best))
        return limits

    def check(
        self, owner_user: str, user_groups: Iterable[str], request: Request, held: Iterable[Request]
    ) -> QuotaExceeded | None:
        """The limit ``request`` would break on top of ``held`` (all the user holds), or None if it fits.

        When several limits would break, one is named: the first resource in ``Quota``'s field order, and
        for it the tightest limit, the one the user must get under.
        """
        asked = {r.name: r.amount(request) for r in RESOURCES}
        if not any(asked.values()):
            return None
        totals = usage(held)
        broken = [
            limit
            for limit in self.limits_for(owner_user, user_groups)
            if asked[limit.resource] and totals[limit.resource] + asked[limit.resource] > limit.value
        ]
        if not broken:
            return None
        order = [r.name for r in RESOURCES]
        tightest = min(broken, key=lambda lim: (order.index(lim.resource), lim.value, lim.scope != "user"))
        return QuotaExceeded(tightest, totals[tightest.resource], asked[tightest.resource])


def group_limits_above_user(policy: QuotaPolicy) -> list[str]:
    """Group limits above ``per_user``'s for the same resource, in words: both apply and the tighter wins, so
    such a limit binds only members whom a ``users:`` entry gives more. A course's trial wrote one to let a
    group hold more, and nothing said it could not."""
    said = []
    for group, quota in sorted(policy.per_group.items()):
        for resource in RESOURCES:
            mine, theirs = getattr(policy.per_user, resource.name), getattr(quota, resource.name)
            if mine is not None and theirs is not None and theirs > mine:
                said.append(
                    f"per_group.{group}.{resource.name} is {theirs}, above per_user.{resource.name} ({mine}): "
                    f"both apply and the tighter wins, so members of {group} still hold at most {mine} unless a "
                    f"users: entry gives them more; to let {group} hold more, raise per_user.{resource.name} and "
                    "limit the other groups instead"
                )
    return said


def default_policy(nodes: Iterable[Node], requests: Iterable[Request]) -> QuotaPolicy:
    """The quota when the admin gave none: each user may hold half the pool's CPUs, memory, whole or shared
    GPUs and MIG slices, or what the largest of ``requests`` (the profiles) asks if that is more, so every
    profile can still start. One user's leases, CPU-only ones included, can then never fill the pool."""
    nodes, asks = list(nodes), list(requests)

    def half(total: int, resource: str) -> int:
        largest = max((_BY_NAME[resource].amount(ask) for ask in asks), default=0)
        return max((total + 1) // 2, largest)

    gpu_milli = sum(FULL_MILLI for node in nodes for gpu in node.gpus if gpu.mode is not GpuMode.MIG)
    slices = sum(len(gpu.mig_instances) for node in nodes for gpu in node.gpus if gpu.mode is GpuMode.MIG)
    return QuotaPolicy(
        per_user=Quota(
            mig_slices=half(slices, "mig_slices") if slices else None,
            gpu_milli=half(gpu_milli, "gpu_milli"),
            cpu_milli=half(sum(node.cpu_milli for node in nodes), "cpu_milli"),
            memory_mib=half(sum(node.memory_mib for node in nodes), "memory_mib"),
        )
    )


def describe_quota(quota: Quota) -> str:
    """A quota in words: ``56 CPUs, 1024 GiB of memory, 4 GPUs of whole GPUs and shares``."""
    parts = []
    for resource in RESOURCES:
        value = getattr(quota, resource.name)
        if value is not None:
            parts.append(resource.words(value))
    return ", ".join(parts) or "anything (no limits)"


def _message(limit: Limit, held: int, asked: int) -> str:
    resource = _BY_NAME[limit.resource]

    def amount(value: int) -> str:
        return f"{value / resource.scale:g}"

    allowed = f"no {resource.many}" if limit.value == 0 else resource.words(limit.value)
    if limit.scope == "user":
        who = f"{limit.subject}'s quota allows {allowed} at once"
    else:
        who = f"members of group {limit.subject} may each hold {allowed} at once"
    is_held = "is" if held == resource.scale else "are"
    was_asked = "was" if asked == resource.scale else "were"
    # a queued lease counts as held: it is granted the moment devices free up ("4 are held" read wrong
    # when all 4 were jobs still waiting)
    return f"{who}; {amount(held)} {is_held} held or queued and {amount(asked)} more {was_asked} asked for"


def standing(limits: Iterable[Limit], totals: Mapping[str, int]) -> list[tuple[Limit, str]]:
    """Each limit with what it allows and what is held against it, in words: ``4 whole GPUs, 1 held or
    queued``."""
    rows = []
    for limit in limits:
        resource = _BY_NAME[limit.resource]
        rows.append(
            (
                limit,
                f"{resource.words(limit.value)}, {totals.get(limit.resource, 0) / resource.scale:g} held or queued",
            )
        )
    return rows


def standing_in_words(limits: Iterable[Limit], totals: Mapping[str, int], whose: str = "Your quota") -> str:
    """``Your quota: 4 whole GPUs, 1 held or queued · no GPU shares (group students) · 56 CPUs, 16 held or
    queued``: per resource the limit that binds (the tightest; a group's is named), with what the user holds
    against it, servers and jobs, queued ones too."""
    tightest: dict[str, Limit] = {}
    for limit in limits:
        found = tightest.get(limit.resource)
        if found is None or (limit.value, limit.scope != "user") < (found.value, found.scope != "user"):
            tightest[limit.resource] = limit
    rows = []
    for resource in RESOURCES:
        if resource.name not in tightest:
            continue
        limit = tightest[resource.name]
        by = f" (group {limit.subject})" if limit.scope == "group" else ""
        held = totals.get(resource.name, 0) / resource.scale
        if limit.value:
            rows.append(f"{resource.words(limit.value)}{by}, {held:g} held or queued")
        else:
            rows.append(f"no {resource.many}{by}")
    return f"{whose}: " + (" · ".join(rows) if rows else "no limits")
