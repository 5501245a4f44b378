"""Named MIG layouts, the candidate layouts of a product, and the smallest profile that covers a task.

The MIG benchmark and ``gpupool mig advise`` speak the GPU Operator's MIG Manager's language: its stock configs
(mig-parted's ``config-default.yaml``) are ``all-1g.10gb``, ``all-1g.20gb``, ``all-2g.20gb``, ``all-3g.40gb``,
``all-4g.40gb``, ``all-7g.80gb`` (each as many instances of one profile as fit) and ``all-balanced`` (two 1g,
one 2g and one 3g; two 1g and one 2g on an A30). ``all-1g`` … ``all-7g`` name the same without the memory, so one
name serves every product. Every layout built here is legal by :func:`.mig.layout_problem`.
"""

from __future__ import annotations

import functools
import math

from .devices import FULL_MILLI
from .mig import (
    Geometry,
    MigProfile,
    Placement,
    fit,
    geometry,
    largest_first,
    maximal_layouts,
    profile_memory_gb,
)

Combo = tuple[str, ...]
"""The profiles of one GPU's layout, largest first (:func:`.mig.largest_first`): what a layout serves, whatever
the start slots."""

BALANCED = "all-balanced"


class UnknownLayout(ValueError):
    """A layout name that is not one of the MIG Manager's stock names for the product."""


def layout_names(geo: Geometry) -> list[str]:
    """Every stock name :func:`named_layout` accepts for ``geo``: ``all-balanced``, ``all-1g``, ``all-1g.10gb``…"""
    shapes = [p.shape.key for p in geo.profiles.values() if "+" not in p.shape.key and "-" not in p.shape.key]
    return [
        BALANCED,
        *(f"all-{key}" for key in shapes),
        *(f"all-{name.replace('+', '.')}" for name in geo.profiles),
    ]


def named_layout(geo: Geometry, name: str) -> tuple[Placement, ...]:
    """The layout the MIG Manager's stock config ``name`` makes on one GPU of ``geo``, with its start slots."""
    wanted = _stock_profiles(geo, name.strip().lower())
    if wanted is None:
        raise UnknownLayout(
            f"{geo.product} has no MIG layout {name!r}; choose one of {', '.join(layout_names(geo))}"
        )
    placed = fit(geo, wanted)
    assert placed is not None, f"stock layout {name} does not fit {geo.product}"
    return placed


def _stock_profiles(geo: Geometry, name: str) -> list[str] | None:
    by_shape = {p.shape.key: p for p in geo.profiles.values()}
    if name == BALANCED:
        keys = ["1g", "1g", "2g"] + (["3g"] if "3g" in by_shape else [])
        return [by_shape[k].name for k in keys]
    if not name.startswith("all-"):
        return None
    rest = name.removeprefix("all-")
    profile = by_shape.get(rest) or geo.profiles.get(rest) or geo.profiles.get(_me_name(rest))
    if profile is None or rest.endswith("+me"):
        return None
    return [profile.name] * profile.shape.max_count


def _me_name(text: str) -> str:
    """``1g.10gb.me`` (the MIG Manager's spelling, as resource names cannot hold ``+``) is ``1g.10gb+me``."""
    return text[: -len(".me")] + "+me" if text.endswith(".me") else text


def covering_profile(geo: Geometry, milli: int, memory_mib: int = 0) -> MigProfile | None:
    """The smallest profile whose compute covers ``milli`` thousandths of the GPU and whose memory covers
    ``memory_mib``: fewest compute slices, then least memory; media-extension profiles are never chosen.

    1000 milli is the whole GPU (``7g.80gb``); 460 milli of a 7-slice GPU needs ⌈3.22⌉ = 4 slices (``4g.40gb``).
    None when nothing covers it (more memory than the GPU's).
    """
    if not 0 < milli <= FULL_MILLI:
        raise ValueError(f"milli must be between 1 and {FULL_MILLI}, got {milli}")
    slices = math.ceil(milli * geo.compute_slices / FULL_MILLI - 1e-9)
    fitting = [
        p
        for p in geo.profiles.values()
        if "+" not in p.name
        and p.shape.compute_slices >= slices
        and profile_memory_gb(p.name) * 1024 >= memory_mib
    ]
    return min(fitting, key=lambda p: (p.shape.compute_slices, profile_memory_gb(p.name)), default=None)


@functools.cache
def candidate_layouts(product: str) -> dict[Combo, tuple[Placement, ...]]:
    """Each combination of profiles found among the product's maximal layouts (nothing more fits), with one
    legal placement of it; cached, since enumerating the layouts takes a tenth of a second."""
    found: dict[Combo, tuple[Placement, ...]] = {}
    for layout in maximal_layouts(geometry(product)):
        found.setdefault(largest_first(p.profile for p in layout), layout)
    return found


def placements_for(product: str, combo: Combo) -> tuple[Placement, ...]:
    """A legal placement of ``combo`` on one GPU of ``product`` (raises when none exists)."""
    known = candidate_layouts(product).get(combo)
    if known is not None:
        return known
    placed = fit(geometry(product), list(combo))
    if placed is None:
        raise ValueError(f"{' + '.join(combo)} do not fit one {product}")
    return placed


__all__ = [
    "BALANCED",
    "Combo",
    "UnknownLayout",
    "candidate_layouts",
    "covering_profile",
    "layout_names",
    "named_layout",
    "placements_for",
]
