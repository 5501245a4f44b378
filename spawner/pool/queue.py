"""The admission queue: requests that could not be placed wait here, servers and jobs alike.

Order is priority (higher first), then fair share (the user's recent GPU usage, lower first; see
:mod:`.fair_share`), then arrival (``submitted_at``, earlier first), then the order ``add`` saw them, so entries
restored after a restart keep their place. Usage changes as time passes, so the queue holds a snapshot:
``reorder`` takes a new one and sorts again (entries of equal usage keep their relative order).

Admission rule — strict order per device kind, backfill across kinds. ``admit`` walks the queue in order
and tries an entry only when no entry ahead of it that *competes* with it (see ``competes``) is still waiting,
whatever that entry's priority. So a small request never slips past a bigger one waiting for the same kind
of device: the bigger one cannot be starved by a stream of small ones. But a request for a different kind —
a MIG slice behind a blocked pair of whole GPUs, an L4 share behind a blocked H100 — may pass, because it
takes nothing the blocked one could use. Competition is over GPUs only: a CPU-only server never waits behind
a GPU request, nor the reverse, though both use CPU and memory.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .requests import GpuNeed, MigSlice, Request

_Key = tuple[int, float, float, int]  # (-priority, usage, submitted_at, sequence): ascending is queue order
Usage = Callable[[str], float]  # a user's recent GPU usage, for fair share within a priority class


def _no_usage(_user: str) -> float:
    return 0.0


class AlreadyQueued(ValueError):
    """An entry with this id is already waiting."""


class NotQueued(LookupError):
    """No entry with this id is waiting (it was admitted, removed, or never added)."""


@dataclass(frozen=True)
class QueuedRequest:
    """One waiting request, for the owner (a server or a job) that will hold the lease once placed."""

    id: str
    owner: str
    user: str
    request: Request
    priority: int
    submitted_at: float  # seconds on any clock the caller keeps; the queue only compares them
    description: str = ""
    # its time limit is enforced (a job's max_runtime): it may backfill, starting ahead of what it competes
    # with when it will have ended before their expected start (see ``admit``)
    backfills: bool = False

    def __post_init__(self) -> None:
        if math.isnan(self.submitted_at):
            raise ValueError("submitted_at must be a number, got nan")


def competes(a: GpuNeed | None, b: GpuNeed | None) -> bool:
    """Whether GPU needs ``a`` and ``b`` could be served by the same devices (None: no GPU).

    Whole GPUs, MIG slices and shares come from GPUs in different modes, so different kinds never compete;
    the same kind competes when the allowed products overlap (no products means any). Two MIG slices with
    different named profiles use different instances and do not compete. A CPU-only request competes only
    with other CPU-only requests.
    """
    if a is None or b is None:
        return a is None and b is None
    if type(a) is not type(b):
        return False
    if a.products and b.products and not a.products & b.products:
        return False
    if isinstance(a, MigSlice) and isinstance(b, MigSlice):
        return a.profile is None or b.profile is None or a.profile == b.profile
    return True


class AdmissionQueue:
    """Waiting requests in admission order; ``admit`` hands them to the pool as devices free up."""

    def __init__(
        self,
        entries: Iterable[QueuedRequest] = (),
        *,
        competes: Callable[[GpuNeed | None, GpuNeed | None], bool] = competes,
        usage: Usage = _no_usage,
    ) -> None:
        self._competes = competes
        self._usage = usage
        self._keys: list[_Key] = []  # sorted; _entries[i] belongs to _keys[i]
        self._entries: list[QueuedRequest] = []
        self._key_of: dict[str, _Key] = {}
        self._sequence = 0
        for entry in entries:
            self.add(entry)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, id: object) -> bool:
        return id in self._key_of

    def get(self, id: str) -> QueuedRequest:
        return self._entries[self.position(id)]

    def entries(self) -> list[QueuedRequest]:
        """Every waiting entry, next first."""
        return list(self._entries)

    def add(self, entry: QueuedRequest) -> None:
        if entry.id in self._key_of:
            raise AlreadyQueued(f"{entry.id} is already queued")
        key = self._key(entry, self._sequence)
        self._sequence += 1
        index = bisect_left(self._keys, key)
        self._keys.insert(index, key)
        self._entries.insert(index, entry)
        self._key_of[entry.id] = key

    def _key(self, entry: QueuedRequest, sequence: int) -> _Key:
        usage = self._usage(entry.user)
        if math.isnan(usage):
            raise ValueError(f"usage of {entry.user} must be a number, got nan")
        return (-entry.priority, usage, entry.submitted_at, sequence)

    def reorder(self, usage: Usage) -> None:
        """Take a new snapshot of every user's recent usage and sort the waiting entries by it again."""
        self._usage = usage
        rows = sorted(
            (
                (self._key(entry, key[-1]), entry)
                for key, entry in zip(self._keys, self._entries, strict=True)
            ),
            key=lambda row: row[0],
        )
        self._keys = [key for key, _ in rows]
        self._entries = [entry for _, entry in rows]
        self._key_of = {entry.id: key for key, entry in rows}

    def remove(self, id: str) -> QueuedRequest:
        """Take an entry out (cancelled, or placed); the others keep their order."""
        index = self.position(id)
        del self._keys[index]
        del self._key_of[id]
        return self._entries.pop(index)

    def position(self, id: str) -> int:
        """Place in the whole queue: 0 is next."""
        key = self._key_of.get(id)
        if key is None:
            raise NotQueued(f"{id} is not queued")
        return bisect_left(self._keys, key)

    def ahead_of(self, id: str) -> list[QueuedRequest]:
        """The entries that must be placed or leave before this one is tried: those ahead that compete."""
        index = self.position(id)
        mine = self._entries[index].request.gpu
        return [e for e in self._entries[:index] if self._competes(e.request.gpu, mine)]

    def waiting_message(self, id: str, what: str) -> str:
        """What a waiting user reads, e.g. ``Waiting for a free H100-80GB: 2 ahead of you``."""
        ahead = len(self.ahead_of(id))
        return f"Waiting for a free {what}: " + ("you are next" if ahead == 0 else f"{ahead} ahead of you")

    def admit(
        self,
        try_place: Callable[[QueuedRequest], bool],
        may_pass: Callable[[QueuedRequest, list[QueuedRequest]], bool] | None = None,
    ) -> list[QueuedRequest]:
        """Offer entries to ``try_place`` in order, by the rule above; return (and dequeue) those it placed.

        ``try_place`` places the entry and returns True, or returns False and changes nothing; it must not
        add or remove queue entries itself. Backfill: an entry that ``backfills`` is offered even behind
        competing waiting entries when ``may_pass(entry, those entries)`` says it ends before they can start.
        """
        admitted: list[QueuedRequest] = []
        waiting: set[GpuNeed | None] = set()  # the needs of entries still queued ahead of this one
        blocked: list[QueuedRequest] = []  # those entries themselves, for ``may_pass``
        for entry in list(self._entries):
            need = entry.request.gpu
            free = not any(self._competes(w, need) for w in waiting)
            if not free and entry.backfills and may_pass is not None:
                free = may_pass(entry, [b for b in blocked if self._competes(b.request.gpu, need)])
            if free and try_place(entry):
                self.remove(entry.id)
                admitted.append(entry)
            else:
                waiting.add(need)
                blocked.append(entry)
        return admitted
