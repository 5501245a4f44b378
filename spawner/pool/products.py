"""The GPU products gpupool knows, and turning any spelling of a product name into one of them.

NVML, GPU Feature Discovery and people each spell a product differently (``NVIDIA H100 80GB HBM3``,
``NVIDIA-H100-80GB-HBM3``, ``H100-80GB``). Everything else in the pool speaks the canonical short name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Product:
    """A GPU product: its canonical name, memory and whether (and how) it splits into MIG instances."""

    name: str
    memory_gb: int

    @property
    def memory_mib(self) -> int:
        return self.memory_gb * 1024


PRODUCTS: dict[str, Product] = {
    p.name: p
    for p in (
        Product("A100-40GB", 40),
        Product("A100-80GB", 80),
        Product("H100-80GB", 80),
        Product("H100-NVL-94GB", 94),
        Product("GH200-96GB", 96),
        Product("H200-141GB", 141),
        Product("B200-180GB", 180),
        Product("A30-24GB", 24),
        Product("L4-24GB", 24),
        Product("L40S-48GB", 48),
        Product("A10-24GB", 24),
        Product("T4-16GB", 16),
        Product("V100-16GB", 16),
        Product("V100-32GB", 32),
    )
}

# Family -> the memory sizes it ships in. The first matching family wins, so longer names come first.
_FAMILIES: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("GH200", (96,)),
    ("H200", (141,)),
    ("H100", (80, 94)),
    ("B200", (180,)),
    ("A100", (40, 80)),
    ("A30", (24,)),
    ("L40S", (48,)),
    ("L4", (24,)),
    ("A10", (24,)),
    ("T4", (16,)),
    ("V100", (16, 32)),
)


def marketed_gb_to_mib(gb: float) -> int:
    """MiB in ``gb`` decimal gigabytes, the unit GPU names use: an "80GB" H100 reports 81,559 MiB to NVML,
    less than 80 × 1024, so a minimum of "80 GB" must mean 76,294 MiB to accept it."""
    return round(gb * 1e9 / 2**20)


def mib_to_marketed_gb(mib: int) -> float:
    """The inverse of :func:`marketed_gb_to_mib`, for messages."""
    return round(mib * 2**20 / 1e9, 1)


class UnknownProduct(ValueError):
    """A product name that matches no GPU gpupool knows."""


class UnknownSize(UnknownProduct):
    """A known GPU family with a memory size it does not come in, or none where it comes in several: a
    mistake, where a name of no known family may be a site's own model label."""


def normalize_product(raw: str, memory_mib: int | None = None) -> str:
    """Return the canonical product name for any NVML, GPU Feature Discovery or short spelling.

    ``memory_mib`` (as NVML reports it) settles the memory size when the name leaves it out,
    as ``NVIDIA H100 PCIe`` or ``NVIDIA H200`` do.

    >>> normalize_product("NVIDIA A100-SXM4-40GB")
    'A100-40GB'
    >>> normalize_product("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb")
    'H100-80GB'
    """
    if raw in PRODUCTS:
        return raw
    text = raw.upper().replace("_", "-").replace(" ", "-")
    text = re.sub(r"-MIG-.*$", "", text)  # GFD single strategy appends the slice profile
    text = re.sub(r"^(NVIDIA-|TESLA-)+", "", text)
    tokens = [t for t in text.split("-") if t]
    for family, sizes in _FAMILIES:
        if family not in tokens:
            continue
        if family == "H100" and "NVL" in tokens:
            return "H100-NVL-94GB"
        size = _size(raw, family, tokens, sizes, memory_mib)
        if family == "H100" and size == 94:
            return "H100-NVL-94GB"
        return f"{family}-{size}GB"
    raise UnknownProduct(f"unknown GPU product {raw!r}; known products are {', '.join(sorted(PRODUCTS))}")


def _size(raw: str, family: str, tokens: list[str], sizes: tuple[int, ...], memory_mib: int | None) -> int:
    """The memory size of a ``family`` GPU, from its name or else from NVML; never a silent guess."""
    stated = [int(m.group(1)) for t in tokens if (m := re.fullmatch(r"(\d+)(?:GB)?", t))]
    known = [size for size in stated if size in sizes]
    if known:
        return known[0]
    if memory_mib:  # NVML names may leave the size out ("NVIDIA H200") or count more ("GH200 480GB")
        size = _closest(memory_mib / 1024, sizes)
        if size is not None:
            return size
        stated = [round(memory_mib / 1024)]
    kinds = " and ".join(f"{s} GB" for s in sizes)
    if stated:
        raise UnknownSize(f"unknown GPU product {raw!r}: {family} comes in {kinds}, not {stated[0]} GB")
    if len(sizes) > 1 and family != "H100":  # an H100 without "NVL" is the 80 GB part
        raise UnknownSize(
            f"GPU product {raw!r} is ambiguous: {family} comes in {kinds}; "
            f"say {' or '.join(f'{family}-{s}GB' for s in sizes)}"
        )
    return sizes[0]


def _closest(gb: float, sizes: tuple[int, ...]) -> int | None:
    # NVML reports a little less than the marketed size (an L4 "24GB" shows 22.5 GiB); 10% covers that.
    size = min(sizes, key=lambda size: abs(size - gb))
    return size if abs(size - gb) <= 0.1 * size else None


def canonical_product(raw: str) -> str:
    """The canonical name of a known product, or ``raw`` unchanged: sites may label their own models."""
    try:
        return normalize_product(raw)
    except UnknownProduct:
        return raw
