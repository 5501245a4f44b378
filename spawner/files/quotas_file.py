"""Reading a quotas file into a :class:`~..pool.quotas.QuotaPolicy`, whole or not at all.

The format is documented at the top of ``hub_config/quotas.yaml`` (:data:`EXAMPLE_QUOTAS`)::

    per_user: {whole_gpus: 2, mig_slices: 4, cpu: 32, memory: 256GiB}   # every user, unless listed
    per_group:                                       # each member of the group, not the group's total
      ml-research: {whole_gpus: 8}
    users:                                           # replaces per_user for that user
      alice: {whole_gpus: 4, mig_slices: 8}

A limit left out is unlimited; without any quotas file the service applies
:func:`~..pool.quotas.default_policy`. Every problem raises :class:`QuotaFileError` naming the file, the entry and
the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any, NoReturn

from ..pool.quotas import RESOURCES, Quota, QuotaPolicy
from .yaml_fields import check_fields, kind, load_yaml, parse_memory_mib, read_text

EXAMPLE_QUOTAS: Path = Path(str(files("gpupool.hub_config").joinpath("quotas.yaml")))

_TOP = ("per_user", "per_group", "users")
# The file writes CPU in cores and memory as a size, the way profiles and pool files do.
_IN_FILE = {"cpu_milli": "cpu", "memory_mib": "memory"}
_LIMITS = tuple(_IN_FILE.get(resource.name, resource.name) for resource in RESOURCES)
_LARGEST = 10**12


class QuotaFileError(ValueError):
    """A quotas file that cannot be used; the message names the file, the entry and the field."""


class _Where:
    def __init__(self, source: str, entry: str | None = None) -> None:
        self.source, self.entry = source, entry

    def fail(self, what: str) -> NoReturn:
        raise QuotaFileError(
            f"{self.source}: {self.entry}: {what}" if self.entry else f"{self.source}: {what}"
        )


def load_quotas(path: str | Path) -> QuotaPolicy:
    """Read a quotas file; any problem, I/O and YAML included, raises :class:`QuotaFileError`."""
    source = str(path)
    return parse_quotas(
        load_yaml(read_text(path, "quotas file", QuotaFileError), source, QuotaFileError), source
    )


def parse_quotas(data: object, source: str) -> QuotaPolicy:
    """The policy of an already-parsed document; ``source`` is what messages call the file."""
    top = _Where(source)
    if data is None:
        return QuotaPolicy()  # an empty file: no limits
    if not isinstance(data, dict):
        top.fail(f"expected a mapping with {', '.join(_TOP)} at the top, got {kind(data)}")
    check_fields(top, data, _TOP, " at the top")
    per_user = _quota(_Where(source, "per_user"), data.get("per_user"))
    return QuotaPolicy(
        per_user=per_user,
        per_group=_named(source, "per_group", data.get("per_group"), "group"),
        user_overrides=_named(source, "users", data.get("users"), "user"),
    )


def _named(source: str, section: str, raw: object, noun: str) -> Mapping[str, Quota]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        _Where(source, section).fail(f"expected a mapping of {noun} name to limits, got {kind(raw)}")
    quotas = {}
    for name, limits in raw.items():
        if not isinstance(name, str) or not name.strip():
            _Where(source, section).fail(f"a {noun} name must be a non-empty string, got {kind(name)}")
        quotas[name] = _quota(_Where(source, f"{section}.{name}"), limits)
    return quotas


def _quota(where: _Where, raw: object) -> Quota:
    if raw is None:
        return Quota()
    if not isinstance(raw, dict):
        where.fail(f"expected limits such as {{whole_gpus: 2, mig_slices: 4}}, got {kind(raw)}")
    check_fields(where, raw, _LIMITS)
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if value is None:
            continue  # written out but left empty: unlimited, like leaving it out
        if name == "cpu":
            values["cpu_milli"] = _cpu_milli(where, value)
        elif name == "memory":
            values["memory_mib"] = parse_memory_mib(where, value, "256GiB", _LARGEST)
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            where.fail(
                f"{name} must be a whole number of 0 or more (leave it out for no limit), got {value!r}"
            )
        else:
            values[name] = value
    return Quota(**values)


def _cpu_milli(where: _Where, value: object) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0.001 <= value < _LARGEST
    ):
        where.fail(
            f"cpu must be a number of cores such as 32 or 0.5 (leave it out for no limit), got {value!r}"
        )
    return round(value * 1000)
