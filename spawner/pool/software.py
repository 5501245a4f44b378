"""What a server or job needs of a GPU beyond its model and memory: compute capability and CUDA version.

GPUs differ in software as well as hardware: a PyTorch build for CUDA 12.4 does not run where the driver
supports only CUDA 12.2, and FP8 kernels need compute capability 8.9. A profile (or one of its environments)
may say ``min_cuda`` and ``min_compute_capability``; placement then skips GPUs that fall short, and a
refusal says which and why.

The CUDA version a driver supports is what NVML reports (``nvmlSystemGetCudaDriverVersion``, the "CUDA
Version" of ``nvidia-smi``) and what GPU Feature Discovery labels (``nvidia.com/cuda.runtime.*``); where only
the driver's version is known, the minimum Linux driver of each CUDA release (NVIDIA's CUDA Toolkit release
notes) gives it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .devices import Gpu

# (CUDA major, minor, the minimum Linux x86_64 driver of its first release), newest first
_CUDA_DRIVERS = (
    (12, 8, (570, 26)),
    (12, 6, (560, 28, 3)),
    (12, 5, (555, 42, 2)),
    (12, 4, (550, 54, 14)),
    (12, 3, (545, 23, 6)),
    (12, 2, (535, 54, 3)),
    (12, 1, (530, 30, 2)),
    (12, 0, (525, 60, 13)),
    (11, 8, (520, 61, 5)),
)
_VERSION = re.compile(r"\d+(\.\d+)*")


def version(text: str) -> tuple[int, ...] | None:
    """``"12.4"`` as ``(12, 4)``, ``"535.104.05"`` as ``(535, 104, 5)``; None when it is not a version."""
    text = text.strip()
    return tuple(int(part) for part in text.split(".")) if _VERSION.fullmatch(text) else None


def cuda_of_driver(driver: str) -> tuple[int, int] | None:
    """The newest CUDA a Linux driver of version ``driver`` supports, from the release notes' table."""
    found = version(driver)
    if found is None:
        return None
    return next(((major, minor) for major, minor, least in _CUDA_DRIVERS if found >= least), None)


def supported_cuda(gpu: Gpu) -> tuple[int, int] | None:
    """The CUDA version ``gpu``'s driver supports: as reported, else from its driver version."""
    reported = version(gpu.cuda_version)
    if reported is not None and len(reported) >= 2:
        return reported[0], reported[1]
    return cuda_of_driver(gpu.driver_version)


def _shown(parts: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in parts)


@dataclass(frozen=True)
class Software:
    """The least CUDA version (``"12.4"``) and compute capability (``"8.9"``) a server or job needs; empty
    means any."""

    min_cuda: str = ""
    min_compute_capability: str = ""

    def __post_init__(self) -> None:
        for field, example in (("min_cuda", "12.4"), ("min_compute_capability", "8.9")):
            value = getattr(self, field)
            if value and version(value) is None:
                raise ValueError(f"{field} must be a version such as {example}, got {value!r}")

    def __bool__(self) -> bool:
        return bool(self.min_cuda or self.min_compute_capability)

    def refusal(self, gpu: Gpu) -> str | None:
        """Why ``gpu`` cannot run it (``needs CUDA 12.4; driver 535.104.05 supports up to 12.2``), or None."""
        if self.min_compute_capability:
            have = version(gpu.compute_capability)
            wanted = version(self.min_compute_capability)
            if have is None or (wanted is not None and have < wanted):
                shown = gpu.compute_capability or "an unknown one"
                return f"needs compute capability {self.min_compute_capability}; {gpu.product} has {shown}"
        if self.min_cuda:
            cuda, wanted = supported_cuda(gpu), version(self.min_cuda)
            if cuda is None or (wanted is not None and cuda < wanted):
                driver = f"driver {gpu.driver_version}" if gpu.driver_version else "an unknown driver"
                upto = f"supports up to {_shown(cuda)}" if cuda else "reports no CUDA version"
                return f"needs CUDA {self.min_cuda}; the {gpu.product}'s {driver} {upto}"
        return None


ANY_SOFTWARE = Software()
