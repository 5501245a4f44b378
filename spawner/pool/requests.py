"""What a user asks the pool for: CPU and memory, plus whole GPUs, a MIG slice, a share of a GPU, or no GPU."""

from __future__ import annotations

from dataclasses import dataclass

from .devices import FULL_MILLI
from .products import canonical_product
from .software import ANY_SOFTWARE, Software


class InvalidRequest(ValueError):
    """A request that can never be valid, whatever the pool holds; the message names the field."""


def _canonical(products: frozenset[str]) -> frozenset[str]:
    # "NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3" and "H100-80GB" must all match an H100-80GB.
    return frozenset(canonical_product(p) for p in products)


@dataclass(frozen=True)
class WholeGpus:
    """``count`` whole GPUs on one node, preferably NVLinked together."""

    count: int
    products: frozenset[str] = frozenset()  # allowed products; empty allows any
    min_memory_mib: int = 0
    software: Software = ANY_SOFTWARE  # least CUDA version and compute capability

    def __post_init__(self) -> None:
        if self.count < 1:
            raise InvalidRequest(f"gpus.count must be at least 1, got {self.count}")
        if self.min_memory_mib < 0:
            raise InvalidRequest(f"gpus.min_memory_mib must not be negative, got {self.min_memory_mib}")
        object.__setattr__(self, "products", _canonical(self.products))


@dataclass(frozen=True)
class MigSlice:
    """One MIG instance: a named profile (``3g.40gb``) or any profile with at least ``min_memory_gb``."""

    profile: str | None = None
    min_memory_gb: int | None = None
    products: frozenset[str] = frozenset()
    software: Software = ANY_SOFTWARE

    def __post_init__(self) -> None:
        if (self.profile is None) == (self.min_memory_gb is None):
            raise InvalidRequest("mig needs exactly one of mig.profile or mig.min_memory_gb")
        if self.min_memory_gb is not None and self.min_memory_gb < 1:
            raise InvalidRequest(f"mig.min_memory_gb must be at least 1, got {self.min_memory_gb}")
        if self.profile is not None:
            object.__setattr__(self, "profile", self.profile.strip().lower())  # "3g.40GB" is 3g.40gb
        object.__setattr__(self, "products", _canonical(self.products))


@dataclass(frozen=True)
class GpuShare:
    """A fraction of one time-shared GPU, in thousandths (``milli``), with an optional memory cap."""

    milli: int
    memory_mib: int = 0
    products: frozenset[str] = frozenset()
    software: Software = ANY_SOFTWARE

    def __post_init__(self) -> None:
        if not 0 < self.milli < FULL_MILLI:
            raise InvalidRequest(
                f"share.milli must be between 1 and {FULL_MILLI - 1} (a whole GPU is gpus.count), "
                f"got {self.milli}"
            )
        if self.memory_mib < 0:
            raise InvalidRequest(f"share.memory_mib must not be negative, got {self.memory_mib}")
        object.__setattr__(self, "products", _canonical(self.products))


GpuNeed = WholeGpus | MigSlice | GpuShare


@dataclass(frozen=True)
class Request:
    """Everything one server or job needs from a single node."""

    cpu_milli: int
    memory_mib: int
    gpu: GpuNeed | None = None
    # how long it expects to hold what it gets (a user's wall-time, else the profile's limit): what the
    # queue's expected starts and backfill go by; None when nothing says (the pool then promises no time)
    seconds: int | None = None

    def __post_init__(self) -> None:
        if self.seconds is not None and self.seconds < 1:
            raise InvalidRequest(f"seconds must be at least 1, got {self.seconds}")
        if self.cpu_milli < 0:
            raise InvalidRequest(f"cpu_milli must not be negative, got {self.cpu_milli}")
        if self.memory_mib < 0:
            raise InvalidRequest(f"memory_mib must not be negative, got {self.memory_mib}")

    @property
    def gpu_milli(self) -> int:
        """Whole-GPU and shared capacity asked for, in thousandths of a GPU (a MIG slice counts 0: it is its own kind)."""
        if isinstance(self.gpu, WholeGpus):
            return self.gpu.count * FULL_MILLI
        if isinstance(self.gpu, GpuShare):
            return self.gpu.milli
        return 0


def describe(request: Request) -> str:
    """What a queued request waits for, as in ``Waiting for a free …``."""
    need = request.gpu
    if need is None:
        return f"node with {request.cpu_milli / 1000:g} CPUs and {request.memory_mib / 1024:g} GiB of memory"
    products = " or ".join(sorted(need.products))
    if isinstance(need, WholeGpus):
        what = products or "GPU"
        return what if need.count == 1 else f"set of {need.count} × {what}"
    if isinstance(need, MigSlice):
        name = (
            f"MIG {need.profile} slice" if need.profile else f"MIG slice of at least {need.min_memory_gb} GB"
        )
        return f"{name} on {products}" if products else name
    return f"{need.milli / 10:g}% share of {products or 'a GPU'}"
