"""Free TCP ports for the processes tests start, never the same one in two test processes at once.

A port from ``bind(0)`` is free when asked, but another pytest-xdist worker may be handed it a moment later,
before our hub binds it: then two hubs share a proxy. So each worker hands out ports from a slice of its own,
below the kernel's ephemeral range (32768 and up), where ``bind(0)`` and JupyterHub's random server ports land.
"""

from __future__ import annotations

import itertools
import os
import random
import socket

SLICE = 2500  # ports per worker: 20000-22499 for gw0, 22500-24999 for gw1, ... (five workers fit)
FIRST = 20000


def _worker_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    start = FIRST + SLICE * (int(worker) if worker.isdigit() else 0)
    return range(start, start + SLICE)


_ports = _worker_slice()
_candidates = itertools.cycle(random.sample(_ports, len(_ports)))


def is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(offsets: tuple[int, ...] = (0,)) -> int:
    """A port of this worker's slice that is free, with ``port + offset`` free too for every offset (and in
    the slice); a port is handed out again only after the whole slice has been."""
    for _ in range(len(_ports)):
        port = next(_candidates)
        if port + max(offsets) in _ports and all(is_free(port + offset) for offset in offsets):
            return port
    raise RuntimeError(f"no free port in {_ports.start}-{_ports.stop - 1}")
