"""Fair share: how much GPU each user used recently, so that within a priority class the lighter user goes first.

Usage is GPU-seconds inside a sliding window (``now - window`` to ``now``): a whole GPU counts 1, a share its
fraction, a MIG slice the fraction of its GPU's memory it holds (``3g.40gb`` of an 80 GB H100 is 0.5), a CPU-only
lease 0. Pure arithmetic over lease spans the caller reads from its store; the caller's clock gives ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .devices import FULL_MILLI
from .requests import GpuShare, MigSlice, Request, WholeGpus

DEFAULT_WINDOW = 7 * 24 * 3600.0  # a week: long enough to even out a day's burst, short enough to forgive


@dataclass(frozen=True)
class UsageSpan:
    """One lease's time on devices: ``gpus`` GPU-equivalents from ``start`` to ``end`` (None: still held)."""

    user: str
    gpus: float
    start: float
    end: float | None


def gpu_weight(request: Request, memory_mib: int = 0, gpu_memory_mib: int = 0) -> float:
    """GPU-equivalents a request holds; for a MIG slice pass its memory and its parent GPU's."""
    need = request.gpu
    if isinstance(need, WholeGpus):
        return float(need.count)
    if isinstance(need, GpuShare):
        return need.milli / FULL_MILLI
    if isinstance(need, MigSlice):
        return memory_mib / gpu_memory_mib if gpu_memory_mib > 0 else 0.5
    return 0.0


def recent_usage(spans: Iterable[UsageSpan], now: float, window: float = DEFAULT_WINDOW) -> dict[str, float]:
    """GPU-seconds per user inside ``[now - window, now]``; users with no span are absent (their usage is 0)."""
    since = now - window
    usage: dict[str, float] = {}
    for span in spans:
        start = max(span.start, since)
        end = min(now if span.end is None else span.end, now)
        if end > start and span.gpus > 0:
            usage[span.user] = usage.get(span.user, 0.0) + span.gpus * (end - start)
    return usage
