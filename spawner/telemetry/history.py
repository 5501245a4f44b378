"""Recent samples in memory: a ring buffer per device, long enough for a 10-minute sparkline.

Older samples fall off the end; what outlives them is the per-minute aggregate (:mod:`.aggregates`). Not
thread-safe: the service adds and reads on its event loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from .samples import Sample, Snapshot

DEFAULT_WINDOW_SECONDS = 600.0
DEFAULT_INTERVAL_SECONDS = 2.0


class SampleHistory:
    """The last ``window_seconds / interval_seconds`` samples of every device, newest last."""

    def __init__(
        self,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
    ) -> None:
        if not window_seconds > 0:
            raise ValueError(f"window_seconds: must be more than 0, got {window_seconds}")
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds: must be more than 0, got {interval_seconds}")
        self.window_seconds = window_seconds
        self.interval_seconds = interval_seconds
        self.capacity = max(1, round(window_seconds / interval_seconds))
        self._buffers: dict[str, deque[Sample]] = {}
        self._xid_totals: dict[str, int] = {}
        self.simulated: bool | None = None  # unknown until the first snapshot
        self.backend: str | None = None
        self.last_time: float | None = None

    def add(self, snapshot: Snapshot) -> None:
        """Keep a sampler's pass; a device seen for the first time gets its own buffer."""
        self.simulated, self.backend, self.last_time = snapshot.simulated, snapshot.backend, snapshot.time
        for sample in snapshot.samples:
            self.add_sample(sample)

    def add_sample(self, sample: Sample) -> None:
        buffer = self._buffers.get(sample.uuid)
        if buffer is None:
            buffer = self._buffers[sample.uuid] = deque(maxlen=self.capacity)
        buffer.append(sample)
        if sample.xid_errors:
            self._xid_totals[sample.uuid] = self._xid_totals.get(sample.uuid, 0) + len(sample.xid_errors)

    def devices(self) -> list[str]:
        """UUIDs of every device that has samples, in the order first seen."""
        return list(self._buffers)

    def recent(self, uuid: str, since: float | None = None) -> list[Sample]:
        """The device's samples, oldest first; only those taken after ``since`` when given."""
        buffer = self._buffers.get(uuid, ())
        return [s for s in buffer if s.time > since] if since is not None else list(buffer)

    def latest(self, uuid: str) -> Sample | None:
        buffer = self._buffers.get(uuid)
        return buffer[-1] if buffer else None

    def latest_all(self, uuids: Iterable[str] | None = None) -> dict[str, Sample]:
        """The newest sample of each device (of ``uuids`` when given) that has one."""
        wanted = self._buffers if uuids is None else uuids
        return {u: self._buffers[u][-1] for u in wanted if self._buffers.get(u)}

    def xid_total(self, uuid: str) -> int:
        """XID errors seen on the device since the service started (a counter, for Prometheus)."""
        return self._xid_totals.get(uuid, 0)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop buffers of devices not in ``keep`` (devices gone from the pool)."""
        kept = set(keep)
        for uuid in [u for u in self._buffers if u not in kept]:
            del self._buffers[uuid]
