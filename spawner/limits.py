"""CPU and memory limits that hold on one host: a control group per server and per job.

A profile's "16 CPUs · 128 GiB" is what the pool counts a server or job as holding; without a limit one
notebook can starve the host and the count is fiction. Each server and job therefore runs in a cgroup of its
own, made by root before the process starts and joined before the process gives up root, with:

- cgroup v2 (one unified hierarchy): ``memory.max``, ``memory.swap.max`` 0 and ``cpu.max``, in
  ``/sys/fs/cgroup/gpupool/<name>`` (the controllers enabled on the way down);
- cgroup v1: ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap is accounted;
  ``memory.swappiness`` 0 either way) and
  ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, in ``gpupool/<name>`` below this process's own cgroup of
  each of the ``memory`` and ``cpu`` hierarchies (and ``cpuacct``, which counts CPU time, where it is mounted
  apart from ``cpu``).

Past its memory the kernel's OOM killer ends a process of that group, not the hub or another user's work.
Where neither hierarchy can be written (not root, a read-only ``/sys/fs/cgroup``), :func:`host_cgroups` says
why and nothing is enforced; the hub's log and spawn form then say so.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "gpupool"  # the folder every server's and job's cgroup sits in
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    """What one server or job may use: ``cpu_milli`` thousandths of a core, ``memory_mib`` MiB."""

    cpu_milli: int
    memory_mib: int

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def cpu_quota_us(self) -> int:
        return max(1000, self.cpu_milli * CPU_PERIOD_US // 1000)  # the kernel's least quota is 1 ms


@dataclass(frozen=True)
class Cgroup:
    """One server's or job's control group: a folder per hierarchy (one on v2, memory and cpu on v1)."""

    folders: tuple[Path, ...]

    def add(self, pid: int = 0) -> None:
        """Move ``pid`` (0: the calling process) into the group; its children are born in it."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for folder in self.folders:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        return sorted(found)

    def memory_used(self) -> int | None:
        """Bytes of memory the group uses now, or None when the kernel does not say."""
        for name in ("memory.current", "memory.usage_in_bytes"):
            for folder in self.folders:
                with contextlib.suppress(OSError, ValueError):
                    return int((folder / name).read_text())
        return None

    def cpu_seconds(self) -> float | None:
        """CPU time the group's processes have used, children that ended included; None when not counted."""
        for folder in self.folders:
            with contextlib.suppress(OSError, ValueError):
                return int((folder / "cpuacct.usage").read_text()) / 1e9
            with contextlib.suppress(OSError, ValueError):
                for line in (folder / "cpu.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
        return None

    def oom_kills(self) -> int:
        """How often the kernel's OOM killer has ended one of the group's processes."""
        for folder in self.folders:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError):
                    for line in (folder / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
        return 0

    def remove(self) -> None:
        """Delete the group once its processes are gone (a group still in use stays)."""
        for folder in self.folders:
            with contextlib.suppress(OSError):
                folder.rmdir()

    def end(self, timeout: float = 5.0) -> bool:
        """Kill whatever still runs in the group and delete it; False if a process outlived ``timeout`` seconds.

        A server's kernels run in sessions of their own, so one killed by its spawner leaves them behind, and
        a job's command may leave children when it exits. Once the lease is released they would hold its
        memory and GPUs unseen, so everything left in the group goes with it."""
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.pids():  # again each time: a process may fork while the others are killed
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.remove()
            if not any(folder.exists() for folder in self.folders):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


@dataclass(frozen=True)
class HostCgroups:
    """The cgroup hierarchy this host lets gpupool use: ``version`` 2 or 1, or 0 with ``reason`` saying why
    limits are not enforced here."""

    version: int
    parents: tuple[Path, ...] = ()
    reason: str = ""

    @property
    def enforced(self) -> bool:
        return self.version > 0

    def description(self) -> str:
        if not self.enforced:
            return f"CPU and memory limits are not enforced on this host: {self.reason}"
        return f"CPU and memory limits are enforced with cgroup v{self.version} ({', '.join(map(str, self.parents))})"

    def log(self, logger: logging.Logger, prefix: str = "") -> None:
        """Say in ``logger``'s log whether limits hold: a warning when they do not."""
        logger.log(logging.INFO if self.enforced else logging.WARNING, "%s%s", prefix, self.description())

    def group(self, name: str) -> Cgroup | None:
        """The group ``name`` (``server-<lease>``, ``job-<id>-<attempt>``), existing or not; None when limits
        are not enforced."""
        return Cgroup(tuple(parent / name for parent in self.parents)) if self.enforced else None

    def create(self, name: str, limits: Limits) -> Cgroup | None:
        """The group ``name`` with ``limits`` set (made now, or reset if a crash left it); None when limits
        are not enforced. OSError when the kernel refuses."""
        group = self.group(name)
        if group is None:
            return None
        for folder in group.folders:
            folder.mkdir(exist_ok=True)
        if self.version == 2:
            (folder,) = group.folders
            _write(folder / "memory.max", str(limits.memory_bytes))
            _write(folder / "memory.swap.max", "0", optional=True)
            _write(folder / "cpu.max", f"{limits.cpu_quota_us} {CPU_PERIOD_US}")
        else:
            memory, cpu, *_ = group.folders  # then cpuacct, where it is a hierarchy of its own
            _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes), optional=True)
            # where swap is not accounted (no memsw file), a group past its limit would swap instead of
            # meeting the OOM killer, and a swapping notebook stalls every disk user on the host
            _write(memory / "memory.swappiness", "0", optional=True)
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(limits.cpu_quota_us))
        return group


def server_group(lease_id: str) -> str:
    """The name of the group a server holding lease ``lease_id`` runs in."""
    return f"server-{lease_id}"


def job_group(job_id: str, attempt: int) -> str:
    """The name of the group attempt ``attempt`` of job ``job_id`` runs in (each attempt starts afresh)."""
    return f"job-{job_id}-{attempt}"


@functools.cache
def this_host() -> HostCgroups:
    """:func:`host_cgroups` of this host, looked at once per process."""
    return host_cgroups()


def host_cgroups(root: Path = ROOT) -> HostCgroups:
    """What this host offers, with gpupool's parent folders made and ready for groups below them."""
    if os.geteuid() != 0:
        return HostCgroups(0, reason="gpupool does not run as root, so it cannot make control groups")
    try:
        if (root / "cgroup.controllers").exists():
            return _unified(root)
        if (root / "memory").is_dir() and (root / "cpu").is_dir():
            return _legacy(root)
    except OSError as error:
        return HostCgroups(0, reason=f"{root} cannot be written ({error.strerror or error})")
    return HostCgroups(
        0, reason=f"neither cgroup v2 nor v1's memory and cpu controllers are mounted at {root}"
    )


def _unified(root: Path) -> HostCgroups:
    available = (root / "cgroup.controllers").read_text().split()
    missing = {"memory", "cpu"} - set(available)
    if missing:
        return HostCgroups(0, reason=f"cgroup v2 lacks the {' and '.join(sorted(missing))} controller")
    _write(root / "cgroup.subtree_control", "+memory +cpu")
    parent = root / GROUP
    parent.mkdir(exist_ok=True)
    _write(parent / "cgroup.subtree_control", "+memory +cpu")
    return HostCgroups(2, (parent,))


def _legacy(root: Path) -> HostCgroups:
    own = _own_v1_paths()
    parents = []
    controllers = ["memory", "cpu"]
    if (root / "cpuacct").is_dir() and (root / "cpuacct").resolve() != (root / "cpu").resolve():
        controllers.append("cpuacct")
    for controller in controllers:
        parent = root / controller / own.get(controller, "/").lstrip("/") / GROUP
        parent.mkdir(exist_ok=True)
        parents.append(parent)
    return HostCgroups(1, tuple(parents))


def _own_v1_paths() -> dict[str, str]:
    """This process's cgroup in each v1 hierarchy (``/proc/self/cgroup``): groups go below it, so a
    container's own limits still hold over them."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            paths[controller] = path
    return paths


def _write(path: Path, value: str, *, optional: bool = False) -> None:
    try:
        path.write_text(value)
    except OSError as error:
        if optional and error.errno in (errno.ENOENT, errno.EINVAL, errno.EACCES):
            return
        raise
