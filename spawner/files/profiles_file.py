"""Reading a profiles file into :class:`Profile` objects, all of them or none.

The file format is documented at the top of ``hub_config/profiles.yaml`` (:data:`EXAMPLE_PROFILES`); a
profile's GPU ask is at most one of::

    gpus:  {count: 2, products: [A100-40GB], min_memory_gb: 40}  # whole GPUs, one node; any spelling
    mig:   {profile: 3g.40gb, products: [H100-80GB]}             # or {min_memory_gb: 20, products: [...]}
    share: {fraction: 0.25, memory_gb: 6, products: [L4]}        # or milli: 250 instead of fraction

Every problem raises :class:`ProfileError` naming the file, the profile (by slug, or by its position counted
from 1 when the slug is missing or bad) and the field; the loader returns every profile or none.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any, NoReturn

from ..pool.environments import Environment
from ..pool.products import UnknownProduct, UnknownSize, marketed_gb_to_mib, normalize_product
from ..pool.profiles import DURATIONS, Profile, ProfileError, parse_duration, slug_problem
from ..pool.requests import GpuNeed, GpuShare, InvalidRequest, MigSlice, WholeGpus
from ..pool.software import Software
from .yaml_fields import check_fields, kind, load_yaml, parse_memory_mib, read_text, required_field

log = logging.getLogger(__name__)

EXAMPLE_PROFILES: Path = Path(str(files("gpupool.hub_config").joinpath("profiles.yaml")))

_FIELDS = (
    "slug", "display_name", "description", "gpus", "mig", "share", "cpu", "memory", "groups",
    "idle_timeout", "max_lifetime", "gpu_idle_timeout", "queue_wait", "default", "environments",
)  # fmt: skip
_ENVIRONMENT_FIELDS = (
    "slug",
    "display_name",
    "bin",
    "image",
    "default",
    "min_cuda",
    "min_compute_capability",
)

_SOFTWARE_FIELDS = ("min_cuda", "min_compute_capability")
_GPU_FIELDS = {
    "gpus": ("count", "products", "min_memory_gb", *_SOFTWARE_FIELDS),
    "mig": ("profile", "min_memory_gb", "products", *_SOFTWARE_FIELDS),
    "share": ("fraction", "milli", "memory_gb", "products", *_SOFTWARE_FIELDS),
}
_GPU_EXAMPLES = {"gpus": "{count: 1}", "mig": "{profile: 3g.40gb}", "share": "{fraction: 0.25}"}
_LARGEST = 10**12  # beyond any real pool; keeps later arithmetic in floats finite


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
    data = load_yaml(read_text(path, "profiles file", ProfileError), source, ProfileError)
    return parse_profiles(data, source)


def parse_profiles(data: object, source: str) -> tuple[Profile, ...]:
    """Build the profiles of an already-parsed document; ``source`` is what messages call the file."""
    top = _Where(source)
    if not isinstance(data, dict) or "profiles" not in data:
        top.fail(f"expected a mapping with a 'profiles' list at the top, got {kind(data)}")
    check_fields(top, data, ("profiles",), " at the top")
    raw = data["profiles"]
    if not isinstance(raw, list) or not raw:
        top.fail(f"'profiles' must be a non-empty list of profiles, got {kind(raw)}")
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
        where.fail(f"expected a mapping with slug, display_name, cpu and memory, got {kind(raw)}")
    slug = raw.get("slug")
    if isinstance(slug, str) and slug_problem(slug) is None:
        where = _Where(source, slug)
    check_fields(where, raw, _FIELDS)
    slug = required_field(where, raw, "slug")
    if not isinstance(slug, str):
        where.fail(slug_problem(slug) or "")
    display_name = _text(where, raw, "display_name", required=True)
    default = raw.get("default")
    if default is not None and not isinstance(default, bool):
        where.fail(f"default must be true or false, got {default!r}")
    gpu = _gpu_need(where, raw)
    cpu_milli = round(_number(where, required_field(where, raw, "cpu"), "cpu", "8 or 0.5") * 1000)
    memory_mib = parse_memory_mib(where, required_field(where, raw, "memory"), "16GiB", _LARGEST)
    description = _text(where, raw, "description")
    groups = _names(where, raw.get("groups"), "groups", "[gpu-users]")
    idle, lifetime, gpu_idle, queue_wait = (_seconds(where, raw.get(field), field) for field in DURATIONS)
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
            queue_wait=queue_wait,
            default=bool(default),
            environments=_environments(where, raw.get("environments")),
        )
    except ProfileError as error:  # only the invariants Profile checks itself: the prefix is not there yet
        where.fail(str(error))


def _gpu_need(where: _Where, raw: dict[Any, Any]) -> GpuNeed | None:
    asks = [ask for ask in _GPU_FIELDS if raw.get(ask) is not None]
    if len(asks) > 1:
        where.fail(
            f"a profile asks for at most one of gpus, mig and share; this one has {' and '.join(asks)}"
        )
    if not asks:
        return None
    ask = asks[0]
    spec = raw[ask]
    if not isinstance(spec, dict):
        where.fail(f"{ask} must be a mapping such as {_GPU_EXAMPLES[ask]}, got {kind(spec)}")
    check_fields(where, spec, _GPU_FIELDS[ask], f" in {ask}")
    products = _names(where, spec.get("products"), f"{ask}.products", "[H100-80GB]")
    for product in products:  # a model of no known family may be a site's own label: only sizes are checked
        try:
            normalize_product(product)
        except UnknownSize as error:
            where.fail(f"{ask}.products: {error}")
        except UnknownProduct:
            pass
    software = _software(where, spec, ask)
    try:
        if ask == "gpus":
            count = _whole(where, required_field(where, spec, "count", "gpus.count"), "gpus.count", 1)
            memory_gb = _number(where, spec.get("min_memory_gb", 0), "gpus.min_memory_gb", "40", zero=True)
            return WholeGpus(count, products, marketed_gb_to_mib(memory_gb), software)
        if ask == "mig":
            profile = spec.get("profile")
            if profile is not None and not isinstance(profile, str):
                where.fail(f"mig.profile must be a MIG profile name such as 3g.40gb, got {profile!r}")
            memory = spec.get("min_memory_gb")
            at_least = None if memory is None else _whole(where, memory, "mig.min_memory_gb", 1)
            return MigSlice(profile, at_least, products, software)
        memory = spec.get("memory_gb")
        cap = 0 if memory is None else round(_number(where, memory, "share.memory_gb", "6") * 1024)
        return GpuShare(_milli(where, spec), cap, products, software)
    except InvalidRequest as error:
        where.fail(str(error))


def _environments(where: _Where, raw: object) -> tuple[Environment, ...]:
    """``environments``: a list of ``{slug, display_name, bin or image, default, min_cuda, ...}``."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        where.fail(
            f"environments must be a non-empty list of {{slug, display_name, bin or image}}, got {kind(raw)}"
        )
    found = []
    for position, spec in enumerate(raw, start=1):
        if not isinstance(spec, dict):
            where.fail(
                f"environments item {position} must be a mapping with slug and display_name, got {kind(spec)}"
            )
        check_fields(where, spec, _ENVIRONMENT_FIELDS, f" in environments item {position}")
        slug = required_field(where, spec, "slug", f"environments item {position}: slug")
        if slug_problem(slug):
            where.fail(f"environments item {position}: {slug_problem(slug)}")
        name = _text(where, spec, "display_name", required=True)
        bin_folder, image = _text(where, spec, "bin"), _text(where, spec, "image")
        if bin_folder and not bin_folder.startswith("/"):
            where.fail(
                f"environments {slug}: bin must be an absolute folder such as /opt/envs/torch/bin, got {bin_folder!r}"
            )
        default = spec.get("default", False)
        if not isinstance(default, bool):
            where.fail(f"environments {slug}: default must be true or false, got {default!r}")
        software = _software(where, spec, f"environments {slug}")
        found.append(Environment(str(slug), name, bin_folder, image, software, default))
    return tuple(found)


def _software(where: _Where, spec: dict[Any, Any], ask: str) -> Software:
    """``min_cuda`` and ``min_compute_capability``, quoted or not (YAML reads 12.4 as a number)."""
    values = {}
    for field in _SOFTWARE_FIELDS:
        value = spec.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, str | int | float)):
            where.fail(f"{ask}.{field} must be a version such as 12.4, got {value!r}")
        values[field] = "" if value is None else str(value)
    try:
        return Software(**values)
    except ValueError as error:
        where.fail(f"{ask}.{error}")


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
    if isinstance(value, str) and (seconds := parse_duration(value)) is not None:
        return seconds
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


def _text(where: _Where, raw: dict[Any, Any], field: str, required: bool = False) -> str:
    value = required_field(where, raw, field) if required else raw.get(field)
    if value is None:
        return ""
    if not isinstance(value, str) or not value.strip():
        where.fail(f"{field} must be non-empty text, got {kind(value)}")
    return value.strip()


@lru_cache(maxsize=8)
def _profiles_at(path: str, mtime_ns: int) -> tuple[Profile, ...]:
    """The profiles of ``path``, parsed again only when the file changes (``mtime_ns`` is the cache key)."""
    del mtime_ns
    return load_profiles(path)


_last_read: dict[str, tuple[Profile, ...]] = {}  # by path: the profiles its file held when last read well
_said: dict[str, str] = {}  # by path: the error last logged for its file, until it reads well again


def read_profiles(path: str) -> tuple[Profile, ...]:
    """The profiles in the file at ``path``, parsed again only when it changes (the hub reads it at every
    spawn). A file that has gone bad since it was last read well (an edit under way, a typo) gives the
    profiles as last read, its error logged once: one bad save must not give every user a 500 at the spawn
    form, and the service keeps what it read at its start anyway. Read well never before: the loader's error
    (naming the file and field)."""
    try:
        profiles = _profiles_at(path, Path(path).stat().st_mtime_ns)
    except (OSError, ValueError) as error:
        if path not in _last_read:
            raise
        if _said.get(path) != str(error):
            _said[path] = str(error)
            log.error("%s; the spawn form keeps the profiles as last read until the file is fixed", error)
        return _last_read[path]
    _last_read[path] = profiles
    _said.pop(path, None)
    return profiles
