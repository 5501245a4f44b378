"""Fair share: how much GPU each user used recently, so that within a priority class the lighter user goes first.

Usage is GPU-seconds inside a sliding window (``now - window`` to ``now``), each lease weighed by the
GPU-equivalents of its devices (:mod:`.gpu_equivalents`; a CPU-only lease 0). Pure arithmetic over lease spans
the caller reads from its store; the caller's clock gives ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_WINDOW = 7 * 24 * 3600.0  # a week: long enough to even out a day's burst, short enough to forgive


@dataclass(frozen=True)
class UsageSpan:
    """One lease's time on devices: ``gpus`` GPU-equivalents from ``start`` to ``end`` (None: still held)."""

    user: str
    gpus: float
    start: float
    end: float | None


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
