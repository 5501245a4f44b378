"""The GPU-equivalent, defined once: how much of one GPU a device handed out is.

A whole GPU is 1, a share its milli over 1000, a MIG instance its compute slices over its GPU's (``3g.40gb`` of
an H100 is 3/7, ``1g.6gb`` of an A30 1/4): compute, not memory, is what a slice takes from everyone else.
Every GPU-hours figure gpupool shows (``GET usage``, the dashboard, ``/metrics``) and the fair-share order
weigh devices by it, so the same hour on a 1g slice is the same number everywhere. A grant carries it as its
``milli`` (:mod:`.state`), so a stored lease keeps the weight it was granted with.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .devices import FULL_MILLI
from .mig import geometry

if TYPE_CHECKING:
    from .state import Grant

DEFAULT_COMPUTE_SLICES = 7  # A100, H100, H200, B200: the GPUs most MIG profiles are named after


def mig_instance_milli(product: str, profile: str) -> int:
    """Thousandths of a GPU a MIG instance of ``profile`` on ``product`` is."""
    slices = int(profile.split("g.", 1)[0])
    try:
        total = geometry(product).compute_slices
    except ValueError:  # a product without known geometry: the common seven
        total = DEFAULT_COMPUTE_SLICES
    return round(FULL_MILLI * slices / total)


def of_grant(grant: Grant) -> float:
    """GPU-equivalents of one device handed out."""
    return grant.milli / FULL_MILLI


def of_grants(grants: Iterable[Grant]) -> float:
    return sum(of_grant(g) for g in grants)


def shares_worth(milli: float) -> str:
    """``1.5 GPUs' worth of shares``, ``1 GPU's worth of shares``: free share capacity as the pages say it."""
    gpus = milli / FULL_MILLI
    return f"{gpus:g} GPU's worth of shares" if gpus == 1 else f"{gpus:g} GPUs' worth of shares"
