"""MIG geometry: which instance profiles each product offers and where on the GPU they may sit.

A MIG-capable GPU has 8 memory slices (A30: 4). An instance takes a contiguous run of memory slices that
must start at one of its shape's legal slots; instances never overlap, a shape may be limited in count,
and the compute slices of all instances add up to at most 7 (A30: 4). Facts from NVIDIA's MIG user guide
(`nvidia-smi mig -lgipp`), kept in one table so every check reads the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from .products import UnknownProduct, normalize_product


@dataclass(frozen=True)
class Shape:
    """A profile shape, the same on every product of one geometry (``3g`` is 4 memory slices everywhere)."""

    key: str
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]
    max_count: int
    nvml_profile_id: int


@dataclass(frozen=True)
class MigProfile:
    """A named profile on one product, such as ``3g.40gb`` on ``H100-80GB``."""

    name: str
    product: str
    shape: Shape

    @property
    def memory_slices(self) -> int:
        return self.shape.memory_slices

    def covers(self, start: int) -> range:
        """The memory slices an instance of this profile occupies when placed at ``start``."""
        return range(start, start + self.shape.memory_slices)


@dataclass(frozen=True)
class Geometry:
    """The MIG layout rules of one product."""

    product: str
    memory_slices: int
    compute_slices: int
    profiles: dict[str, MigProfile]

    def profile(self, name: str) -> MigProfile:
        try:
            return self.profiles[name]
        except KeyError:
            raise UnknownMigProfile(
                f"{self.product} has no MIG profile {name!r}; its profiles are {', '.join(self.profiles)}"
            ) from None


def profile_memory_gb(name: str) -> int:
    """The memory a profile name promises: ``3g.40gb`` and ``1g.10gb+me`` give 40 and 10."""
    return int(name.split(".", 1)[1].split("gb", 1)[0])


def profile_compute_slices(name: str) -> int:
    """The compute slices a profile name holds: ``3g.40gb`` and ``1g.10gb+me`` give 3 and 1."""
    return int(name.split("g", 1)[0])


def largest_first(profiles: Iterable[str]) -> tuple[str, ...]:
    """Profile names, most compute slices first (then by name), so equal multisets compare equal."""
    return tuple(sorted(profiles, key=lambda name: (-profile_compute_slices(name), name)))


class UnknownMigProfile(ValueError):
    """A MIG profile name the product does not offer."""


class NotMigCapable(ValueError):
    """A product without MIG support."""


_EIGHT_SLICE_SHAPES = (
    Shape("1g", 1, 1, (0, 1, 2, 3, 4, 5, 6), 7, 19),
    Shape("1g+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, 20),
    Shape("1g-double", 1, 2, (0, 2, 4, 6), 4, 15),
    Shape("2g", 2, 2, (0, 2, 4), 3, 14),
    Shape("3g", 3, 4, (0, 4), 2, 9),
    Shape("4g", 4, 4, (0,), 1, 5),
    Shape("7g", 7, 8, (0,), 1, 0),
)
# A30 profile ids follow the share of the GPU, as `nvidia-smi mig -lgip` lists them (not yet seen on hardware).
_A30_SHAPES = (
    Shape("1g", 1, 1, (0, 1, 2, 3), 4, 14),
    Shape("1g+me", 1, 1, (0, 1, 2, 3), 1, 21),
    Shape("2g", 2, 2, (0, 2), 2, 5),
    Shape("4g", 4, 4, (0,), 1, 0),
)

# Memory (GB) in each profile name, per product, in the order 1g, 1g double, 2g, 3g, 4g, 7g.
_NAMES: dict[str, tuple[int, int, int, int, int, int]] = {
    "A100-40GB": (5, 10, 10, 20, 20, 40),
    "A100-80GB": (10, 20, 20, 40, 40, 80),
    "H100-80GB": (10, 20, 20, 40, 40, 80),
    "H100-NVL-94GB": (12, 24, 24, 47, 47, 94),
    "GH200-96GB": (12, 24, 24, 48, 48, 96),
    "H200-141GB": (18, 35, 35, 71, 71, 141),
    "B200-180GB": (23, 45, 45, 90, 90, 180),  # placements unverified on hardware
}


def _eight_slice_geometry(product: str, sizes: tuple[int, int, int, int, int, int]) -> Geometry:
    one, one_double, two, three, four, seven = sizes
    names = {
        "1g": f"1g.{one}gb",
        "1g+me": f"1g.{one}gb+me",
        "1g-double": f"1g.{one_double}gb",
        "2g": f"2g.{two}gb",
        "3g": f"3g.{three}gb",
        "4g": f"4g.{four}gb",
        "7g": f"7g.{seven}gb",
    }
    profiles = {names[s.key]: MigProfile(names[s.key], product, s) for s in _EIGHT_SLICE_SHAPES}
    return Geometry(product, 8, 7, profiles)


def _a30_geometry() -> Geometry:
    names = {"1g": "1g.6gb", "1g+me": "1g.6gb+me", "2g": "2g.12gb", "4g": "4g.24gb"}
    profiles = {names[s.key]: MigProfile(names[s.key], "A30-24GB", s) for s in _A30_SHAPES}
    return Geometry("A30-24GB", 4, 4, profiles)


GEOMETRIES: dict[str, Geometry] = {
    product: _eight_slice_geometry(product, sizes) for product, sizes in _NAMES.items()
}
GEOMETRIES["A30-24GB"] = _a30_geometry()


def geometry(product: str) -> Geometry:
    """The MIG geometry of a product given in any spelling; raises if it has none."""
    try:
        name = normalize_product(product)
    except UnknownProduct as error:
        raise NotMigCapable(str(error)) from None
    if name not in GEOMETRIES:
        raise NotMigCapable(f"{name} does not support MIG; MIG-capable products are {', '.join(GEOMETRIES)}")
    return GEOMETRIES[name]


@dataclass(frozen=True, order=True)
class Placement:
    """One MIG instance at a memory-slice offset: ``3g.40gb@4``."""

    start: int
    profile: str

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"


def layout_problem(geo: Geometry, layout: Iterable[Placement]) -> str | None:
    """Why ``layout`` is not a legal set of instances on one GPU of this product, or None when it is."""
    used: dict[int, Placement] = {}
    counts: dict[str, int] = {}
    compute = 0
    for placement in sorted(layout):
        profile = geo.profile(placement.profile)
        shape = profile.shape
        if placement.start not in shape.starts:
            legal = (
                " and ".join(str(s) for s in shape.starts)
                if len(shape.starts) <= 2
                else (", ".join(str(s) for s in shape.starts))
            )
            return (
                f"{profile.name} cannot start at slot {placement.start} on {geo.product}; "
                f"legal starts are {legal}"
            )
        for slot in profile.covers(placement.start):
            if slot in used:
                return f"{placement} overlaps {used[slot]} at memory slice {slot}"
            used[slot] = placement
        counts[shape.key] = counts.get(shape.key, 0) + 1
        if counts[shape.key] > shape.max_count:
            return f"at most {shape.max_count} instance(s) of {profile.name} fit one {geo.product}"
        compute += shape.compute_slices
        if compute > geo.compute_slices:
            return (
                f"the instances need more than the {geo.compute_slices} compute slices of one {geo.product}"
            )
    return None


def _extensions(geo: Geometry, layout: tuple[Placement, ...]) -> Iterator[Placement]:
    """Every single instance that could be added to ``layout`` and keep it legal."""
    for profile in geo.profiles.values():
        for start in profile.shape.starts:
            candidate = Placement(start, profile.name)
            if layout_problem(geo, (*layout, candidate)) is None:
                yield candidate


def fit(
    geo: Geometry, profiles: Sequence[str], existing: Iterable[Placement] = ()
) -> tuple[Placement, ...] | None:
    """A legal placement of ``profiles`` next to ``existing`` instances, or None when they cannot fit.

    Larger instances are placed first, which keeps the search small; the search is exhaustive.
    """
    for name in profiles:
        geo.profile(name)  # unknown names raise with the product's list
    order = sorted(profiles, key=lambda n: -geo.profiles[n].memory_slices)
    base = tuple(existing)

    def search(placed: tuple[Placement, ...], rest: list[str]) -> tuple[Placement, ...] | None:
        if not rest:
            return placed
        profile = geo.profiles[rest[0]]
        for start in profile.shape.starts:
            candidate = (*placed, Placement(start, profile.name))
            if layout_problem(geo, candidate) is None:
                found = search(candidate, rest[1:])
                if found is not None:
                    return found
        return None

    found = search(base, order)
    return None if found is None else tuple(sorted(found[len(base) :]))


def why_not_fit(geo: Geometry, profiles: Sequence[str]) -> str:
    """A sentence saying why ``profiles`` cannot share one GPU (call when :func:`fit` returned None)."""
    memory = sum(geo.profile(n).memory_slices for n in profiles)
    compute = sum(geo.profile(n).shape.compute_slices for n in profiles)
    if memory > geo.memory_slices:
        return f"they need {memory} memory slices and one {geo.product} has {geo.memory_slices}"
    if compute > geo.compute_slices:
        return f"they need {compute} compute slices and one {geo.product} has {geo.compute_slices}"
    for name in set(profiles):
        shape = geo.profiles[name].shape
        if profiles.count(name) > shape.max_count:
            return f"at most {shape.max_count} instance(s) of {name} fit one {geo.product}"
    return "no arrangement of them on the legal start slots avoids overlap"


def maximal_layouts(geo: Geometry) -> list[tuple[Placement, ...]]:
    """Every legal layout to which no further instance can be added, each sorted by start slot."""
    all_placements = sorted(
        Placement(start, p.name) for p in geo.profiles.values() for start in p.shape.starts
    )
    found: list[tuple[Placement, ...]] = []

    def grow(layout: tuple[Placement, ...], next_index: int) -> None:
        # Extend only with later placements so each layout is built once; keep it when nothing at all fits.
        for index in range(next_index, len(all_placements)):
            candidate = (*layout, all_placements[index])
            if layout_problem(geo, candidate) is None:
                grow(candidate, index + 1)
        if next(_extensions(geo, layout), None) is None:
            found.append(layout)

    grow((), 0)
    return found


def profile_combinations(layouts: Iterable[Sequence[Placement]]) -> list[tuple[str, ...]]:
    """The distinct multisets of profile names among ``layouts``, largest instances first."""
    seen: dict[tuple[str, ...], None] = {}
    for layout in layouts:
        seen.setdefault(largest_first(p.profile for p in layout), None)
    return list(seen)


__all__ = [
    "GEOMETRIES",
    "Geometry",
    "MigProfile",
    "NotMigCapable",
    "Placement",
    "UnknownMigProfile",
    "fit",
    "geometry",
    "layout_problem",
    "maximal_layouts",
    "profile_combinations",
    "profile_memory_gb",
    "why_not_fit",
]
