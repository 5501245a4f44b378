"""A bound for the protocol's own rule, that every task which fits is placed as it arrives.

``placement_bound`` lets a placement leave any task out, so on default it allows 99.89% where runs reach 95–96%:
most of that distance is the rule, not packing. This bounds only *work-conserving* runs (every policy we ship,
FGD and the paper's baselines), from two facts of a protocol with no departures:

- free room only shrinks, so once a task of some kind is refused, no later state has room for that kind;
- before its first refusal, every task of the kind that arrived was placed.

Both become rows of the aggregated LP of ``bound.py`` (the ``share-patterns`` relaxation), built in
``no_room.py``:

- *placed from the start*: for each common kind, the most arrivals (to 1%) after which no placement of them
  (LP relaxed) leaves the kind without room. Every run placed each task of the kind that arrived by then.
- *a switch*: a run's first refusal of the most common share kind falls among its arrivals ``lo…hi``, or
  nowhere. Then its first ``lo − 1`` were placed, and the state when the ``hi``-th arrived left it no room: an
  LP over two copies of the cluster, that state and the end, where the end holds what that state held and the
  nodes that had no room take nothing later that needs what they lacked. The bound is the largest over a
  partition of ``1…N``, split where largest (branch and bound) while time is left; any partition gives a
  bound, a finer one a tighter bound.

An LP HiGHS does not solve within ``lp_seconds`` counts at what it relaxes to: a blockability test as "could
leave no room", a branch as the end state alone (only the placed-from-the-start rows), so a stopped solve
loosens the bound and never breaks it; the result counts them.

"No room" needs a cluster whose GPUs are limited by milli alone (healthy, time-shared, no share caps), as in the
trace's; anything else is refused.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from itertools import pairwise

from ..pool.devices import FULL_MILLI, GpuMode, Health, Node
from ..pool.requests import GpuShare
from .bound import (
    BoundUnavailable,
    SolverStopped,
    _Columns,
    _Model,
    _node_kinds,
    _NodeKind,
    _task_kind,
    _TaskKind,
)
from .no_room import END, THEN, Part, add_state, at_least, end_holds_then, no_room, split_nodes
from .trace import TracePod

log = logging.getLogger(__name__)

# one LP of the default workload takes 1–60 s by interior point; simplex once sat 44 minutes in one
LP_SECONDS = 300.0


@dataclass(frozen=True)
class WorkConservingBound:
    """An upper bound on the GPU capacity any work-conserving run of one arrival allocates, in percent."""

    percent: float  # rounded up
    switch_kind: str  # the share kind whose first refusal is branched on
    placed_from_start: int  # tasks every work-conserving run places, counted before any switch
    intervals: int  # LPs solved for the switch's branches
    stopped: int  # of those, LPs HiGHS did not finish in time, counted at the end state alone
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


class _Arrival:
    """The arrival as task kinds, with the count of each kind among the first ``n`` arrivals."""

    def __init__(self, arrival: list[TracePod]) -> None:
        self.order = [_task_kind(pod) for pod in arrival]
        for pod in arrival:
            need = pod.request.gpu
            if isinstance(need, GpuShare) and need.memory_mib:
                raise BoundUnavailable(
                    "the work-conserving bound models shares by milli alone, not GPU memory"
                )

    def first(self, n: int) -> Counter[_TaskKind]:
        return Counter(kind for kind in self.order[:n] if kind is not None)

    def positions(self, kind: _TaskKind) -> list[int]:
        """How many tasks had arrived when each task of ``kind`` arrived (itself included)."""
        return [i + 1 for i, k in enumerate(self.order) if k == kind]


def work_conserving_bound(
    nodes: list[Node],
    arrival: list[TracePod],
    *,
    seconds: float = 300.0,
    common: int = 300,
    lp_seconds: float = LP_SECONDS,
) -> WorkConservingBound:
    """Bound the GPU milli a run that places every fitting task of ``arrival`` (in order) could allocate.

    ``common``: kinds with at least this many tasks are tested for being placed from the start; ``seconds``:
    the time for refining the switch's partition (the bound holds whenever it stops); ``lp_seconds``: the
    most HiGHS spends on one LP.
    """
    began = time.perf_counter()
    _check_cluster(nodes)
    kinds, tasks = _node_kinds(nodes), _Arrival(arrival)
    capacity = sum(len(n.gpus) for n in nodes) * FULL_MILLI
    everything = tasks.first(len(arrival))
    tested = [t for t, n in everything.most_common() if n >= common and t.milli and t.gpus <= 1]
    early: dict[_TaskKind, int] = {}
    for kind in tested:
        early[kind] = _latest_unblockable(tasks, kinds, kind, early, lp_seconds)
        log.debug("%s: placed from the start up to arrival %d", kind, early[kind])
    shares = [t for t in tested if not t.gpus]
    if not shares:
        raise BoundUnavailable(f"no share kind has {common} tasks or more to branch on")
    switch = shares[0]
    switching = _Switch(tasks, kinds, switch, early, lp_seconds)
    best = switching.bound(began + seconds)
    return WorkConservingBound(
        percent=math.ceil(best / capacity * 10_000 - 1e-6) / 100,
        switch_kind=f"{switch.milli} milli, {switch.cpu / 1000:g} CPUs, {switch.memory} MiB",
        placed_from_start=sum(tasks.first(n)[kind] for kind, n in early.items()),
        intervals=switching.solved,
        stopped=switching.stopped,
        seconds=round(time.perf_counter() - began, 1),
    )


def _check_cluster(nodes: list[Node]) -> None:
    if not any(node.gpus for node in nodes):
        raise BoundUnavailable("no node has a GPU: the bound is a share of GPU capacity")
    for node in nodes:
        for gpu in node.gpus:
            limited = gpu.mode is not GpuMode.SHARED or gpu.max_shares is not None or gpu.shares_only
            if limited or gpu.health is not Health.HEALTHY or node.health is not Health.HEALTHY:
                raise BoundUnavailable(
                    f"the work-conserving bound needs healthy time-shared GPUs limited by milli alone; "
                    f"{node.name}'s {gpu.label} is not"
                )


def _latest_unblockable(
    tasks: _Arrival,
    kinds: Counter[_NodeKind],
    kind: _TaskKind,
    early: dict[_TaskKind, int],
    lp_seconds: float,
) -> int:
    """The most arrivals (to 1% of them) after which no placement leaves ``kind`` without room."""
    lo, hi = 0, len(tasks.order)  # lo: cannot leave it without room; hi: can

    def can(n: int) -> bool:
        return _can_leave_no_room(tasks, kinds, kind, n, early, lp_seconds)

    if not can(hi):
        return hi
    while hi - lo > max(1, len(tasks.order) // 100):
        middle = (lo + hi) // 2
        lo, hi = (lo, middle) if can(middle) else (middle, hi)
    return lo


def _can_leave_no_room(
    tasks: _Arrival,
    kinds: Counter[_NodeKind],
    kind: _TaskKind,
    n: int,
    early: dict[_TaskKind, int],
    lp_seconds: float,
) -> bool:
    model = _Model()
    counts = split_nodes(model, kinds, kind)
    then = add_state(model, THEN, tasks.first(n), kinds, counts, valued=False)
    _place_early(model, THEN, then, tasks, early, n)
    no_room(model, then, counts, kind)
    try:
        return model.maximum(lp_seconds) is not None
    except BoundUnavailable:  # undecided or stopped: assuming it could keeps the bound an upper bound
        return True


class _Switch:
    """Branches on where a run first refused ``switch``: one LP per interval of its arrivals."""

    def __init__(
        self,
        tasks: _Arrival,
        kinds: Counter[_NodeKind],
        switch: _TaskKind,
        early: dict[_TaskKind, int],
        lp_seconds: float,
    ) -> None:
        self.tasks, self.kinds, self.switch, self.early = tasks, kinds, switch, early
        self.lp_seconds = lp_seconds
        self.arrived = tasks.positions(switch)
        self.solved = self.stopped = 0
        self._relaxed: float | None = None

    def bound(self, until: float) -> float:
        """The largest LP over a partition of the switch's arrivals, refined while time is left."""
        total = len(self.arrived)
        never, end = self._end_state()
        at_least(never, END, end, self.switch, total)
        best_never = self._solve(never)
        log.debug("never refused: %.1f milli", best_never)
        edges = sorted({1 + total * j // 16 for j in range(16)} | {total + 1})
        heap = [(-self._value(lo, hi - 1), lo, hi - 1) for lo, hi in pairwise(edges)]
        heapq.heapify(heap)
        while heap and time.perf_counter() < until:
            top, lo, hi = heap[0]
            if lo == hi or -top <= best_never:
                break
            heapq.heappop(heap)
            middle = (lo + hi) // 2
            for a, b in ((lo, middle), (middle + 1, hi)):
                heapq.heappush(heap, (-self._value(a, b), a, b))
        return max(best_never, -heap[0][0] if heap else -math.inf)

    def _value(self, lo: int, hi: int) -> float:
        """The most a run could allocate whose first refusal of the switch is among its arrivals ``lo…hi``."""
        if self.arrived[hi - 1] <= self.early.get(self.switch, 0):
            return -math.inf  # it could not have been refused that early
        bound = self._refused_within(lo - 1, self.arrived[hi - 1])
        log.debug("first refused among its arrivals %d–%d: %.1f milli", lo, hi, bound)
        return bound

    def _refused_within(self, placed: int, refused_by: int) -> float:
        """The most a run could allocate whose first ``placed`` tasks of the switch were placed and which had no
        room for it when the ``refused_by``-th task arrived; −∞ if no run could."""
        model, last = _Model(), len(self.tasks.order)
        counts = split_nodes(model, self.kinds, self.switch)
        then = add_state(model, THEN, self.tasks.first(refused_by - 1), self.kinds, counts, valued=False)
        end = add_state(model, END, self.tasks.first(last), self.kinds, counts, valued=True)
        for stage, states, n in ((THEN, then, refused_by - 1), (END, end, last)):
            _place_early(model, stage, states, self.tasks, self.early, n)
        at_least(model, THEN, then, self.switch, placed)
        no_room(model, then, counts, self.switch)
        end_holds_then(model, then, end, self.switch)
        return self._solve(model)

    def _solve(self, model: _Model) -> float:
        """The model's optimum, −∞ if infeasible; the end state alone if HiGHS stops, which it relaxes."""
        self.solved += 1
        try:
            return _or_impossible(model.maximum(self.lp_seconds))
        except SolverStopped as stopped:
            self.stopped += 1
            log.warning("%s: counting the end state alone", stopped)
            return self._end_alone()

    def _end_alone(self) -> float:
        if self._relaxed is None:
            self._relaxed = _or_impossible(self._end_state()[0].maximum())
        return self._relaxed

    def _end_state(self) -> tuple[_Model, dict[Part, _Columns]]:
        """The end state alone, holding what was placed from the start: what every branch relaxes to."""
        model, last = _Model(), len(self.tasks.order)
        end = add_state(model, END, self.tasks.first(last), self.kinds, {}, valued=True)
        _place_early(model, END, end, self.tasks, self.early, last)
        return model, end


def _or_impossible(value: float | None) -> float:
    return -math.inf if value is None else value


def _place_early(
    model: _Model,
    stage: str,
    states: dict[Part, _Columns],
    tasks: _Arrival,
    early: dict[_TaskKind, int],
    arrived: int,
) -> None:
    """Every task of a kind that arrived while no placement could leave it without room was placed."""
    for kind, n in early.items():
        at_least(model, stage, states, kind, tasks.first(min(n, arrived))[kind])
