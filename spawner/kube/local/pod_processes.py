"""A pod's containers as local processes: what the kubelet records of each, starting them, and stopping them
within the pod's grace period."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Container:
    name: str
    log: Path
    process: asyncio.subprocess.Process | None = None
    started_at: str = ""
    exit_code: int | None = None
    finished_at: str = ""
    failure: str = ""  # why it could not start
    waiting: str = ""  # why it has not started yet (a Secret or ConfigMap it needs is missing)


@dataclass
class RunningPod:
    uid: str
    namespace: str
    name: str
    ip: str
    folder: Path
    containers: dict[str, Container] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    volumes: dict[str, Path] = field(default_factory=dict)  # volume name -> its folder here (see .mounts)
    deleting: bool = False
    task: asyncio.Task[None] | None = None


async def spawn(
    record: Container, argv: list[str], env: dict[str, str], working_dir: str, pod: RunningPod
) -> None:
    """Start the container's process in its pod's address and folder, its output going to its log.

    A ``workingDir`` that does not exist here becomes the pod's folder: volumes are not mounted."""
    if not argv:
        raise ValueError(
            "gpupool's simulated kubelet pulls no image, so it cannot run the image's own command; "
            "give the container a command or args"
        )
    argv = [part.replace("0.0.0.0", pod.ip) for part in argv]
    folder = Path(working_dir or pod.folder)
    if not folder.is_dir():
        folder = pod.folder
    with record.log.open("ab") as out:
        record.process = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            cwd=folder,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    record.started_at = now()


def failed_to_start(record: Container, error: Exception) -> None:
    """Record a container that never ran, as a kubelet's StartError (exit code 128)."""
    record.failure = str(error)
    record.exit_code = 128
    record.finished_at = record.started_at = now()
    record.log.write_text(f"gpupool's simulated kubelet could not start {record.name}: {error}\n")


async def wait_for(record: Container) -> int:
    """The container's exit code once it has ended (1 when it has neither a process nor a code)."""
    if record.process is not None:
        record.exit_code = exit_code(await record.process.wait())
        record.finished_at = now()
    return record.exit_code if record.exit_code is not None else 1


async def wait_for_all(pod: RunningPod) -> None:
    """Wait until every started container of ``pod`` has ended, and record how each ended."""
    waits = [c.process.wait() for c in pod.containers.values() if c.process and c.exit_code is None]
    await asyncio.gather(*waits)
    for container in pod.containers.values():
        if container.process is not None and container.exit_code is None:
            container.exit_code = exit_code(container.process.returncode)
            container.finished_at = now()


async def kill(pod: RunningPod, grace_s: int) -> None:
    """SIGTERM to every process group of the pod, SIGKILL to those still there after the grace period."""
    processes = [c.process for c in pod.containers.values() if c.process and c.process.returncode is None]
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(pod.done.wait(), timeout=max(grace_s, 0.5))
    except TimeoutError:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pod.done.wait(), timeout=10)


def exit_code(returncode: int | None) -> int:
    """A process's return code as a container's exit code (a signal ``n`` is ``128 + n``)."""
    if returncode is None:
        return 0
    return 128 - returncode if returncode < 0 else returncode
