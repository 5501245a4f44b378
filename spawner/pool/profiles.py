"""Profiles as data: what a researcher picks in the spawn form, and the pool request each one makes.

A profile is a GPU ask, CPU and memory, who may use it and how long its server may live. :class:`Profile`
checks its own invariants whether it comes from a file or from code, so a bad profile stops the hub at
start-up rather than at someone's first spawn. The file format is documented at the top of
``hub_config/profiles.yaml`` (:data:`EXAMPLE_PROFILES`); a profile's GPU ask is at most one of::

    gpus:  {count: 2, products: [A100-40GB], min_memory_gb: 40}  # whole GPUs, one node; any spelling
    mig:   {profile: 3g.40gb, products: [H100-80GB]}             # or {min_memory_gb: 20, products: [...]}
    share: {fraction: 0.25, memory_gb: 6, products: [L4]}        # or milli: 250 instead of fraction

Every problem raises :class:`ProfileError` naming the file, the profile (by slug, or by its position counted
from 1 when the slug is missing or bad) and the field; the loader returns every profile or none.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, NoReturn

import yaml

from .devices import Node
from .mig import GEOMETRIES, NotMigCapable, UnknownMigProfile, geometry, profile_memory_gb
from .requests import GpuNeed, GpuShare, InvalidRequest, MigSlice, Request, WholeGpus
from .state import PoolState, Refusal

EXAMPLE_PROFILES: Path = Path(str(files("gpupool.hub_config").joinpath("profiles.yaml")))

_FIELDS = (
    "slug", "display_name", "description", "gpus", "mig", "share", "cpu", "memory", "groups",
    "idle_timeout", "max_lifetime", "gpu_idle_timeout", "default",
)  # fmt: skip
_GPU_FIELDS = {
    "gpus": ("count", "products", "min_memory_gb"),
    "mig": ("profile", "min_memory_gb", "products"),
    "share": ("fraction", "milli", "memory_gb", "products"),
}
_GPU_EXAMPLES = {"gpus": "{count: 1}", "mig": "{profile: 3g.40gb}", "share": "{fraction: 0.25}"}
_DURATIONS = ("idle_timeout", "max_lifetime", "gpu_idle_timeout")
_SLUG = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_MEMORY = re.compile(r"\s*([0-9]+)\s*(GiB|MiB)\s*")
_DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_LARGEST = 10**12  # beyond any real pool; keeps later arithmetic in floats finite


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
    default: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", frozenset(self.groups))
        problem = _invariant_problem(self)
        if problem:
            raise ProfileError(problem)

    def request(self) -> Request:
        """What a server of this profile asks the pool for."""
        return Request(self.cpu_milli, self.memory_mib, self.gpu)

    def gpu_description(self) -> str:
        """The GPU ask in the words the form shows: ``1 × H100-80GB``, ``MIG 3g.40gb``, ``CPU only``."""
        need = self.gpu
        if need is None:
            return "CPU only"
        products = " or ".join(sorted(need.products))
        if isinstance(need, WholeGpus):
            memory = f" with at least {need.min_memory_mib / 1024:g} GB" if need.min_memory_mib else ""
            return f"{need.count} × {products or 'any GPU'}{memory}"
        if isinstance(need, MigSlice):
            name = f"MIG {need.profile}" if need.profile else f"MIG slice of at least {need.min_memory_gb} GB"
            return f"{name} on {products}" if products else name
        memory = f" ({need.memory_mib / 1024:g} GB memory)" if need.memory_mib else ""
        return f"{need.milli / 10:g}% of a shared {products or 'GPU'}{memory}"

    def visible_to(self, user_groups: Iterable[str], is_admin: bool) -> bool:
        """Whether a user may see and start this profile; admins may use every profile."""
        return is_admin or not self.groups or not self.groups.isdisjoint(user_groups)


def find_profile(profiles: Sequence[Profile], slug: str) -> Profile:
    """The profile called ``slug``; raises :class:`UnknownProfile` listing the valid slugs."""
    for profile in profiles:
        if profile.slug == slug:
            return profile
    valid = ", ".join(sorted(p.slug for p in profiles)) or "none (no profiles are configured)"
    raise UnknownProfile(f"unknown profile {slug!r}; choose one of {valid}")


def fits_pool(profile: Profile, nodes: Sequence[Node]) -> str | None:
    """None when an empty, healthy pool of ``nodes`` could serve ``profile``, else a sentence saying why not.

    Asks the placement code itself on a fresh state, so the form and real placement can never disagree.
    """
    outcome = PoolState(nodes, "first-fit").place(profile.request(), f"fits-pool:{profile.slug}")
    if isinstance(outcome, Refusal) and outcome.never_fits:
        return outcome.reason
    return None


# ---- invariants ------------------------------------------------------------------------------------------


def _invariant_problem(profile: Profile) -> str | None:
    problem = _slug_problem(profile.slug)
    if problem:
        return problem
    if not profile.display_name.strip():
        return "display_name must not be empty"
    if profile.cpu_milli < 1:
        return f"cpu must be at least 0.001 cores, got {profile.cpu_milli} milli-CPU"
    if profile.memory_mib < 1:
        return f"memory must be at least 1 MiB, got {profile.memory_mib} MiB"
    for field in _DURATIONS:
        seconds = getattr(profile, field)
        if seconds is not None and seconds < 1:
            return f"{field} must be at least 1 second, got {seconds}"
    if profile.gpu_idle_timeout is not None and profile.gpu is None:
        return (
            "gpu_idle_timeout needs a GPU and this profile asks for none; add gpus, mig or share, or drop it"
        )
    if isinstance(profile.gpu, MigSlice):
        return _mig_problem(profile.gpu)
    return None


def _slug_problem(slug: object) -> str | None:
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


# ---- reading a file --------------------------------------------------------------------------------------


class _Where:
    """Where in the profiles file a value sits, so every message starts the same way."""

    def __init__(self, source: str, profile: str | None = None) -> None:
        self.source, self.profile = source, profile

    def fail(self, what: str) -> NoReturn:
        where = f"{self.source}: profile {self.profile}" if self.profile else self.source
        raise ProfileError(f"{where}: {what}")


def load_profiles(path: str | Path) -> tuple[Profile, ...]:
    """Read a profiles file; any problem, I/O and YAML included, raises :class:`ProfileError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise ProfileError(f"{source}: cannot read the profiles file: {reason}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ProfileError(f"{source}: {where}invalid YAML: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise ProfileError(f"{source}: invalid YAML: {error}") from None
    return parse_profiles(data, source)


def parse_profiles(data: object, source: str) -> tuple[Profile, ...]:
    """Build the profiles of an already-parsed document; ``source`` is what messages call the file."""
    top = _Where(source)
    if not isinstance(data, dict) or "profiles" not in data:
        top.fail(f"expected a mapping with a 'profiles' list at the top, got {_kind(data)}")
    _check_fields(top, data, ("profiles",), " at the top")
    raw = data["profiles"]
    if not isinstance(raw, list) or not raw:
        top.fail(f"'profiles' must be a non-empty list of profiles, got {_kind(raw)}")
    profiles = tuple(_profile(source, position, item) for position, item in enumerate(raw, start=1))
    positions: dict[str, list[int]] = {}
    for position, profile in enumerate(profiles, start=1):
        positions.setdefault(profile.slug, []).append(position)
    for slug, seen in positions.items():
        if len(seen) > 1:
            listed = " and ".join(str(p) for p in seen)
            _Where(source, slug).fail(f"slug is used by profiles {listed}; slugs must be unique")
    defaults = [p.slug for p in profiles if p.default]
    if len(defaults) > 1:
        top.fail(f"profiles {' and '.join(defaults)} are each marked default: true; at most one may be")
    return profiles


def _profile(source: str, position: int, raw: object) -> Profile:
    where = _Where(source, str(position))
    if not isinstance(raw, dict):
        where.fail(f"expected a mapping with slug, display_name, cpu and memory, got {_kind(raw)}")
    slug = raw.get("slug")
    if isinstance(slug, str) and _SLUG.fullmatch(slug):
        where = _Where(source, slug)
    _check_fields(where, raw, _FIELDS)
    slug = _required(where, raw, "slug")
    if not isinstance(slug, str):
        where.fail(_slug_problem(slug) or "")
    display_name = _text(where, raw, "display_name", required=True)
    default = raw.get("default")
    if default is not None and not isinstance(default, bool):
        where.fail(f"default must be true or false, got {default!r}")
    gpu = _gpu_need(where, raw)
    cpu_milli = round(_number(where, _required(where, raw, "cpu"), "cpu", "8 or 0.5") * 1000)
    memory_mib = _memory_mib(where, _required(where, raw, "memory"))
    description = _text(where, raw, "description")
    groups = _names(where, raw.get("groups"), "groups", "[gpu-users]")
    idle, lifetime, gpu_idle = (_seconds(where, raw.get(field), field) for field in _DURATIONS)
    try:
        return Profile(
            slug=slug,
            display_name=display_name,
            description=description,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            gpu=gpu,
            groups=groups,
            idle_timeout=idle,
            max_lifetime=lifetime,
            gpu_idle_timeout=gpu_idle,
            default=bool(default),
        )
    except ProfileError as error:  # only the invariants Profile checks itself: the prefix is not there yet
        where.fail(str(error))


def _gpu_need(where: _Where, raw: dict[Any, Any]) -> GpuNeed | None:
    kinds = [kind for kind in _GPU_FIELDS if raw.get(kind) is not None]
    if len(kinds) > 1:
        where.fail(
            f"a profile asks for at most one of gpus, mig and share; this one has {' and '.join(kinds)}"
        )
    if not kinds:
        return None
    kind = kinds[0]
    spec = raw[kind]
    if not isinstance(spec, dict):
        where.fail(f"{kind} must be a mapping such as {_GPU_EXAMPLES[kind]}, got {_kind(spec)}")
    _check_fields(where, spec, _GPU_FIELDS[kind], f" in {kind}")
    products = _names(where, spec.get("products"), f"{kind}.products", "[H100-80GB]")
    try:
        if kind == "gpus":
            count = _whole(where, _required(where, spec, "count", "gpus.count"), "gpus.count", 1)
            memory_gb = _number(where, spec.get("min_memory_gb", 0), "gpus.min_memory_gb", "40", zero=True)
            return WholeGpus(count, products, round(memory_gb * 1024))
        if kind == "mig":
            profile = spec.get("profile")
            if profile is not None and not isinstance(profile, str):
                where.fail(f"mig.profile must be a MIG profile name such as 3g.40gb, got {profile!r}")
            memory = spec.get("min_memory_gb")
            at_least = None if memory is None else _whole(where, memory, "mig.min_memory_gb", 1)
            return MigSlice(profile, at_least, products)
        memory = spec.get("memory_gb")
        cap = 0 if memory is None else round(_number(where, memory, "share.memory_gb", "6") * 1024)
        return GpuShare(_milli(where, spec), cap, products)
    except InvalidRequest as error:
        where.fail(str(error))


def _milli(where: _Where, spec: dict[Any, Any]) -> int:
    fraction, milli = spec.get("fraction"), spec.get("milli")
    if (fraction is None) == (milli is None):
        where.fail("share needs exactly one of share.fraction (such as 0.25) or share.milli (such as 250)")
    if milli is not None:
        return _whole(where, milli, "share.milli", 1)
    value = _number(where, fraction, "share.fraction", "0.25")
    if not 0.001 <= value <= 0.999:
        where.fail(f"share.fraction must be between 0.001 and 0.999 (a whole GPU is gpus), got {fraction!r}")
    return round(value * 1000)


def _names(where: _Where, value: object, field: str, example: str) -> frozenset[str]:
    """A name or a list of names; products stay as written, for the request canonicalises any spelling."""
    names = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        where.fail(f"{field} must be a name or a list of names such as {example}, got {value!r}")
    return frozenset(names)


def _seconds(where: _Where, value: object, field: str) -> int | None:
    """A duration: ``90s``, ``30m``, ``8h``, ``2d``, ``1h30m``, or a whole number of seconds."""
    if value is None:
        return None
    expected = f"{field} must be a duration such as 30m, 8h or 2d, or a whole number of seconds"
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _LARGEST:
        return value
    if isinstance(value, str):
        text = re.sub(r"\s+", "", value)
        if re.fullmatch(r"[0-9]{1,11}", text):
            return int(text)
        match = _DURATION.fullmatch(text)
        if text and match and len(text) < 16:
            days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
            return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    where.fail(f"{expected}, got {value!r}")


def _number(where: _Where, value: object, field: str, example: str, zero: bool = False) -> float:
    """A positive (or, with ``zero``, non-negative) finite int or float of plausible size."""
    low = 0 if zero else 0.0001
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value < _LARGEST:
        least = "zero or more" if zero else "a positive number"
        where.fail(f"{field} must be {least} such as {example}, got {value!r}")
    return float(value)


def _whole(where: _Where, value: object, field: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value < _LARGEST:
        where.fail(f"{field} must be a whole number of at least {least}, got {value!r}")
    return value


def _memory_mib(where: _Where, value: object) -> int:
    mib: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        mib = value
    elif isinstance(value, str) and (match := _MEMORY.fullmatch(value)):
        mib = int(match.group(1)) * (1024 if match.group(2) == "GiB" else 1)
    if mib is None or not 0 < mib < _LARGEST:
        where.fail(f"memory must be like 16GiB or an integer of MiB, got {value!r}")
    return mib


def _text(where: _Where, raw: dict[Any, Any], field: str, required: bool = False) -> str:
    value = _required(where, raw, field) if required else raw.get(field)
    if value is None:
        return ""
    if not isinstance(value, str) or not value.strip():
        where.fail(f"{field} must be non-empty text, got {_kind(value)}")
    return value.strip()


def _required(where: _Where, mapping: dict[Any, Any], key: str, label: str | None = None) -> object:
    if mapping.get(key) is None:
        where.fail(f"missing required field {label or key!r}")
    return mapping[key]


def _check_fields(where: _Where, mapping: dict[Any, Any], allowed: tuple[str, ...], scope: str = "") -> None:
    """Catch typos: an unknown field is an error that names it, the likely intended one and all allowed."""
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            where.fail(f"unknown field {key!r}{scope}{hint}; allowed fields are {', '.join(allowed)}")


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys, which PyYAML would otherwise let silently overwrite."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # unhashable: construct_mapping below reports it
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
