"""The NVML backend reads this host's GPUs into pool records, against a fake pynvml that mimics the real one."""

from __future__ import annotations

import ast
import inspect
import logging
import os
import re
import socket
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import fake_pynvml as fake_module
import pynvml
import pytest
from fake_pynvml import (
    H100_MIG_BALANCED,
    FakeGpu,
    a100_40gb,
    a100_80gb,
    dgx_h100,
    driver_not_loaded,
    fake_pynvml,
    gpu_lost,
    h100_80gb,
    h200,
    no_library,
    state_of,
)

from gpupool.spawner.backends import nvml as backend
from gpupool.spawner.backends import nvml_access, nvml_mig
from gpupool.spawner.backends.nvml import (
    NvmlUnavailable,
    discover_node,
    mig_profile_for_nvml_id,
    nvml_available,
    read_utilization,
)
from gpupool.spawner.pool.devices import Gpu, GpuMode, Health
from gpupool.spawner.pool.mig import GEOMETRIES, NotMigCapable, Placement, UnknownMigProfile, layout_problem
from gpupool.spawner.pool.requests import MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import Allocation, PoolState

BACKEND_SOURCES = [Path(m.__file__) for m in (backend, nvml_access, nvml_mig)]


def discover(module: ModuleType) -> tuple[Gpu, ...]:
    return discover_node("gpu-host", nvml=module, cpu_milli=64_000, memory_mib=512 * 1024).gpus


def layout(gpu: Gpu) -> list[Placement]:
    return sorted(Placement(m.start, m.profile) for m in gpu.mig_instances)


# ---- whole GPUs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "product", "memory_mib", "capability"),
    [
        (a100_40gb, "A100-40GB", 40960, "8.0"),
        (a100_80gb, "A100-80GB", 81920, "8.0"),
        (h100_80gb, "H100-80GB", 81559, "9.0"),
        (h200, "H200-141GB", 143771, "9.0"),
    ],
)
def test_whole_gpus_get_canonical_products_and_the_memory_nvml_reports(
    preset: Callable[..., FakeGpu], product: str, memory_mib: int, capability: str
) -> None:
    gpus = discover(fake_pynvml([preset(), preset()], driver="550.54.15"))
    assert [g.index for g in gpus] == [0, 1]
    for gpu in gpus:
        assert (gpu.product, gpu.memory_mib, gpu.compute_capability) == (product, memory_mib, capability)
        assert gpu.mode is GpuMode.WHOLE and gpu.mig_instances == ()
        assert gpu.health is Health.HEALTHY
        assert gpu.driver_version == "550.54.15"
        assert gpu.uuid.startswith("GPU-")
    assert gpus[0].uuid != gpus[1].uuid


def test_node_carries_the_given_cpu_memory_and_an_nvml_backend_label() -> None:
    node = discover_node("gpu-host", nvml=dgx_h100(count=2), cpu_milli=64_000, memory_mib=524_288)
    assert (node.name, node.cpu_milli, node.memory_mib) == ("gpu-host", 64_000, 524_288)
    assert node.labels["gpupool.io/backend"] == "nvml"
    assert node.health is Health.HEALTHY


def test_node_defaults_to_the_hostname_and_this_machines_cpus_and_memory() -> None:
    node = discover_node(nvml=fake_pynvml([]))
    assert node.name == socket.gethostname()
    assert node.cpu_milli == (os.cpu_count() or 1) * 1000
    assert node.memory_mib > 0
    assert node.gpus == ()


def test_gpu_of_a_product_gpupool_does_not_know_keeps_the_nvml_name() -> None:
    gpus = discover(
        fake_pynvml([FakeGpu("NVIDIA RTX A6000", 48, mig_capable=False, compute_capability=(8, 6))])
    )
    assert gpus[0].product == "NVIDIA RTX A6000"
    assert gpus[0].mode is GpuMode.WHOLE
    assert gpus[0].health is Health.HEALTHY  # MIG mode NotSupported is normal for a GPU without MIG


def test_strings_as_bytes_from_old_nvidia_ml_py_are_decoded() -> None:
    gpus = discover(fake_pynvml([h100_80gb(["7g.80gb@0"])], driver="535.104.05", legacy_bytes=True))
    assert gpus[0].product == "H100-80GB"
    assert gpus[0].driver_version == "535.104.05"
    assert gpus[0].uuid.startswith("GPU-")
    assert gpus[0].mig_instances[0].uuid.startswith("MIG-")


# ---- MIG ----------------------------------------------------------------------------------------------------


def test_h100_in_mig_mode_lists_its_instances_with_placements() -> None:
    gpus = discover(dgx_h100(H100_MIG_BALANCED, count=2))
    for gpu in gpus:
        assert gpu.mode is GpuMode.MIG
        assert layout(gpu) == [
            Placement(0, "2g.20gb"),
            Placement(2, "1g.10gb"),
            Placement(3, "1g.10gb"),
            Placement(4, "3g.40gb"),
        ]
        assert all(m.uuid.startswith("MIG-") and m.parent_uuid == gpu.uuid for m in gpu.mig_instances)
        assert layout_problem(GEOMETRIES[gpu.product], layout(gpu)) is None
        assert gpu.health is Health.HEALTHY
        ids = [m.gpu_instance_id for m in gpu.mig_instances]  # dcgm-exporter's GPU_I_ID in the metrics
        assert None not in ids and len(set(ids)) == 4
    assert len({m.uuid for g in gpus for m in g.mig_instances}) == 8


@pytest.mark.parametrize(
    ("preset", "mig", "expected"),
    [
        (a100_40gb, ["4g.20gb@0", "3g.20gb@4"], [(0, "4g.20gb"), (4, "3g.20gb")]),
        (
            a100_80gb,
            ["1g.20gb@6", "1g.10gb+me@0", "2g.20gb@2"],
            [(0, "1g.10gb+me"), (2, "2g.20gb"), (6, "1g.20gb")],
        ),
        (h200, ["1g.35gb@0", "1g.18gb@2", "3g.71gb@4"], [(0, "1g.35gb"), (2, "1g.18gb"), (4, "3g.71gb")]),
        (h200, ["7g.141gb@0"], [(0, "7g.141gb")]),
    ],
)
def test_mig_profiles_are_named_for_each_product(
    preset: Callable[..., FakeGpu], mig: list[str], expected: list[tuple[int, str]]
) -> None:
    (gpu,) = discover(fake_pynvml([preset(mig)]))
    assert layout(gpu) == [Placement(start, profile) for start, profile in expected]


def test_mig_instance_memory_is_what_nvml_reports_for_the_instance() -> None:
    (gpu,) = discover(fake_pynvml([h100_80gb(["3g.40gb@0", "3g.40gb@4"])]))
    assert [m.memory_mib for m in gpu.mig_instances] == [81559 * 4 // 8] * 2


def test_empty_mig_slots_are_skipped() -> None:
    (gpu,) = discover(fake_pynvml([h100_80gb(["3g.40gb@0", None, None, "3g.40gb@4"])]))
    assert layout(gpu) == [Placement(0, "3g.40gb"), Placement(4, "3g.40gb")]
    assert gpu.health is Health.HEALTHY


def test_gpu_in_mig_mode_without_instances_is_mig_with_nothing_to_lease() -> None:
    (gpu,) = discover(fake_pynvml([h100_80gb([])]))
    assert gpu.mode is GpuMode.MIG and gpu.mig_instances == ()
    assert gpu.health is Health.HEALTHY


def test_mig_utilisation_not_supported_does_not_break_discovery() -> None:
    module = fake_pynvml([h100_80gb(["3g.40gb@0", "3g.40gb@4"]), h100_80gb()])
    (mig_gpu, whole_gpu) = discover(module)
    assert len(mig_gpu.mig_instances) == 2 and mig_gpu.health is Health.HEALTHY

    busy = read_utilization(module)
    assert busy[whole_gpu.uuid] == 0
    assert busy[mig_gpu.uuid] is None  # "N/A", never a fake 0
    assert all(busy[m.uuid] is None for m in mig_gpu.mig_instances)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_NOT_SUPPORTED])
def test_without_gpu_instance_access_profiles_come_from_device_names_and_starts_are_inferred(
    code: int, caplog: pytest.LogCaptureFixture
) -> None:
    module = fake_pynvml([h100_80gb(H100_MIG_BALANCED, errors={"nvmlDeviceGetGpuInstanceById": code})])
    with caplog.at_level(logging.INFO, logger="gpupool.spawner.backends.nvml"):
        (gpu,) = discover(module)
    assert Counter(m.profile for m in gpu.mig_instances) == Counter(
        p.split("@")[0] for p in H100_MIG_BALANCED
    )
    assert layout_problem(GEOMETRIES["H100-80GB"], layout(gpu)) is None
    assert gpu.health is Health.HEALTHY
    assert "from device names" in caplog.text and "inferred" in caplog.text


def test_inferred_starts_respect_the_placements_nvml_did_report() -> None:
    errors = {"nvmlGpuInstanceGetInfo": pynvml.NVML_ERROR_NO_PERMISSION}
    (gpu,) = discover(fake_pynvml([a100_40gb(["4g.20gb@0", "3g.20gb@4"], errors=errors)]))
    assert layout(gpu) == [Placement(0, "4g.20gb"), Placement(4, "3g.20gb")]


def test_the_drivers_profile_name_wins_over_a_wrong_entry_in_the_table_of_profile_ids(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(fake_module._PROFILE_IDS, (3, 4, False), 5)  # a driver giving 3g the id of 4g
    with caplog.at_level(logging.WARNING, logger="gpupool.spawner.backends.nvml"):
        (gpu,) = discover(fake_pynvml([h100_80gb(["3g.40gb@4"])]))
    assert layout(gpu) == [Placement(4, "3g.40gb")]
    assert "NVML profile id 5 is 4g.40gb in gpupool's table; the driver says 3g.40gb" in caplog.text


def test_mig_instances_on_a_product_without_known_geometry_make_the_gpu_unhealthy() -> None:
    (gpu,) = discover(fake_pynvml([FakeGpu("NVIDIA A800 80GB PCIe", 80, ["3g.40gb@0"])]))
    assert gpu.mode is GpuMode.MIG
    assert gpu.mig_instances == ()  # nothing the pool cannot reason about is offered
    assert gpu.health is Health.UNHEALTHY


@pytest.mark.parametrize(
    ("product", "profile_id", "name"),
    [("H100-80GB", 9, "3g.40gb"), ("H200-141GB", 15, "1g.35gb"), ("NVIDIA A100-SXM4-40GB", 0, "7g.40gb")],
)
def test_nvml_profile_ids_map_to_the_products_profile_names(product: str, profile_id: int, name: str) -> None:
    assert mig_profile_for_nvml_id(product, profile_id).name == name


def test_unknown_nvml_profile_ids_and_products_without_mig_are_refused() -> None:
    with pytest.raises(UnknownMigProfile, match="NVML id 42"):
        mig_profile_for_nvml_id("H100-80GB", 42)
    with pytest.raises(NotMigCapable):
        mig_profile_for_nvml_id("L4-24GB", 19)


def test_discovered_mig_instances_can_be_leased_from_the_pool() -> None:
    node = discover_node(
        "gpu-host", nvml=dgx_h100(H100_MIG_BALANCED, count=1), cpu_milli=8000, memory_mib=65536
    )
    pool = PoolState([node])
    allocation = pool.place(Request(1000, 1024, MigSlice("3g.40gb")), "alice")
    assert isinstance(allocation, Allocation)
    assert pool.check_invariants() == []


# ---- NVLink -------------------------------------------------------------------------------------------------


def test_gpus_joined_by_nvlink_share_a_group_numbered_from_zero_in_gpu_order() -> None:
    module = fake_pynvml([h100_80gb() for _ in range(5)], nvlink=[[2, 3], [0, 1]])
    assert [g.nvlink_group for g in discover(module)] == [0, 0, 1, 1, None]


def test_nvlink_groups_are_connected_components() -> None:
    module = fake_pynvml([a100_80gb() for _ in range(4)], nvlink=[[0, 1], [1, 3]])
    assert [g.nvlink_group for g in discover(module)] == [0, 0, None, 0]


def test_nvlinked_gpus_can_be_leased_together() -> None:
    node = discover_node("gpu-host", nvml=dgx_h100(count=4), cpu_milli=8000, memory_mib=65536)
    pool = PoolState([node])
    allocation = pool.place(Request(1000, 1024, WholeGpus(4)), "bob")
    assert isinstance(allocation, Allocation)


def test_nvlink_query_not_supported_leaves_gpus_without_a_group() -> None:
    module = fake_pynvml(
        [h100_80gb(), h100_80gb()], nvlink=[[0, 1]], p2p_error=pynvml.NVML_ERROR_NOT_SUPPORTED
    )
    assert [g.nvlink_group for g in discover(module)] == [None, None]


# ---- failing GPUs -------------------------------------------------------------------------------------------


def test_lost_gpu_is_unhealthy_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpupool.spawner.backends.nvml"):
        good, lost = discover(gpu_lost())
    assert good.health is Health.HEALTHY and good.product == "H100-80GB"
    assert lost.health is Health.UNHEALTHY
    assert lost.index == 1 and lost.uuid == "GPU-unreadable-gpu-host-1"
    assert good.nvlink_group is None and lost.nvlink_group is None  # its only peer cannot answer
    assert "GPU 1 on gpu-host is unhealthy" in caplog.text and "GPU is lost" in caplog.text


def test_gpu_lost_midway_keeps_what_was_read() -> None:
    errors = {"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_GPU_IS_LOST}
    module = fake_pynvml([h100_80gb(), h100_80gb(H100_MIG_BALANCED, errors=errors)])
    _, gpu = discover(module)
    assert gpu.uuid.startswith("GPU-") and "unreadable" not in gpu.uuid
    assert gpu.product == "H100-80GB"
    assert gpu.health is Health.UNHEALTHY
    assert gpu.mig_instances == ()


def test_gpu_without_a_handle_is_listed_unhealthy_with_a_placeholder_uuid() -> None:
    errors = {"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_UNKNOWN}
    good, bad = discover(fake_pynvml([h200(), h200(errors=errors)]))
    assert good.health is Health.HEALTHY
    assert (bad.index, bad.uuid, bad.health) == (1, "GPU-unreadable-gpu-host-1", Health.UNHEALTHY)


def test_unexpected_errors_on_mig_devices_make_the_gpu_unhealthy() -> None:
    errors = {"nvmlDeviceGetMigDeviceHandleByIndex": pynvml.NVML_ERROR_UNKNOWN}
    (gpu,) = discover(fake_pynvml([h100_80gb(["7g.80gb@0"], errors=errors)]))
    assert gpu.health is Health.UNHEALTHY


# ---- no NVML ------------------------------------------------------------------------------------------------


def test_no_library_gives_nvml_unavailable_with_a_clear_message() -> None:
    with pytest.raises(
        NvmlUnavailable, match=r"^No NVIDIA driver found \(libnvidia-ml.so is missing\): "
    ) as info:
        discover_node(nvml=no_library())
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_driver_not_loaded_gives_nvml_unavailable_with_a_clear_message() -> None:
    with pytest.raises(
        NvmlUnavailable, match=r"^The NVIDIA driver is installed but not loaded: Driver Not Loaded"
    ):
        discover_node(nvml=driver_not_loaded())


def test_other_nvml_start_failures_give_nvml_unavailable() -> None:
    module = fake_pynvml(init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with pytest.raises(
        NvmlUnavailable, match="NVML could not start: RM has detected an NVML/RM version mismatch"
    ):
        discover_node(nvml=module)


def test_missing_pynvml_gives_nvml_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(NvmlUnavailable, match=r"nvidia-ml-py package .* is not installed"):
        discover_node()
    assert nvml_available() is False


def test_nvml_available_says_whether_nvml_starts_and_leaves_it_shut_down() -> None:
    module = dgx_h100(count=1)
    assert nvml_available(module) is True
    assert state_of(module).refcount == 0
    assert nvml_available(no_library()) is False
    assert nvml_available(driver_not_loaded()) is False


def test_nvml_is_shut_down_after_discovery_even_when_it_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    module = dgx_h100(H100_MIG_BALANCED, count=2)
    discover(module)
    assert (state_of(module).inits, state_of(module).shutdowns, state_of(module).refcount) == (1, 1, 0)

    def broken() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(module, "nvmlDeviceGetCount", broken)
    with pytest.raises(NvmlUnavailable, match="could not count the GPUs: Unknown Error"):
        discover(module)
    assert state_of(module).refcount == 0


# ---- the fake stays honest ----------------------------------------------------------------------------------


def _nvml_functions(module: ModuleType) -> dict[str, Callable[..., Any]]:
    return {name: getattr(module, name) for name in dir(module) if name.startswith("nvml")}


def _parameters(function: Callable[..., Any]) -> tuple[int, int]:
    """(required, total) positional parameters."""
    parameters = inspect.signature(function).parameters.values()
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return sum(p.default is p.empty for p in positional), len(positional)


def test_every_function_of_the_fake_exists_in_real_pynvml_with_the_same_parameters() -> None:
    module = fake_pynvml([h100_80gb()])
    public = [name for name in dir(module) if not name.startswith("_")]
    assert [name for name in public if not hasattr(pynvml, name)] == []
    fake = _nvml_functions(module)
    assert len(fake) >= 20
    for name, function in fake.items():
        assert hasattr(pynvml, name), f"{name} is not in the real pynvml"
        assert _parameters(function) == _parameters(getattr(pynvml, name)), name


def test_every_nvml_name_the_backend_uses_exists_in_real_pynvml_and_only_reads() -> None:
    trees = [ast.parse(source.read_text()) for source in BACKEND_SOURCES]
    used = {node.attr for tree in trees for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    nvml_names = {name for name in used if re.match(r"nvml[A-Z]|NVML", name)}
    assert {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetMigDeviceHandleByIndex"} <= nvml_names
    for name in nvml_names:
        assert hasattr(pynvml, name), f"the backend uses {name}, which pynvml does not have"
    functions = {name for name in nvml_names if name.startswith("nvml")}
    assert all(n in ("nvmlInit", "nvmlShutdown") or "Get" in n for n in functions), functions


def test_the_fake_raises_the_real_exception_classes_like_the_real_module() -> None:
    module = fake_pynvml([h100_80gb(["3g.40gb@0"])])
    assert module.NVMLError_NotFound is pynvml.NVMLError_NotFound
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        module.nvmlDeviceGetCount()
    module.nvmlInit()
    parent = module.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        module.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    mig = module.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        module.nvmlDeviceGetUtilizationRates(mig)
    assert module.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert isinstance(module.nvmlDeviceGetMemoryInfo(parent), pynvml.c_nvmlMemory_t)
    module.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        module.nvmlDeviceGetUUID(parent)
