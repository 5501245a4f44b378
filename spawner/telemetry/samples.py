"""One reading of one device (a whole GPU or a MIG instance), and one pass of a sampler over a node.

Every metric may be None, which means "not available" (NVML cannot say, the GPU does not support it, the
driver refused): never a fake 0, so an idle-looking slice is really idle and a "N/A" is shown as such.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

_PERCENT_FIELDS = ("gpu_utilization", "memory_utilization")
_NON_NEGATIVE_FIELDS = (
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "ecc_corrected",
    "ecc_uncorrected",
)


@dataclass(frozen=True)
class Sample:
    """What one device reported at ``time`` (seconds since the epoch, from the caller's clock).

    ``gpu_index`` is the physical GPU's index on its node (a MIG instance's parent GPU); ``mig_profile`` is
    None for a whole GPU. ``xid_errors`` lists the XID codes reported since the previous sample (None: the
    backend cannot watch for them on this device). ``problems`` says which reads failed for reasons other
    than "not supported", for the health checks to judge.
    """

    uuid: str
    node: str
    gpu_index: int
    mig_profile: str | None
    time: float
    gpu_utilization: float | None = None  # percent, 0-100
    memory_utilization: float | None = None  # percent of the memory controller's (or DRAM bandwidth's) time
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    ecc_corrected: int | None = None  # volatile counts since the driver loaded
    ecc_uncorrected: int | None = None
    xid_errors: tuple[int, ...] | None = None
    problems: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.uuid:
            raise ValueError("uuid: a sample needs the device's UUID")
        if self.gpu_index < 0:
            raise ValueError(f"gpu_index: must be 0 or more, got {self.gpu_index} for {self.uuid}")
        for name in _PERCENT_FIELDS:
            value = getattr(self, name)
            if value is not None and not (0 <= value <= 100):
                raise ValueError(f"{name}: a percentage from 0 to 100, got {value} for {self.uuid}")
        for name in _NON_NEGATIVE_FIELDS:
            value = getattr(self, name)
            if value is not None and (value < 0 or math.isnan(value)):
                raise ValueError(f"{name}: must be 0 or more, got {value} for {self.uuid}")

    @property
    def is_mig(self) -> bool:
        return self.mig_profile is not None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; None stays null ("not available")."""
        data = asdict(self)
        data["xid_errors"] = list(self.xid_errors) if self.xid_errors is not None else None
        data["problems"] = list(self.problems)
        return data


@dataclass(frozen=True)
class Snapshot:
    """One pass of a sampler: a sample of every device it watches, all taken at about ``time``.

    ``simulated`` is True when the numbers are of simulated GPUs (a pool file's, ``gpupool kube up``'s), so no
    page or metric can pass them off as hardware readings.
    """

    time: float
    samples: tuple[Sample, ...]
    simulated: bool
    backend: str
