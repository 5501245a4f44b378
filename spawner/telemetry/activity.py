"""GPU activity: when each device was last busy, for the idle policy (GPU-aware culling).

The sample history (:mod:`.history`) keeps only a 10-minute window, while a profile's ``gpu_idle_timeout`` is
often 30 minutes or more, so the tracker folds samples into three timestamps per device that outlive the
window: when it was last above the threshold, when its current unbroken run of readings began, and its
latest reading. A device with no reading ("not available", a sampler that stopped, a stale last sample) is
*unknown*, never idle: the culler must not stop a server whose GPU nobody can see.

Pure: no clock, no I/O. The service folds its history in and asks with its own ``now``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from .history import SampleHistory
from .samples import Sample

DEFAULT_THRESHOLD_PERCENT = 10.0


class GpuState(StrEnum):
    BUSY = "busy"  # some device of the lease is above the threshold now
    IDLE = "idle"  # every device is readable and at or below the threshold
    UNKNOWN = "unknown"  # some device has no fresh reading: treat as "cannot say", never as idle
    NONE = "none"  # the lease holds no device (a CPU-only profile)


@dataclass
class _Device:
    known_since: float | None = None  # start of the current run of readings (reset by a "not available")
    last_known: float | None = None
    last_busy: float | None = None
    current: float | None = None  # the newest reading, percent; None: not available
    seen_until: float = float("-inf")  # newest sample folded in


@dataclass(frozen=True)
class GpuActivity:
    """What a set of devices (one lease's) has been doing: ``idle_seconds`` since every device was last above
    the threshold (0 when busy, None when unknown or none)."""

    state: GpuState
    idle_seconds: float | None
    last_busy_at: float | None


class ActivityTracker:
    """Per-device "last busy" bookkeeping, fed from samples; ``threshold`` is a utilisation percent."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD_PERCENT) -> None:
        if not 0 <= threshold < 100:
            raise ValueError(f"threshold: a utilisation percent from 0 to under 100, got {threshold}")
        self.threshold = threshold
        self._devices: dict[str, _Device] = {}

    def observe(self, sample: Sample) -> None:
        """Fold one sample in; samples of a device must come oldest first (older ones are ignored)."""
        device = self._devices.setdefault(sample.uuid, _Device())
        if sample.time <= device.seen_until:
            return
        device.seen_until = sample.time
        util = sample.gpu_utilization
        device.current = util
        if util is None:
            device.known_since = None
            return
        if device.known_since is None:
            device.known_since = sample.time
        device.last_known = sample.time
        if util > self.threshold:
            device.last_busy = sample.time

    def fold(self, history: SampleHistory) -> None:
        """Fold in every sample of ``history`` not seen yet."""
        for uuid in history.devices():
            seen = self._devices[uuid].seen_until if uuid in self._devices else None
            for sample in history.recent(uuid, seen):
                self.observe(sample)

    def activity(
        self, uuids: Collection[str], *, since: float, now: float, stale_after: float
    ) -> GpuActivity:
        """The activity of ``uuids`` held since ``since`` (the lease's grant: idleness before it was someone
        else's). A reading older than ``stale_after`` seconds counts as none."""
        if not uuids:
            return GpuActivity(GpuState.NONE, None, None)
        idle_since: list[float] = []
        busy_at: list[float] = []
        unknown = False
        for uuid in uuids:
            device = self._devices.get(uuid)
            if device is not None and device.last_busy is not None and device.last_busy >= since:
                busy_at.append(device.last_busy)
            if (
                device is None
                or device.current is None
                or device.known_since is None
                or device.last_known is None
                or now - device.last_known > stale_after
            ):
                unknown = True
                continue
            if device.current > self.threshold:
                return GpuActivity(GpuState.BUSY, 0.0, device.last_busy)
            idle_since.append(max(since, device.known_since, device.last_busy or since))
        last_busy = max(busy_at) if busy_at else None
        if unknown:
            return GpuActivity(GpuState.UNKNOWN, None, last_busy)
        return GpuActivity(GpuState.IDLE, max(0.0, now - max(idle_since)), last_busy)
