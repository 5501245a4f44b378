"""Every spelling of a GPU product that NVML, GPU Feature Discovery or a person uses maps to one name."""

from __future__ import annotations

import pytest

from gpupool.spawner.pool.products import UnknownProduct, normalize_product


@pytest.mark.parametrize(
    ("raw", "memory_mib", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", None, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-80GB"),
        ("NVIDIA H100 NVL", 95830, "H100-NVL-94GB"),
        ("NVIDIA A100-SXM4-40GB", None, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", None, "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", None, "A100-40GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA GH200 480GB", 97871, "GH200-96GB"),
        ("NVIDIA B200", 183359, "B200-180GB"),
        ("NVIDIA A30", 24576, "A30-24GB"),
        ("NVIDIA L4", 23034, "L4-24GB"),
        ("Tesla T4", 15360, "T4-16GB"),
        ("Tesla V100-SXM2-32GB", None, "V100-32GB"),
        ("NVIDIA-H100-80GB-HBM3", None, "H100-80GB"),
        ("NVIDIA-A100-SXM4-40GB", None, "A100-40GB"),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", None, "H100-80GB"),
        ("NVIDIA-H200", None, "H200-141GB"),
        ("H100-80GB", None, "H100-80GB"),
        ("a100-40gb", None, "A100-40GB"),
        ("H200", None, "H200-141GB"),
    ],
)
def test_spellings_normalise_to_one_product(raw: str, memory_mib: int | None, expected: str) -> None:
    assert normalize_product(raw, memory_mib) == expected


def test_unknown_product_lists_the_known_ones() -> None:
    with pytest.raises(
        UnknownProduct, match=r"unknown GPU product 'Radeon 7900'; known products are A10-24GB"
    ):
        normalize_product("Radeon 7900")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("A100-96GB", "unknown GPU product 'A100-96GB': A100 comes in 40 GB and 80 GB, not 96 GB"),
        ("H200-96GB", "unknown GPU product 'H200-96GB': H200 comes in 141 GB, not 96 GB"),
        (
            "A100",
            "GPU product 'A100' is ambiguous: A100 comes in 40 GB and 80 GB; say A100-40GB or A100-80GB",
        ),
    ],
)
def test_a_near_miss_is_refused_rather_than_read_as_another_gpu(raw: str, message: str) -> None:
    with pytest.raises(UnknownProduct) as caught:
        normalize_product(raw)
    assert str(caught.value) == message
