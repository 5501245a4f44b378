"""Whether a hub already runs where ``gpupool up`` (or the installed hub's launcher) would start one.

A second ``gpupool up`` on the same state folder used to take over the first one's proxy (JupyterHub stops the
proxy its pid file names, as it should after a crash), leaving port 8000 dead for seconds and the pid file
naming the wrong hub; one on the same ports failed later with a traceback. Both are refused here, before
anything is written. A proxy left by a hub killed with ``kill -9`` is not in the way: the restarted hub takes
it over, so its ports count as free.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from .up_checks import UpError

HUB_PID_FILE = "jupyterhub.pid"  # in the state folder (hub_config/embedded.py)
PROXY_PID_FILE = "jupyterhub-proxy.pid"
PROXY_PORTS = ("--port", "--proxy-api-port")  # what the proxy listens on


def check_not_running(state: Path, ip: str, ports: dict[str, int]) -> None:
    """:class:`UpError` if a hub runs from ``state``, or a port ``gpupool up`` needs is taken by another
    program; ``ports`` by the flag that sets each (``--port`` on ``ip``, the others on loopback)."""
    hub = running_hub(state)
    if hub is not None:
        raise UpError(
            f"a hub already runs from {state} (pid {hub}): stop it first (Ctrl-C where it runs, or "
            f"kill -INT {hub}), or start another with its own --state-dir and --port"
        )
    proxy_left = _running(state / PROXY_PID_FILE, ("configurable-http-proxy",)) is not None
    for flag, port in ports.items():
        host = ip if flag == "--port" else "127.0.0.1"
        if proxy_left and flag in PROXY_PORTS:
            continue
        if _taken(host, port):
            raise UpError(
                f"{flag} {port}: something already listens on {host}:{port} (another hub?); stop it or "
                f"choose another {flag}"
            )


def running_hub(state: Path) -> int | None:
    """The pid of the hub that runs from ``state`` (its pid file names a live hub), else None."""
    # a stale pid file's pid, reused by a user's server (they outlive the hub), is no hub
    return _running(state / HUB_PID_FILE, ("gpupool", "jupyterhub"), unless="singleuser")


def _running(pid_file: Path, names: tuple[str, ...], unless: str | None = None) -> int | None:
    """The pid in ``pid_file`` if that process runs and its command line has one of ``names`` (and not
    ``unless``)."""
    try:
        pid = int(pid_file.read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return None  # no file, a stale one, or a process gone
    if pid == os.getpid():  # a stale file whose pid came back as ours (a container's pids start over)
        return None
    if unless is not None and unless in command:
        return None
    return pid if any(name in command for name in names) else None


def _taken(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.closing(socket.socket(family, socket.SOCK_STREAM)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to bind
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False
