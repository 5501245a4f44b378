"""How the end-to-end tests wait: poll quickly at first, then back off.

A check often costs the hub or the service a request; polled every 50 ms through a 20-second spawn it takes a
good share of the two CPUs the spawn itself needs. Backing off to half a second keeps a quick answer quick and
a long wait cheap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

FIRST_S = 0.05
LONGEST_S = 0.5


def pauses(timeout: float) -> Iterator[None]:
    """Yield until ``timeout`` seconds have passed, sleeping a little longer before each next yield, and once
    more at the deadline: a machine that stalled (a busy CI host, a paused VM) still gets its last look."""
    deadline = time.monotonic() + timeout
    pause = FIRST_S
    while time.monotonic() < deadline:
        yield
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 1.5, LONGEST_S)
    yield


def until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Wait for ``check`` to hold; fail the test with ``what`` when it does not within ``timeout`` seconds."""
    for _ in pauses(timeout):
        if check():
            return
    pytest.fail(f"{what} within {timeout}s")
