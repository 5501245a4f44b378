"""Software in placement: a profile may need a least CUDA version and compute capability, and gets only GPUs
whose driver and architecture have them; a refusal says which GPU falls short and why.

From the researcher's-day review's build list: GPUs differ in driver and compute capability, not only model
and memory. On the demo pool the A100 box runs driver 535 (CUDA 12.2 at most), the H100 box driver 550
(12.4).
"""

from __future__ import annotations

import pytest
import yaml
from fake_pynvml import a100_40gb, fake_pynvml
from kube_cluster import load_fixture

from gpupool.spawner.backends.nvml import discover_node
from gpupool.spawner.backends.simulated import DEMO_POOL, load_pool_file
from gpupool.spawner.files.profiles_file import parse_profiles
from gpupool.spawner.kube.labels import parse_node
from gpupool.spawner.pool.profiles import ProfileError, fits_pool
from gpupool.spawner.pool.requests import Request, WholeGpus
from gpupool.spawner.pool.software import Software, cuda_of_driver
from gpupool.spawner.pool.state import Allocation, PoolState

NODES = load_pool_file(DEMO_POOL)


def profiles(gpus: str) -> object:
    return yaml.safe_load(
        f"profiles:\n  - {{slug: p, display_name: P, cpu: 2, memory: 8GiB, gpus: {gpus}}}\n"
    )


def test_a_driver_supports_the_cuda_of_its_release_notes_row() -> None:
    assert cuda_of_driver("535.104.05") == (12, 2)
    assert cuda_of_driver("550.54.15") == (12, 4)
    assert cuda_of_driver("550.54.13") == (12, 3)  # just below 12.4's minimum driver
    assert cuda_of_driver("470.82.01") is None and cuda_of_driver("") is None


def test_a_need_for_cuda_12_4_is_placed_on_the_h100s_and_never_on_the_a100s_older_driver() -> None:
    pool = PoolState(NODES, "first-fit")
    big = frozenset({"H100-80GB", "A100-40GB"})
    need = Request(1000, 1024, WholeGpus(1, big, software=Software(min_cuda="12.4")))
    for n in range(6):  # the six whole H100s; the four A100s sit free, their driver too old
        placed = pool.place(need, f"lease-{n}")
        assert isinstance(placed, Allocation) and placed.node == "dgx-h100-01", placed
    refused = pool.place(need, "lease-7")
    assert not isinstance(refused, Allocation) and not refused.never_fits


def test_a_profile_no_gpu_can_run_says_which_driver_or_architecture_falls_short() -> None:
    (cuda,) = parse_profiles(profiles('{count: 1, products: [A100-40GB], min_cuda: "12.4"}'), "profiles.yaml")
    assert fits_pool(cuda, NODES) == (
        "needs CUDA 12.4; the A100-40GB's driver 535.104.05 supports up to 12.2 (on a100-01)"
    )
    (fp8,) = parse_profiles(profiles("{count: 1, products: [A100-40GB], min_compute_capability: 8.9}"), "p")
    assert fits_pool(fp8, NODES) == "needs compute capability 8.9; A100-40GB has 8.0 (on a100-01)"
    (fine,) = parse_profiles(profiles("{count: 1, min_cuda: 12.4, min_compute_capability: 9.0}"), "p")
    assert fits_pool(fine, NODES) is None


def test_a_bad_version_in_the_profiles_file_names_the_field() -> None:
    with pytest.raises(
        ProfileError, match=r"profile p: gpus.min_cuda must be a version such as 12.4, got 'new'"
    ):
        parse_profiles(profiles('{count: 1, min_cuda: "new"}'), "profiles.yaml")


def test_nvml_and_gpu_feature_discovery_report_the_cuda_version_the_driver_supports() -> None:
    node = discover_node(
        "host", nvml=fake_pynvml([a100_40gb()], cuda=12020), cpu_milli=8000, memory_mib=65536
    )
    assert node.gpus[0].cuda_version == "12.2"
    kube = parse_node(load_fixture("a100-40gb")).node
    assert {g.cuda_version for g in kube.gpus} == {"12.2"}
