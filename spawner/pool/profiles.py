"""Profiles as data: what a researcher picks in the spawn form, and the pool request each one makes.

A profile is a GPU ask, CPU and memory, who may use it and how long its server may live. :class:`Profile`
checks its own invariants whether it comes from a file or from code, so a bad profile stops the hub at
start-up rather than at someone's first spawn. A profile's GPU ask is at most one of whole GPUs
(:class:`WholeGpus`), a MIG slice (:class:`MigSlice`) or a share of a GPU (:class:`GpuShare`); reading a
profiles file is :mod:`gpupool.spawner.files.profiles_file`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from .devices import Node
from .environments import FIELD as ENVIRONMENT
from .environments import Environment, UnrunnableEnvironment, choose, merged
from .mig import GEOMETRIES, NotMigCapable, UnknownMigProfile, geometry, profile_memory_gb
from .products import mib_to_marketed_gb
from .requests import GpuNeed, MigSlice, Request, WholeGpus

DURATIONS = ("idle_timeout", "max_lifetime", "gpu_idle_timeout", "queue_wait")  # fields in seconds
_DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")


def parse_duration(text: str) -> int | None:
    """Seconds in ``90s``, ``30m``, ``8h``, ``1.5h``, ``2d``, ``1h30m`` or ``3600`` (spaces ignored); None if it
    is not one of those."""
    text = re.sub(r"\s+", "", text)
    if re.fullmatch(r"[0-9]{1,11}", text):
        return int(text)
    if fraction := re.fullmatch(r"([0-9]{1,6}\.[0-9]{1,3})([dhm])", text):  # 1.5h: as a researcher writes it
        return round(float(fraction.group(1)) * {"d": 86400, "h": 3600, "m": 60}[fraction.group(2)])
    match = _DURATION.fullmatch(text)
    if not text or not match or len(text) >= 16:
        return None
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_duration(seconds: float) -> str:
    """What :func:`parse_duration` reads back: ``90`` is ``1m30s``, ``7200`` is ``2h``, ``172800`` is ``2d``."""
    total = round(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts) or "0s"


_SLUG = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class ProfileError(ValueError):
    """A profile, or a profiles file, that cannot be used; the message says where and why."""


class UnknownProfile(LookupError):
    """A slug that names no profile; the message lists the valid ones."""


@dataclass(frozen=True)
class Profile:
    """One choice in the spawn form; ``request()`` is what it asks of the pool. Durations are seconds."""

    slug: str
    display_name: str
    cpu_milli: int
    memory_mib: int
    gpu: GpuNeed | None = None
    description: str = ""
    groups: frozenset[str] = frozenset()  # who may use it; empty allows everyone
    idle_timeout: int | None = None
    max_lifetime: int | None = None
    gpu_idle_timeout: int | None = None
    queue_wait: int | None = (
        None  # how long a spawn may wait in the queue (None: the spawner's start_timeout)
    )
    default: bool = False
    environments: tuple[Environment, ...] = ()  # the software choices it offers (see environments.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", frozenset(self.groups))
        problem = _invariant_problem(self)
        if problem:
            raise ProfileError(problem)

    def request(self, seconds: float | None = None, environment: str | None = None) -> Request:
        """What a server or job of this profile asks the pool for, held for ``seconds`` (a wall-time) or, when
        not given, for the profile's ``max_lifetime``; in ``environment`` (its needs of a GPU count too).
        :class:`UnknownEnvironment` for one the profile does not offer."""
        held = seconds if seconds is not None else self.max_lifetime
        gpu = self.gpu
        chosen = choose(self.environments, environment, self.slug)
        if gpu is not None and chosen is not None:
            gpu = replace(gpu, software=merged(gpu.software, chosen))
        return Request(self.cpu_milli, self.memory_mib, gpu, None if held is None else max(1, round(held)))

    def gpu_description(self) -> str:
        """The GPU ask in the words the form shows: ``1 × H100-80GB``, ``MIG 3g.40gb``, ``CPU only``."""
        need = self.gpu
        if need is None:
            return "CPU only"
        products = " or ".join(sorted(need.products))
        if isinstance(need, WholeGpus):
            memory = (
                f" with at least {mib_to_marketed_gb(need.min_memory_mib):g} GB"
                if need.min_memory_mib
                else ""
            )
            return f"{need.count} × {products or 'any GPU'}{memory}"
        if isinstance(need, MigSlice):
            name = f"MIG {need.profile}" if need.profile else f"MIG slice of at least {need.min_memory_gb} GB"
            return f"{name} on {products}" if products else name
        memory = f" ({need.memory_mib / 1024:g} GB memory)" if need.memory_mib else ""
        return f"{need.milli / 10:g}% of a shared {products or 'GPU'}{memory}"

    def title(self) -> str:
        """The display name with the GPU ask, unless the name already says it: ``Half an H100 (MIG 3g.40gb)``
        stays as it is, ``Big box`` becomes ``Big box (2 × A100-80GB)``."""
        ask = self.gpu_description()
        return self.display_name if ask in self.display_name else f"{self.display_name} ({ask})"

    def visible_to(self, user_groups: Iterable[str], is_admin: bool) -> bool:
        """Whether a user may see and start this profile; admins may use every profile."""
        return is_admin or not self.groups or not self.groups.isdisjoint(user_groups)


def find_profile(profiles: Sequence[Profile], slug: str, offered: Sequence[Profile] | None = None) -> Profile:
    """The profile called ``slug``; raises :class:`UnknownProfile` listing the slugs ``offered`` (every one of
    ``profiles`` unless given: a caller's error lists only what that caller may use)."""
    for profile in profiles:
        if profile.slug == slug:
            return profile
    listed = profiles if offered is None else offered
    if listed:
        valid = ", ".join(sorted(p.slug for p in listed))
    else:
        valid = "none (no profile is open to you)" if profiles else "none (no profiles are configured)"
    raise UnknownProfile(f"unknown profile {slug!r}; choose one of {valid}")


def fits_pool(profile: Profile, nodes: Sequence[Node], environment: str | None = None) -> str | None:
    """None when an empty, healthy pool of ``nodes`` could serve ``profile`` (in ``environment``; default: its
    default one), else a sentence saying why not.

    Asks the placement code itself on a fresh state, so the form and real placement can never disagree.
    """
    # Imported here: placement needs NumPy, and the hub, which reads profiles but never places, should not
    # pay its import (about 0.1 s) at every start.
    from .state import PoolState, Refusal

    request = profile.request(None, environment)
    outcome = PoolState(nodes, "first-fit").place(request, f"fits-pool:{profile.slug}")
    if isinstance(outcome, Refusal) and outcome.never_fits:
        return outcome.reason
    return None


def environments_never_fit(profile: Profile, nodes: Sequence[Node]) -> dict[str, str]:
    """Each of ``profile``'s environments that no GPU of ``nodes`` can ever run (a CUDA newer than their driver
    supports), by slug, with :func:`fits_pool`'s sentence: what the form says beside it and what a lease
    asking for it is refused with. Empty when none of them can: then the profile itself never fits, and a
    refusal naming the environment would blame the researcher's choice for the pool's shape."""
    found = {e.slug: fits_pool(profile, nodes, e.slug) for e in profile.environments}
    unrunnable = {slug: why for slug, why in found.items() if why is not None}
    return {} if len(unrunnable) == len(found) else unrunnable


def preselected_environment(profile: Profile, never_fit: Mapping[str, str]) -> Environment | None:
    """The environment ``profile`` is offered in at first: its default (else its first), unless no GPU can
    run it (``never_fit``, see :func:`environments_never_fit`), then the first one that can. The form
    preselects it; whether the profile fits the pool, and how many could start now, is judged in it."""
    runnable = [e for e in profile.environments if e.slug not in never_fit]
    return next((e for e in runnable if e.default), runnable[0] if runnable else None)


def refuse_environment(profile: Profile, slug: str | None, never_fit: Mapping[str, str]) -> None:
    """Raise :class:`UnrunnableEnvironment` when ``slug`` (``None``: the profile's default) names one of
    ``never_fit`` (see :func:`environments_never_fit`), naming the field, the environments the profile's GPUs
    can run and why not this one."""
    if slug is None:
        default = choose(profile.environments, None, profile.slug)
        slug = default.slug if default is not None else None
    if slug is None or slug not in never_fit:
        return
    runnable = ", ".join(e.slug for e in profile.environments if e.slug not in never_fit)
    raise UnrunnableEnvironment(
        f"{ENVIRONMENT}: profile {profile.slug}'s GPUs can run {runnable}, not {slug!r}: {never_fit[slug]}"
    )


# ---- invariants ------------------------------------------------------------------------------------------


def _invariant_problem(profile: Profile) -> str | None:
    problem = slug_problem(profile.slug)
    if problem:
        return problem
    if not profile.display_name.strip():
        return "display_name must not be empty"
    if profile.cpu_milli < 1:
        return f"cpu must be at least 0.001 cores, got {profile.cpu_milli} milli-CPU"
    if profile.memory_mib < 1:
        return f"memory must be at least 1 MiB, got {profile.memory_mib} MiB"
    for field in DURATIONS:
        seconds = getattr(profile, field)
        if seconds is not None and seconds < 1:
            return f"{field} must be at least 1 second, got {seconds}"
    if profile.gpu_idle_timeout is not None and profile.gpu is None:
        return (
            "gpu_idle_timeout needs a GPU and this profile asks for none; add gpus, mig or share, or drop it"
        )
    if isinstance(profile.gpu, MigSlice):
        return _mig_problem(profile.gpu)
    return _environments_problem(profile)


def _environments_problem(profile: Profile) -> str | None:
    slugs = [e.slug for e in profile.environments]
    for environment in profile.environments:
        where = f"environments: {environment.slug}"
        if slug_problem(environment.slug):
            return f"environments: {slug_problem(environment.slug)}"
        if slugs.count(environment.slug) > 1:
            return f"{where} is listed twice; environment slugs must be unique within a profile"
        if environment.software and profile.gpu is None:
            return f"{where} needs a GPU's CUDA or compute capability, and this profile asks for no GPU"
    if sum(e.default for e in profile.environments) > 1:
        return "environments: at most one may be default: true"
    return None


def slug_problem(slug: object) -> str | None:
    """None when ``slug`` is a usable slug, else the sentence saying what a slug must be."""
    if isinstance(slug, str) and _SLUG.fullmatch(slug):
        return None
    return f"slug must be a lowercase DNS label such as mig-3g (a-z, 0-9 and '-', at most 63), got {slug!r}"


def _mig_problem(need: MigSlice) -> str | None:
    """Why no GPU could ever hold this slice, judged by the MIG geometries alone (no pool needed)."""
    try:
        listed = [geometry(product) for product in sorted(need.products)]
    except NotMigCapable as error:
        return f"mig.products: {error}"
    if need.profile is not None:
        for geo in listed:
            try:
                geo.profile(need.profile)
            except UnknownMigProfile as error:
                return f"mig.profile: {error}"
        names = {name for geo in GEOMETRIES.values() for name in geo.profiles}
        if listed or need.profile in names:
            return None
        shape = need.profile.split(".", 1)[0]
        alike = sorted(
            (n for n in names if n.startswith(f"{shape}.")), key=lambda n: (profile_memory_gb(n), n)
        )
        known = f"{shape} profiles are {', '.join(alike)}" if alike else "names look like 1g.10gb or 3g.40gb"
        return f"mig.profile {need.profile!r} is not a MIG profile of any product; {known}"
    wanted = need.min_memory_gb or 0
    largest = {g.product: max(map(profile_memory_gb, g.profiles)) for g in listed or GEOMETRIES.values()}
    short = [product for product, gb in largest.items() if gb < wanted]
    if listed and short:
        product = short[0]
        most = largest[product]
        return f"mig.min_memory_gb: no MIG profile of {product} has {wanted} GB; its largest has {most} GB"
    if len(short) == len(largest):
        most = max(largest.values())
        return f"mig.min_memory_gb: no MIG profile of any product has {wanted} GB; the largest has {most} GB"
    return None
