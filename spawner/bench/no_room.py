"""LP rows for two moments of one run: a state with no room for a task kind, and the end that holds that state.

``work_conserving.py`` builds its bounds from these. Each moment is a copy of the cluster in one ``_Model``
(``bound.py``'s aggregated columns, rows keyed by the stage). The nodes of a kind that could host the task are
split, by counts the LP chooses, into three parts by why a node had no room for it: no GPU with the task's milli
free, less CPU free than it needs, or less memory. A part is the same nodes in both moments, so what it lacked
at the refusal it lacks at the end: nothing that needs as much of it is placed there later.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

from ..pool.devices import FULL_MILLI
from .bound import _add_node_kind, _Columns, _Model, _NodeKind, _TaskKind

THEN, END = "then", "end"  # the state when a task was refused, and the state once everything has arrived
PARTS = ("gpus", "cpu", "memory")  # what the nodes of a part lacked for the refused task

Part = tuple[_NodeKind, str | None]  # a node kind and one of its parts; None where the kind is not split
Counts = dict[Part, int]  # the column counting each part's nodes


def split_nodes(model: _Model, kinds: Counter[_NodeKind], task: _TaskKind) -> Counts:
    """Count columns for the three parts of each node kind that could host ``task``; they sum to its nodes."""
    counts: Counts = {}
    for kind, count in kinds.items():
        if not kind.hosts(task):
            continue
        most, least = (kind, "nodes"), (kind, "nodes", "least")
        model.limits.update({most: count, least: -count})
        for part in PARTS:
            counts[(kind, part)] = model.column(0.0, {most: 1, least: -1})
    return counts


def add_state(
    model: _Model,
    stage: str,
    demand: Counter[_TaskKind],
    kinds: Counter[_NodeKind],
    counts: Counts,
    valued: bool,
) -> dict[Part, _Columns]:
    """One copy of the cluster holding some of ``demand``; only a ``valued`` copy adds to the objective."""
    for task, count in demand.items():
        model.limits[(stage, task)] = count
    worth: dict[_TaskKind, tuple[float, float | None]] = {
        t: (float(t.value) if valued else 0.0, None) for t in demand
    }
    columns: dict[Part, _Columns] = {}
    for kind, count in kinds.items():
        parts: list[str | None] = [p for p in PARTS if (kind, p) in counts]
        for part in parts or [None]:
            nodes = count if part is None else 0  # a part's capacity follows its count column instead
            placed = _add_node_kind(model, kind, nodes, worth, "share-patterns", stage, part)
            at = placed.at
            model.limits.update({(at, "cpu"): nodes * kind.cpu, (at, "memory"): nodes * kind.memory})
            if part is not None:
                size = counts[(kind, part)]
                for resource, capacity in (("cpu", kind.cpu), ("memory", kind.memory), ("gpus", kind.gpus)):
                    model.entries.append(((at, resource), size, -capacity))
            if not valued:
                _arcs_are_shares(model, at, placed)
            columns[(kind, part)] = placed
    return columns


def at_least(model: _Model, stage: str, states: dict[Part, _Columns], task: _TaskKind, n: int) -> None:
    """At least ``n`` tasks of ``task`` placed in ``stage``; one row per kind, holding the largest ``n`` asked."""
    if n <= 0:
        return
    row = (stage, "placed", task)
    if row in model.limits:
        model.limits[row] = min(model.limits[row], -n)
        return
    model.limits[row] = -n
    model.entries.extend((row, c.placing[task], -1) for c in states.values() if task in c.placing)


def no_room(model: _Model, then: dict[Part, _Columns], counts: Counts, task: _TaskKind) -> None:
    """No node of the ``then`` state has room for ``task``: each part lacks what it is named for."""
    room = FULL_MILLI - task.milli  # the most a GPU may hold and still take the task
    for (kind, part), size in counts.items():
        columns, row = then[(kind, part)], (THEN, kind, part, "lacks")
        model.limits[row] = 0
        if (
            part == "gpus"
        ):  # every GPU whole or shared above ``room``, counted along the share network's paths
            model.entries.append((row, size, kind.gpus))
            model.entries.extend(
                (row, c, -placed.gpus) for placed, c in columns.placing.items() if placed.gpus
            )
            for column, start, length in columns.arcs:
                counted = (0 < start + length <= room) - (0 < start <= room) - (start == 0)
                if counted:
                    model.entries.append((row, column, counted))
            continue
        need, capacity = getattr(task, str(part)), getattr(kind, str(part))
        model.entries.append((row, size, capacity - need + 1))  # each node uses more than all but ``need``
        model.entries.extend((row, c, -getattr(placed, str(part))) for placed, c in columns.placing.items())


def end_holds_then(
    model: _Model, then: dict[Part, _Columns], end: dict[Part, _Columns], task: _TaskKind
) -> None:
    """The end holds every task the earlier state held where it was, and no part took a task later that needs
    what it lacked for ``task``; each GPU the earlier state shared keeps its shares (``_extend_shares``)."""
    for (kind, part), columns in then.items():
        later = end[(kind, part)]
        for placed, column in columns.placing.items():
            row = (THEN, kind, part, "kept", placed)
            model.limits[row] = 0
            model.entries.extend([(row, column, 1), (row, later.placing[placed], -1)])
        if part is not None:
            for placed, column in later.placing.items():
                if _needs_what_it_lacks(placed, part, task):
                    row = (END, kind, part, "closed", placed)
                    model.limits[row] = 0
                    model.entries.append((row, column, 1))
                    if placed in columns.placing:
                        model.entries.append((row, columns.placing[placed], -1))
        _extend_shares(model, later.at, columns)


def _extend_shares(model: _Model, end: Hashable, then: _Columns) -> None:
    """The end's share network continues each GPU's path of the earlier state from where it stopped.

    The earlier state's arcs join the end's network as they are: its shares count toward the end's, the GPUs it
    opened are not free, and new shares on those GPUs start at the level it left them, so the end cannot pack
    the earlier shares again more tightly.
    """
    for column, start, size in then.arcs:
        model.entries.append(((end, "share", size), column, -1))
        model.entries.append(((end, "gpus") if start == 0 else (end, "flow", start), column, 1))
        if (end, "flow", start + size) in model.limits:
            model.entries.append(((end, "flow", start + size), column, -1))


def _needs_what_it_lacks(placed: _TaskKind, part: str, task: _TaskKind) -> bool:
    if part == "gpus":
        return bool(placed.gpus) or task.milli <= placed.milli
    return bool(getattr(placed, part) >= getattr(task, part))


def _arcs_are_shares(model: _Model, at: Hashable, columns: _Columns) -> None:
    """Arcs of a share size no more than the shares placed: a GPU's level is then what it holds, not padding."""
    for column, _, size in columns.arcs:
        model.limits[(at, "arcs", size)] = 0
        model.entries.append(((at, "arcs", size), column, 1))
    for task, column in columns.placing.items():
        if task.milli and not task.gpus:
            model.entries.append(((at, "arcs", task.milli), column, -1))
