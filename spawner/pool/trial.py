"""How many more of a request the pool could take now, asked of the real placement policy."""

from __future__ import annotations

from .requests import Request
from .state import Allocation, PoolState


def count_fits(pool: PoolState, request: Request, limit: int) -> int:
    """Place up to ``limit`` trial owners of ``request`` on ``pool`` and give them straight back: the count
    never disagrees with real placement, and the pool is as it was (the caller holds its lock)."""
    trial = [f"availability-trial:{n}" for n in range(limit)]
    placed = 0
    explain, pool.explain_refusals = pool.explain_refusals, False  # only the count matters, not why not
    try:
        for owner in trial:
            if not isinstance(pool.place(request, owner), Allocation):
                break
            placed += 1
    finally:
        for owner in trial[:placed]:
            pool.release(owner)
        pool.explain_refusals = explain
    return placed
