"""Simulated telemetry: GPU readings that follow what the processes holding each device really do.

For a pool without GPUs (demos, tests, benchmarks) the sampler turns the CPU time of a device's processes
(read from ``/proc/<pid>/stat``, children included) into a plausible GPU series: a process that spins keeps
its device busy, one that sleeps leaves it at about 0%. Which processes hold a device comes from a callable
(``pids_of``), by default :func:`pids_by_visible_devices`: every process whose ``CUDA_VISIBLE_DEVICES``
names the device, which is how gpupool pins servers and jobs to their lease.

The model: utilisation is 100% per busy CPU core (capped at 100); memory in use climbs with activity and
stays, like a framework's caching allocator, until the last process goes; power moves between 10% of the
limit and the limit with utilisation; temperature follows power with a lag. A GPU in MIG mode, like NVML,
has no utilisation of its own; its instances get its temperature and clock but no power. Every snapshot
says ``simulated=True``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..pool.devices import Gpu, GpuMode, Node
from ..pool.mig import profile_compute_slices
from ..telemetry.samples import Sample, Snapshot

PidsOf = Callable[[], Mapping[str, Collection[int]]]

# (power limit W, boost SM clock MHz) per canonical product; others get the default.
_BOARD = {
    "H100-80GB": (700, 1980), "H200-141GB": (700, 1980), "GH200-96GB": (900, 1980), "H100-NVL-94GB": (400, 1785),
    "B200-180GB": (1000, 1965), "A100-80GB": (400, 1410), "A100-40GB": (400, 1410), "A30-24GB": (165, 1440),
    "L4-24GB": (72, 2040), "L40S-48GB": (350, 2520), "A10-24GB": (150, 1695), "T4-16GB": (70, 1590),
    "V100-16GB": (300, 1530), "V100-32GB": (300, 1530),
}  # fmt: skip
_DEFAULT_BOARD = (300, 1500)
_IDLE_CLOCK_MHZ = 345.0
_AMBIENT_C = 30.0
_TEMPERATURE_LAG = 0.3  # fraction of the way to the steady temperature covered per sample
_VISIBLE = re.compile(rb"(?:^|\0)(?:CUDA|NVIDIA)_VISIBLE_DEVICES=([^\0]*)")


@dataclass
class _Tree:
    """CPU ticks of a device's processes at the previous sample, by (pid, start time)."""

    ticks: dict[tuple[int, int], int]
    at: float
    uptime_ticks: float


@dataclass
class _Device:
    uuid: str
    node: str
    gpu: Gpu
    mig_profile: str | None
    memory_total_mib: float
    compute_share: float  # this device's share of its GPU's compute (1 for a whole GPU, 3/7 for a 3g)


class SimulatedSampler:
    """Samples every device of ``nodes`` (GPUs and MIG instances) from their processes' CPU activity."""

    simulated = True
    backend = "simulated"

    def __init__(
        self, nodes: Iterable[Node], pids_of: PidsOf | None = None, *, proc: str | Path = "/proc"
    ) -> None:
        self.proc = Path(proc)
        self._tick = float(os.sysconf("SC_CLK_TCK"))
        self._devices: list[_Device] = []
        self._gpus: list[tuple[str, Gpu]] = []
        for node in nodes:
            for gpu in node.gpus:
                self._gpus.append((node.name, gpu))
                if gpu.mode is not GpuMode.MIG:
                    self._devices.append(_Device(gpu.uuid, node.name, gpu, None, gpu.memory_mib, 1.0))
                for instance in gpu.mig_instances:
                    share = profile_compute_slices(instance.profile) / 7
                    self._devices.append(
                        _Device(instance.uuid, node.name, gpu, instance.profile, instance.memory_mib, share)
                    )
        uuids = {d.uuid for d in self._devices}
        self.pids_of: PidsOf = pids_of or (lambda: pids_by_visible_devices(uuids, self.proc))
        self._trees: dict[str, _Tree] = {}
        self._memory: dict[str, float] = {}
        self._temperature: dict[str, float] = {}
        # simulated XIDs, by GPU UUID, that the next sample reports: the API adds on the event loop while a worker
        # thread samples
        self._xids: dict[str, list[int]] = {}
        self._xids_lock = threading.Lock()

    def simulate_xid(self, node: str, gpu_index: int, code: int) -> None:
        """Report XID ``code`` on a GPU in the next sample, as NVML's event set would: how a demo tries the
        path a real failure takes. KeyError names the node, or the GPU the node lacks."""
        gpus = [gpu for name, gpu in self._gpus if name == node]
        if not gpus:
            raise KeyError(node)
        gpu = next((g for g in gpus if g.index == gpu_index), None)
        if gpu is None:
            raise KeyError(f"node {node} has no GPU {gpu_index}")
        with self._xids_lock:
            self._xids.setdefault(gpu.uuid, []).append(code)

    @property
    def device_count(self) -> int:
        return len(self._devices) + sum(1 for _, gpu in self._gpus if gpu.mode is GpuMode.MIG)

    def open(self) -> None:
        """Nothing to start; here so the service treats every sampler alike."""

    def close(self) -> None:
        """Nothing to stop."""

    def sample(self, at: float) -> Snapshot:
        """One simulated reading of every device, stamped ``at`` (the caller's clock)."""
        holders = self.pids_of()
        uptime = self._uptime_ticks()
        utilization: dict[str, float | None] = {}
        for device in self._devices:
            utilization[device.uuid] = self._utilization(
                device.uuid, holders.get(device.uuid, ()), at, uptime
            )
        by_uuid = {d.uuid: d for d in self._devices}
        samples: list[Sample] = []
        for node, gpu in self._gpus:
            board = self._gpu_sample(node, gpu, utilization, by_uuid, at)
            samples.append(board)
            for instance in gpu.mig_instances:
                part = by_uuid[instance.uuid]
                util = utilization[instance.uuid]
                samples.append(
                    Sample(
                        uuid=instance.uuid,
                        node=node,
                        gpu_index=gpu.index,
                        mig_profile=instance.profile,
                        time=at,
                        gpu_utilization=util,
                        memory_utilization=None if util is None else round(util * 0.6, 1),
                        memory_used_mib=round(self._memory_of(part, util), 1),
                        memory_total_mib=float(instance.memory_mib),
                        temperature_c=board.temperature_c,  # the instances share their GPU's die
                        sm_clock_mhz=board.sm_clock_mhz,
                        xid_errors=(),
                    )
                )
        return Snapshot(at, tuple(samples), simulated=True, backend=self.backend)

    def _gpu_sample(
        self,
        node: str,
        gpu: Gpu,
        utilization: Mapping[str, float | None],
        by_uuid: Mapping[str, _Device],
        at: float,
    ) -> Sample:
        """The board's reading: a GPU in MIG mode has no utilisation of its own, but its instances' load
        drives its power, temperature and clock."""
        limit, boost = _BOARD.get(gpu.product, _DEFAULT_BOARD)
        if gpu.mode is GpuMode.MIG:
            parts = [by_uuid[i.uuid] for i in gpu.mig_instances]
            load = sum((utilization[p.uuid] or 0.0) * p.compute_share for p in parts)
            own_util: float | None = None
            memory_used = sum(self._memory_of(p, utilization[p.uuid]) for p in parts)
        else:
            own_util = utilization[gpu.uuid]
            load = own_util or 0.0
            memory_used = self._memory_of(by_uuid[gpu.uuid], own_util)
        power = limit * (0.1 + 0.9 * min(load, 100.0) / 100)
        temperature = self._warm(gpu.uuid, _AMBIENT_C + 50 * power / limit - 5)
        clock = boost if load > 0.5 else _IDLE_CLOCK_MHZ
        return Sample(
            uuid=gpu.uuid,
            node=node,
            gpu_index=gpu.index,
            mig_profile=None,
            time=at,
            gpu_utilization=own_util,
            memory_utilization=None if own_util is None else round(own_util * 0.6, 1),
            memory_used_mib=round(memory_used, 1),
            memory_total_mib=float(gpu.memory_mib),
            temperature_c=round(temperature, 1),
            power_w=round(power, 1),
            power_limit_w=float(limit),
            sm_clock_mhz=float(clock),
            ecc_corrected=0,
            ecc_uncorrected=0,
            xid_errors=self._reported_xids(gpu.uuid),
        )

    def _reported_xids(self, uuid: str) -> tuple[int, ...]:
        with self._xids_lock:
            return tuple(self._xids.pop(uuid, ()))

    # ---- the model --------------------------------------------------------------------------------------

    def _utilization(self, uuid: str, pids: Collection[int], at: float, uptime: float) -> float | None:
        """Percent from the CPU the device's processes used since the previous sample; None on the first
        sample of a held device (no interval yet), 0 for a device nobody holds."""
        if not pids:
            self._trees.pop(uuid, None)
            return 0.0
        ticks = self._tree_ticks(pids)
        before = self._trees.get(uuid)
        self._trees[uuid] = _Tree(ticks, at, uptime)
        if before is None or at <= before.at:
            return None
        used = 0
        for key, now in ticks.items():
            if key in before.ticks:
                used += max(0, now - before.ticks[key])
            elif key[1] >= before.uptime_ticks:  # born since the previous sample: all its time is new
                used += now
        cores = used / self._tick / (at - before.at)
        return round(min(100.0, 100.0 * cores), 1)

    def _memory_of(self, device: _Device, util: float | None) -> float:
        """Memory in use: grows with activity and stays while anyone holds the device."""
        if device.uuid not in self._trees:
            self._memory.pop(device.uuid, None)
            return 0.0
        wanted = device.memory_total_mib * (0.02 + 0.5 * (util or 0.0) / 100)
        memory = max(self._memory.get(device.uuid, 0.0), wanted)
        self._memory[device.uuid] = memory
        return memory

    def _warm(self, uuid: str, steady: float) -> float:
        now = self._temperature.get(uuid, steady)
        now += (steady - now) * _TEMPERATURE_LAG
        self._temperature[uuid] = now
        return now

    # ---- /proc ------------------------------------------------------------------------------------------

    def _tree_ticks(self, roots: Collection[int]) -> dict[tuple[int, int], int]:
        """CPU ticks (user + system, and of reaped children) of every process in the trees under ``roots``,
        each counted once, by (pid, start time) so a reused pid is a new process."""
        seen: dict[tuple[int, int], int] = {}
        pids, todo = set(), list(roots)
        while todo:
            pid = todo.pop()
            if pid in pids:
                continue
            pids.add(pid)
            stat = _read_stat(self.proc / str(pid) / "stat")
            if stat is None:
                continue
            seen[(pid, stat[1])] = stat[0]
            todo.extend(self._children(pid))
        return seen

    def _children(self, pid: int) -> list[int]:
        found: list[int] = []
        try:
            tasks = list((self.proc / str(pid) / "task").iterdir())
        except OSError:
            return found
        for task in tasks:
            try:
                found.extend(int(p) for p in (task / "children").read_text().split())
            except (OSError, ValueError):
                continue
        return found

    def _uptime_ticks(self) -> float:
        try:
            return float((self.proc / "uptime").read_text().split()[0]) * self._tick
        except (OSError, ValueError, IndexError):
            return float("inf")  # unknown: newcomers count from their first sample, never in full


def pids_by_visible_devices(uuids: Collection[str], proc: str | Path = "/proc") -> dict[str, set[int]]:
    """Processes pinned to each device: those whose ``CUDA_VISIBLE_DEVICES`` (or ``NVIDIA_VISIBLE_DEVICES``)
    names it. Processes of other users, whose environment cannot be read, are skipped."""
    wanted = set(uuids)
    found: dict[str, set[int]] = {}
    for entry in Path(proc).iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        for match in _VISIBLE.finditer(environ):
            for uuid in match.group(1).decode(errors="replace").split(","):
                if uuid.strip() in wanted:
                    found.setdefault(uuid.strip(), set()).add(int(entry.name))
    return found


def _read_stat(path: Path) -> tuple[int, int] | None:
    """(utime + stime + cutime + cstime, start time) in clock ticks, or None for a process that is gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the name in parentheses may hold spaces
    try:
        return sum(int(f) for f in fields[11:15]), int(fields[19])
    except (ValueError, IndexError):
        return None
