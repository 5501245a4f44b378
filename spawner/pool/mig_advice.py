"""Which MIG layout each MIG GPU should have for the demand seen: the search and the replay behind
``gpupool mig advise`` and the dashboard's advice. Advice only: gpupool never changes a layout itself.

Demand is a count of *asks*, each the MIG slices that would serve one lease or task: a MIG lease names its
profile (or a least memory); a task wanting part of one GPU (a share, as in the Alibaba trace) asks for the
smallest profile covering its compute and memory (:func:`.mig_layouts.covering_profile`). Whole-GPU work is
left to whole GPUs. A layout is judged by :func:`replay`: every ask at once, as if all held their slices
together, each taking the smallest free slice that serves it, the most constrained asks first. Better means
more GPU-equivalents served, then more asks, then fewer slices left free while asks wait (stranded).

The search (:func:`advise`) starts from the current layouts and from a greedy build, and changes one GPU's
layout at a time while that strictly improves the replay; the current layouts are a candidate, so the advice
never serves less than they do on the same demand. Only the mix of layouts per product matters to the replay,
so a GPU keeps its layout when the mix still holds it. A profile the hub offers keeps a slice that serves it,
where the current layouts have one, whatever the demand seen: no advice makes an offered profile unstartable.
GPUs out of service (unhealthy or drained) are left as they are and out of the advice; an offered profile
that no GPU in service has a slice for, now or advised, is named (:attr:`Advice.missing`) for the admin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .devices import GpuMode, Health, Node
from .mig import GEOMETRIES, Placement, geometry, largest_first, profile_compute_slices, profile_memory_gb
from .mig_layouts import Combo, candidate_layouts, covering_profile, placements_for
from .requests import GpuShare, MigSlice, Request

UNITS = 840
"""GPU-equivalents are counted in 840ths of a GPU, exactly: 7 and 4 compute slices both divide it."""

Slot = tuple[str, str]
"""A kind of MIG instance: (product, profile)."""


@dataclass(frozen=True)
class MigGpu:
    """One GPU in MIG mode, as the advice needs it: where it is and its layout now."""

    node: str
    index: int
    product: str
    layout: tuple[Placement, ...]


@dataclass(frozen=True)
class Ask:
    """One kind of MIG demand: the instance kinds that serve it (smallest first) and what it needs."""

    label: str  # the profile asked for, "≥ 20 GB", …
    serves: tuple[Slot, ...]
    units: int  # its GPU-equivalent in 1/UNITS: the smallest instance that serves it


def mig_gpus(nodes: Iterable[Node]) -> list[MigGpu]:
    """Every healthy GPU in MIG mode (of a product whose MIG geometry gpupool knows) on a healthy node, in
    node and index order."""
    return [
        MigGpu(
            node.name,
            gpu.index,
            gpu.product,
            tuple(sorted(Placement(m.start, m.profile) for m in gpu.mig_instances)),
        )
        for node in nodes
        if node.health is Health.HEALTHY
        for gpu in node.gpus
        if gpu.mode is GpuMode.MIG and gpu.product in GEOMETRIES and gpu.health is Health.HEALTHY
    ]


def slot_units(slot: Slot) -> int:
    product, profile = slot
    return UNITS * profile_compute_slices(profile) // geometry(product).compute_slices


def ask_for(request: Request, products: Iterable[str]) -> Ask | None:
    """What ``request`` asks of the MIG GPUs of ``products``; None for whole-GPU and CPU-only work. An ask no
    instance of these products could serve has no ``serves``."""
    need = request.gpu
    if not isinstance(need, MigSlice | GpuShare):
        return None
    allowed = [p for p in sorted(set(products)) if not need.products or p in need.products]
    slots: list[Slot] = []
    if isinstance(need, MigSlice):
        label = need.profile or f"≥ {need.min_memory_gb} GB"
        for product in allowed:
            slots += [
                (product, name)
                for name in geometry(product).profiles
                if name == need.profile
                or (need.min_memory_gb is not None and profile_memory_gb(name) >= need.min_memory_gb)
            ]
    else:
        for product in allowed:
            covering = covering_profile(geometry(product), need.milli, need.memory_mib)
            slots += [(product, covering.name)] if covering else []
        label = " or ".join(sorted({name for _, name in slots})) or f"share of {need.milli} milli"
    slots.sort(key=lambda s: (slot_units(s), profile_memory_gb(s[1]), s))
    return Ask(label, tuple(slots), min((slot_units(s) for s in slots), default=0))


def demand_of(requests: Iterable[Request], products: Iterable[str]) -> Counter[Ask]:
    """The asks of ``requests`` on MIG GPUs of ``products``, counted."""
    wanted = set(products)
    found: Counter[Ask] = Counter()
    for request in requests:
        ask = ask_for(request, wanted)
        if ask is not None:
            found[ask] += 1
    return found


def scaled_demand(demand: Mapping[Ask, int], gpus: int, load: float = 1.0) -> Counter[Ask]:
    """A demand larger than ``load`` × the capacity of ``gpus`` GPUs, shrunk to it keeping its mix (counts by
    largest remainder); a smaller one as it is. A trace of a whole cluster says which sizes are asked and how
    often, not how many of them a few MIG GPUs should expect at once."""
    if load <= 0:
        raise ValueError(f"load must be positive, got {load}")
    asked = sum(ask.units * n for ask, n in demand.items())
    factor = load * gpus * UNITS / asked if asked else 1.0
    if factor >= 1:
        return Counter(demand)
    exact = {ask: n * factor for ask, n in demand.items()}
    kept = Counter({ask: int(share) for ask, share in exact.items()})
    by_remainder = sorted(exact, key=lambda a: (-(exact[a] - kept[a]), -a.units, a.label))
    for ask in by_remainder[: max(0, round(sum(exact.values())) - kept.total())]:
        kept[ask] += 1
    return +kept


@dataclass(frozen=True)
class Replay:
    """What a set of layouts serves of a demand; GPU-equivalents in 1/UNITS.

    A slice left free is *stranded* when some ask that a layout could serve still waits: free capacity the
    waiting demand cannot use. When every such ask is served, what is left free is spare, not stranded.
    """

    asked: int
    asked_units: int
    served: int
    served_units: int
    waiting: int  # asks some layout could serve that these layouts left unserved
    free: int  # instances no ask took
    free_units: int
    instances: int

    @property
    def stranded(self) -> int:
        return self.free if self.waiting else 0

    @property
    def stranded_units(self) -> int:
        return self.free_units if self.waiting else 0

    def key(self) -> tuple[int, int, int]:
        """Higher is better: GPU-equivalents served, then asks served, then fewer stranded instances."""
        return (self.served_units, self.served, -self.stranded)

    def as_dict(self) -> dict[str, float | int]:
        return {
            "asked": self.asked,
            "asked_gpus": round(self.asked_units / UNITS, 2),
            "served": self.served,
            "served_gpus": round(self.served_units / UNITS, 2),
            "waiting": self.waiting,
            "instances": self.instances,
            "free": self.free,
            "stranded": self.stranded,
            "stranded_gpus": round(self.stranded_units / UNITS, 2),
        }


def replay(instances: Mapping[Slot, int], demand: Mapping[Ask, int]) -> Replay:
    """Serve ``demand`` from ``instances`` at once: the asks with the fewest kinds of instance first (larger
    first among equals), each taking the smallest free instance that serves it."""
    free = dict(instances)
    served = served_units = waiting = 0
    for ask in sorted(demand, key=lambda a: (len(a.serves), -a.units, a.label)):
        wanting = demand[ask]
        for slot in ask.serves:
            take = min(wanting, free.get(slot, 0))
            if take:
                free[slot] -= take
                wanting -= take
                served += take
                served_units += take * ask.units
        waiting += wanting if ask.serves else 0
    return Replay(
        asked=sum(demand.values()),
        asked_units=sum(a.units * n for a, n in demand.items()),
        served=served,
        served_units=served_units,
        waiting=waiting,
        free=sum(free.values()),
        free_units=sum(slot_units(s) * n for s, n in free.items()),
        instances=sum(instances.values()),
    )


@dataclass(frozen=True)
class GpuAdvice:
    gpu: MigGpu
    advised: tuple[Placement, ...]

    @property
    def changed(self) -> bool:
        return largest_first(p.profile for p in self.advised) != largest_first(
            p.profile for p in self.gpu.layout
        )


@dataclass(frozen=True)
class Advice:
    """The layout advised for each MIG GPU and what the current and advised layouts serve of the demand."""

    gpus: tuple[GpuAdvice, ...]
    demand: tuple[tuple[Ask, int], ...]
    before: Replay
    after: Replay
    kept: tuple[str, ...] = ()  # the offered profiles that keep a slice to start on
    missing: tuple[str, ...] = ()  # offered profiles no GPU in service has a slice for, now or advised

    @property
    def unservable(self) -> int:
        """Asks that no layout of these GPUs could ever serve (a profile of another product, say)."""
        return sum(n for ask, n in self.demand if not ask.serves)


Mix = dict[str, Counter[Combo]]
"""How many GPUs of each product have each combination of profiles."""


class _Search:
    def __init__(self, gpus: Sequence[MigGpu], demand: Mapping[Ask, int], keep: Iterable[Ask] = ()) -> None:
        self.demand = dict(demand)
        wanted = {slot for ask in demand for slot in ask.serves}
        self.current: Mix = {}
        for gpu in gpus:
            self.current.setdefault(gpu.product, Counter())[largest_first(p.profile for p in gpu.layout)] += 1
        self.choices: dict[str, list[Combo]] = {}
        for product, combos in self.current.items():
            stock = [
                c
                for c in candidate_layouts(product)
                if all("+" not in name or (product, name) in wanted for name in c)
            ]  # a media-extension slice nobody asks for serves less than the plain 1g it displaces
            self.choices[product] = list(dict.fromkeys([*combos, *stock]))
        now = _instances(self.current)
        # the slices each offered profile can start on, where the current layouts have one
        # (by the slices, not the label: "1g.10gb" on H100s only and on A100s only are two asks)
        self.kept = {frozenset(a.serves): a.label for a in keep if any(now[slot] for slot in a.serves)}
        # offered, and some layout of these GPUs could serve it, but none has a slice for it now (a drain)
        self.unkept = {
            frozenset(a.serves): a.label for a in keep if a.serves and not any(now[s] for s in a.serves)
        }

    def score(self, mix: Mix) -> Replay:
        return replay(_instances(mix), self.demand)

    def key(self, mix: Mix) -> tuple[int, int, int, int]:
        """Higher is better: more offered profiles left a slice (so a climb can restore them one at a time;
        the current layouts leave every one), then the replay's key."""
        instances = _instances(mix)
        keeps = sum(any(instances[slot] for slot in slots) for slots in self.kept)
        return (keeps, *replay(instances, self.demand).key())

    def climb(self, mix: Mix) -> Mix:
        """Change one GPU's layout at a time, the best strict improvement each step, until none is left."""
        mix = {product: Counter(combos) for product, combos in mix.items()}
        best = self.key(mix)
        while True:
            move, gain = None, best
            for product, combos in mix.items():
                for old in [c for c, n in combos.items() if n > 0]:
                    for new in self.choices[product]:
                        if new == old:
                            continue
                        combos[old] -= 1
                        combos[new] += 1
                        key = self.key(mix)
                        combos[new] -= 1
                        combos[old] += 1
                        if key > gain:
                            move, gain = (product, old, new), key
            if move is None:
                return mix
            product, old, new = move
            mix[product][old] -= 1
            mix[product][new] += 1
            best = gain

    def greedy(self) -> Mix:
        """GPUs filled one at a time, each with the layout that serves the most with those already chosen."""
        mix: Mix = {product: Counter() for product in self.current}
        for product, combos in self.current.items():
            for _ in range(sum(combos.values())):
                chosen = mix[product]
                best: tuple[tuple[int, int, int, int], Combo] | None = None
                for combo in self.choices[product]:
                    chosen[combo] += 1
                    key = self.key(mix)
                    chosen[combo] -= 1
                    if best is None or key > best[0]:
                        best = (key, combo)
                assert best is not None
                chosen[best[1]] += 1
        return mix

    def changes(self, mix: Mix) -> int:
        return sum((self.current[p] - mix[p]).total() for p in self.current)


def advise(gpus: Sequence[MigGpu], demand: Mapping[Ask, int], keep: Iterable[Ask] = ()) -> Advice:
    """The layouts that serve ``demand`` best (see the module's docstring), never worse than the current ones;
    ``keep``: the asks of the profiles the hub offers, each left a slice to start on."""
    search = _Search(gpus, demand, keep)
    mixes = [search.current, search.climb(search.current), search.climb(search.greedy())]
    best = max(mixes, key=lambda m: (search.key(m), -search.changes(m)))
    advised = _instances(best)
    return Advice(
        gpus=_assign(gpus, best),
        demand=tuple(sorted(demand.items(), key=lambda item: (-item[0].units, item[0].label))),
        before=search.score(search.current),
        after=search.score(best),
        kept=tuple(sorted(set(search.kept.values()))),
        missing=tuple(
            sorted({label for slots, label in search.unkept.items() if not any(advised[s] for s in slots)})
        ),
    )


def _instances(mix: Mix) -> Counter[Slot]:
    instances: Counter[Slot] = Counter()
    for product, combos in mix.items():
        for combo, count in combos.items():
            for name in combo:
                instances[(product, name)] += count
    return instances


def offered_asks(requests: Iterable[Request], products: Iterable[str]) -> list[Ask]:
    """The asks of the MIG profiles offered (``requests``: each profile's request) on ``products``: those of
    every MIG GPU, in service or not (:func:`mig_products`), so a profile whose every GPU is drained is named
    as left without a slice, not forgotten."""
    found = set(products)
    return [a for r in requests if isinstance(r.gpu, MigSlice) and (a := ask_for(r, found)) is not None]


def mig_products(nodes: Iterable[Node]) -> set[str]:
    """The products of every GPU in MIG mode whose geometry gpupool knows, healthy or not."""
    return {
        g.product for node in nodes for g in node.gpus if g.mode is GpuMode.MIG and g.product in GEOMETRIES
    }


def _assign(gpus: Sequence[MigGpu], mix: Mix) -> tuple[GpuAdvice, ...]:
    """Give each GPU a layout of the mix: its own when the mix still holds it, else the next one left."""
    left = {product: Counter(combos) for product, combos in mix.items()}
    kept: dict[int, tuple[Placement, ...]] = {}
    for position, gpu in enumerate(gpus):
        combo = largest_first(p.profile for p in gpu.layout)
        if left[gpu.product][combo] > 0:
            left[gpu.product][combo] -= 1
            kept[position] = gpu.layout
    advised = []
    for position, gpu in enumerate(gpus):
        layout = kept.get(position)
        if layout is None:
            combo = next(c for c, n in sorted(left[gpu.product].items()) if n > 0)
            left[gpu.product][combo] -= 1
            layout = placements_for(gpu.product, combo)
        advised.append(GpuAdvice(gpu, tuple(sorted(layout))))
    return tuple(advised)
