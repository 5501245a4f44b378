"""Processes the hub starts end with the hub, even when it is killed (``kill -9``, an OOM kill).

JupyterHub stops its managed services (the gpupool service, the idle culler) when it shuts down, but a hub
that is killed leaves them running; a restarted hub then starts a second culler beside the old one, and a
second service that finds the old one holding the port. Linux can tell a process when its parent dies
(``prctl(PR_SET_PDEATHSIG)``); the setting survives ``exec``, so ``python -m gpupool.spawner.orphans
COMMAND…`` gives it to any program (the culler), and :func:`end_with_parent` to a Python one (the service).
Elsewhere than Linux both do nothing.

A parent that dies before its child asks for the signal sends none; the child then sees another parent
(``getppid``). It can tell only if it knows whom to expect, since by then ``getppid`` already names the new
one: the hub's configuration passes its own pid in :data:`PARENT_ENV` (:func:`parent_environment`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
PARENT_ENV = "GPUPOOL_PARENT_PID"


def parent_environment() -> dict[str, str]:
    """What the hub puts in the environment of a process it starts, so that process knows its parent."""
    return {PARENT_ENV: str(os.getpid())}


def end_with_parent(sig: signal.Signals = signal.SIGTERM) -> None:
    """Have ``sig`` sent to this process when its parent dies; exit now if the parent is already gone."""
    if not sys.platform.startswith("linux"):
        return
    expected = os.environ.pop(PARENT_ENV, "")
    parent = int(expected) if expected.isdigit() else os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return  # not allowed here: run on, as before
    if os.getppid() != parent:  # the parent died before the request took effect
        raise SystemExit("the process that started this one is gone")


def command(argv: list[str]) -> list[str]:
    """``argv`` run so that it ends with the process that starts it."""
    return [sys.executable, "-m", __name__, *argv]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: python -m {__spec__.name if __spec__ else 'orphans'} COMMAND [ARG…]")
    end_with_parent()
    # A hub started in the background by a shell ignores SIGINT and its children inherit that, so JupyterHub's
    # stop (SIGINT first, SIGTERM 10 s later) would wait out its whole grace period on each one.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execvp(sys.argv[1], sys.argv[1:])
