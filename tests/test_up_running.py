"""``gpupool up`` refuses to start over a running hub or on a taken port, and is not fooled by a stale pid file
(the end-to-end check, a second ``gpupool up`` beside a live one, is in ``test_gpupool_up``)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from polling import until

from gpupool.spawner.hub.up_checks import UpError
from gpupool.spawner.hub.up_running import HUB_PID_FILE, check_not_running, running_hub


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_live_hub_in_the_state_folder_is_named_and_a_stale_pid_is_not(tmp_path: Path) -> None:
    ports = {"--port": _free_port()}
    pretend = [sys.executable, "-c", "import sys, time; time.sleep(30)", "gpupool", "up"]
    with subprocess.Popen(pretend) as hub:  # a command line like gpupool up's
        command = Path(f"/proc/{hub.pid}/cmdline")
        until(lambda: b"gpupool" in command.read_bytes(), "the child to exec", timeout=10)  # not our fork's
        (tmp_path / HUB_PID_FILE).write_text(f"{hub.pid}\n")
        with pytest.raises(UpError, match=f"a hub already runs from {tmp_path} \\(pid {hub.pid}\\)"):
            check_not_running(tmp_path, "127.0.0.1", ports)
        hub.kill()
    check_not_running(tmp_path, "127.0.0.1", ports)  # its pid is stale now
    # a container's pids start over: the stale pid may be this very gpupool up's own
    ours = (
        "import os, sys; from pathlib import Path; from gpupool.spawner.hub.up_running import check_not_running; "
        f"Path({str(tmp_path)!r}, 'jupyterhub.pid').write_text(str(os.getpid())); "
        f"check_not_running(Path({str(tmp_path)!r}), '127.0.0.1', {ports!r})"
    )
    itself = subprocess.run([sys.executable, "-c", ours, "gpupool", "up"], capture_output=True, text=True)
    assert itself.returncode == 0, itself.stderr
    (tmp_path / HUB_PID_FILE).write_text("not a pid")
    check_not_running(tmp_path, "127.0.0.1", ports)
    # a stale pid reused by a user's server, which outlives the installed hub (the review)
    server = [
        sys.executable,
        "-c",
        "import time; time.sleep(30)",
        "/opt/gpupool/env/bin/jupyterhub-singleuser",
    ]
    with subprocess.Popen(server) as singleuser:
        command = Path(f"/proc/{singleuser.pid}/cmdline")
        until(lambda: b"singleuser" in command.read_bytes(), "the child to exec", timeout=10)
        (tmp_path / HUB_PID_FILE).write_text(f"{singleuser.pid}\n")
        assert running_hub(tmp_path) is None
        singleuser.kill()


def test_a_taken_port_is_refused_naming_its_flag(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(
            UpError, match=f"--hub-port {port}: something already listens on 127.0.0.1:{port}"
        ):
            check_not_running(tmp_path, "127.0.0.1", {"--port": _free_port(), "--hub-port": port})
