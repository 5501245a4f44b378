"""Starting NVML and reading it, for discovery and telemetry alike: every way NVML fails to start becomes one
readable error, and a failing call on one GPU is recorded against that GPU instead of raised."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..pool.devices import Health

# Every part of the NVML backend logs as the backend: the one logger an operator turns up.
log = logging.getLogger(f"{__package__}.nvml")

MIB = 2**20


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host (no driver, driver not loaded, no pynvml); the message says which."""


def start(nvml: ModuleType | None) -> ModuleType:
    """Import pynvml (unless given) and initialise it; every way this fails becomes one readable error."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError as error:
            raise NvmlUnavailable(
                f"The nvidia-ml-py package (module pynvml) is not installed: {error}; "
                "install it with `pip install nvidia-ml-py`"
            ) from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound as error:
        raise NvmlUnavailable(f"No NVIDIA driver found (libnvidia-ml.so is missing): {error}") from None
    except nvml.NVMLError_DriverNotLoaded as error:
        raise NvmlUnavailable(f"The NVIDIA driver is installed but not loaded: {error}") from None
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML could not start: {error}") from None
    return nvml


def stop(nvml: ModuleType) -> None:
    """Shut NVML down; a failure here must not hide what discovery found, so it is only logged."""
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as error:
        log.warning("nvmlShutdown failed: %s", error)


@dataclass
class Probe:
    """Reads one GPU call by call, recording failures (the GPU is then unhealthy) instead of raising them."""

    nvml: ModuleType
    label: str
    problems: list[str] = field(default_factory=list)
    lost: bool = False

    def read(self, what: str, call: Callable[..., Any], *args: Any, optional: bool = False) -> Any:
        """``call(*args)``, or None when it fails; ``optional`` calls may be NotSupported without harm."""
        if self.lost:
            return None
        try:
            return call(*args)
        except self.nvml.NVMLError_NotSupported as error:
            if not optional:
                self.problems.append(f"{what}: {error}")
        except self.nvml.NVMLError_GpuIsLost as error:
            self.lost = True
            self.problems.append(f"{what}: {error}")
        except self.nvml.NVMLError as error:
            self.problems.append(f"{what}: {error}")
        return None

    def health(self) -> Health:
        """The verdict once every read is done: any failure makes the GPU unhealthy, and says why."""
        if self.problems:
            log.warning("%s is unhealthy: %s", self.label, "; ".join(self.problems))
        return Health.UNHEALTHY if self.problems else Health.HEALTHY


def gpu_count(nvml: ModuleType) -> int:
    try:
        return int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML started but could not count the GPUs: {error}") from None


def text(value: object) -> str:
    """NVML strings: str from nvidia-ml-py >= 11.515, bytes from older releases, None when unread."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
