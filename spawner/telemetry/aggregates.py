"""Per-minute aggregates per device and holder: what outlives the ring buffer, for long-term reports.

Each sample accounts for the time since the previous sample of the same device (at most ``max_gap``
seconds, so a sampler that stalled does not invent an hour of data), in the minute the sample falls in.
A device held by a lease adds that time to ``seconds_held``; when its utilisation is above
``idle_threshold`` percent (the one that makes a held GPU idle for culling), to ``seconds_used`` too, so a
GPU the admin page lists as held but idle is never counted used; when utilisation is not available, to
``seconds_unknown`` instead, so "held but idle" is never claimed for a device nobody can measure. Summed
over devices, users and profiles these give GPU-hours held against GPU-hours used.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

from .activity import DEFAULT_THRESHOLD_PERCENT
from .samples import Sample

MINUTE = 60.0


@dataclass(frozen=True)
class Holder:
    """Who holds a device through which lease: the key aggregates are split by."""

    user: str
    profile: str
    lease_id: str
    gpu_equivalents: float = 1.0  # of the device it holds (spawner/pool/gpu_equivalents.py): weighs its hours


@dataclass(frozen=True)
class MinuteAggregate:
    """One device over one minute (``minute`` is its start, seconds since the epoch), for one holder (None:
    nobody held it). Means and maxima are over the samples that had the metric; None when none had it."""

    uuid: str
    node: str
    gpu_index: int
    mig_profile: str | None
    minute: float
    holder: Holder | None
    samples: int
    seconds: float
    seconds_held: float
    seconds_used: float
    seconds_unknown: float
    utilization_mean: float | None
    utilization_max: float | None
    memory_used_mean_mib: float | None
    memory_used_max_mib: float | None


@dataclass
class _Bucket:
    sample: Sample  # the first one: where the device lives
    minute: float
    holder: Holder | None
    samples: int = 0
    seconds: float = 0.0
    held: float = 0.0
    used: float = 0.0
    unknown: float = 0.0
    utilization: list[float] = field(default_factory=list)
    memory: list[float] = field(default_factory=list)

    def close(self) -> MinuteAggregate:
        return MinuteAggregate(
            uuid=self.sample.uuid,
            node=self.sample.node,
            gpu_index=self.sample.gpu_index,
            mig_profile=self.sample.mig_profile,
            minute=self.minute,
            holder=self.holder,
            samples=self.samples,
            seconds=self.seconds,
            seconds_held=self.held,
            seconds_used=self.used,
            seconds_unknown=self.unknown,
            utilization_mean=_mean(self.utilization),
            utilization_max=max(self.utilization) if self.utilization else None,
            memory_used_mean_mib=_mean(self.memory),
            memory_used_max_mib=max(self.memory) if self.memory else None,
        )


class MinuteAggregator:
    """Folds samples into per-minute aggregates; :meth:`add` returns the minutes it closed."""

    def __init__(self, *, idle_threshold: float = DEFAULT_THRESHOLD_PERCENT, max_gap: float = 10.0) -> None:
        if not 0 <= idle_threshold < 100:
            raise ValueError(f"idle_threshold: a percentage from 0 to under 100, got {idle_threshold}")
        if not max_gap > 0:
            raise ValueError(f"max_gap: must be more than 0 seconds, got {max_gap}")
        self.idle_threshold = idle_threshold
        self.max_gap = max_gap
        self._open: dict[str, dict[Holder | None, _Bucket]] = {}
        self._last_time: dict[str, float] = {}

    def add(self, sample: Sample, holders: Collection[Holder] = ()) -> list[MinuteAggregate]:
        """Count ``sample``, held by ``holders`` (several on a shared GPU: each held it for the whole time;
        none: nobody held it); the device's earlier minutes that it closes come back."""
        minute = math.floor(sample.time / MINUTE) * MINUTE
        buckets = self._open.setdefault(sample.uuid, {})
        closed = [b.close() for b in buckets.values() if b.minute < minute]
        if closed:
            for key in [k for k, b in buckets.items() if b.minute < minute]:
                del buckets[key]
        previous = self._last_time.get(sample.uuid)
        if previous is not None and sample.time < previous:
            return closed  # out of order (a clock step back): counting it would double-count time
        self._last_time[sample.uuid] = sample.time
        elapsed = min(sample.time - previous, self.max_gap) if previous is not None else 0.0
        for holder in holders or (None,):
            bucket = buckets.get(holder)
            if bucket is None:
                bucket = buckets[holder] = _Bucket(sample, minute, holder)
            bucket.samples += 1
            bucket.seconds += elapsed
            if sample.gpu_utilization is not None:
                bucket.utilization.append(sample.gpu_utilization)
            if sample.memory_used_mib is not None:
                bucket.memory.append(sample.memory_used_mib)
            if holder is not None:
                bucket.held += elapsed
                if sample.gpu_utilization is None:
                    bucket.unknown += elapsed
                elif sample.gpu_utilization > self.idle_threshold:
                    bucket.used += elapsed
        return closed

    def close_held_by(self, user: str) -> list[MinuteAggregate]:
        """Close the open minutes ``user`` held now, before their records are renamed (a deleted user): left
        open, they would close later under the name a newcomer may be given."""
        closed = []
        for buckets in self._open.values():
            for holder in [h for h in buckets if h is not None and h.user == user]:
                closed.append(buckets.pop(holder).close())
        return closed

    def flush(self) -> list[MinuteAggregate]:
        """Close every open minute (at shutdown, or to report a minute before it ends)."""
        closed = [b.close() for buckets in self._open.values() for b in buckets.values()]
        self._open.clear()
        return closed


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
