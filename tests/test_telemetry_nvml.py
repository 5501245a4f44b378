"""The NVML telemetry sampler against the fake pynvml: whole GPUs, MIG with and without GPM, errors."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pynvml
import pytest
from fake_pynvml import a100_80gb, fake_pynvml, h100_80gb, no_library, state_of

from gpupool.spawner.backends import nvml_telemetry
from gpupool.spawner.backends.nvml import NvmlUnavailable
from gpupool.spawner.backends.nvml_telemetry import NvmlSampler
from gpupool.spawner.telemetry import Sample, Snapshot

BALANCED = ["3g.40gb@4", "2g.20gb@0", "1g.10gb@2", "1g.10gb@3"]


def by_profile(snapshot: Snapshot) -> dict[str | None, Sample]:
    return {s.mig_profile: s for s in snapshot.samples}


def test_a_whole_gpu_reports_every_metric_in_base_units() -> None:
    gpu = h100_80gb(utilization=87, memory_utilization=40, memory_used_mib=20480, temperature_c=61)
    gpu.power_mw, gpu.power_limit_mw, gpu.sm_clock_mhz, gpu.ecc = 512_345, 700_000, 1755, (3, 1)
    with NvmlSampler("gpu-host", nvml=fake_pynvml([gpu])) as sampler:
        (reading,) = sampler.sample(100.0).samples
    assert reading.uuid == gpu.uuid and reading.node == "gpu-host" and reading.mig_profile is None
    assert (reading.gpu_utilization, reading.memory_utilization) == (87.0, 40.0)
    assert (reading.memory_used_mib, reading.memory_total_mib) == (20480, 81559)
    assert (reading.temperature_c, reading.power_w, reading.power_limit_w) == (61, 512.345, 700.0)
    assert (reading.sm_clock_mhz, reading.ecc_corrected, reading.ecc_uncorrected) == (1755, 3, 1)
    assert reading.xid_errors == () and reading.problems == () and reading.time == 100.0


def test_utilisation_follows_the_gpu_from_one_sample_to_the_next() -> None:
    gpu = h100_80gb(utilization=0)
    with NvmlSampler(nvml=fake_pynvml([gpu])) as sampler:
        assert sampler.sample(0.0).samples[0].gpu_utilization == 0.0
        gpu.utilization = 100
        assert sampler.sample(2.0).samples[0].gpu_utilization == 100.0


def test_mig_instances_on_a_gpm_gpu_get_utilisation_from_the_second_sample_on() -> None:
    gpu = h100_80gb(BALANCED)
    gpu.mig_utilization.update({4: 75.0, 0: 0.0})
    gpu.mig_memory_used_mib[4] = 30000
    with NvmlSampler(nvml=fake_pynvml([gpu])) as sampler:
        first = by_profile(sampler.sample(0.0))
        assert first["3g.40gb"].gpu_utilization is None  # GPM needs two samples: not yet available
        gpu.mig_utilization[4] = 99.0
        second = by_profile(sampler.sample(2.0))
    assert set(second) == {None, "3g.40gb", "2g.20gb", "1g.10gb"}
    assert second[None].gpu_utilization is None  # NVML has no utilisation for a GPU in MIG mode
    big = second["3g.40gb"]
    assert (big.gpu_utilization, big.gpu_index, big.memory_used_mib) == (99.0, 0, 30000)
    assert big.memory_total_mib == 81559 * 4 // 8
    assert second["2g.20gb"].gpu_utilization == 0.0  # a real, measured 0
    assert big.temperature_c == second[None].temperature_c and big.power_w is None
    assert big.ecc_corrected is None and big.problems == ()


def test_mig_instances_without_gpm_read_not_available_never_zero() -> None:
    gpu = a100_80gb(["3g.40gb@0", "3g.40gb@4"])  # Ampere: no GPM
    gpu.mig_utilization.update({0: 90.0, 4: 90.0})
    module = fake_pynvml([gpu])
    with NvmlSampler(nvml=module) as sampler:
        for t in (0.0, 2.0, 4.0):
            instances = [s for s in sampler.sample(t).samples if s.is_mig]
            assert [s.gpu_utilization for s in instances] == [None, None]
            assert [s.memory_total_mib for s in instances] == [40960, 40960]
            assert all(s.problems == () for s in instances)
    assert "nvmlGpmMigSampleGet" not in state_of(module).calls


def test_a_metric_the_gpu_does_not_support_reads_none_and_is_not_a_problem() -> None:
    not_supported = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu = h100_80gb(
        errors={"nvmlDeviceGetPowerUsage": not_supported, "nvmlDeviceGetClockInfo": not_supported}
    )
    gpu.ecc = None
    with NvmlSampler(nvml=fake_pynvml([gpu])) as sampler:
        (reading,) = sampler.sample(0.0).samples
    assert (reading.power_w, reading.sm_clock_mhz, reading.ecc_corrected) == (None, None, None)
    assert reading.power_limit_w == 700.0 and reading.problems == ()


def test_a_failing_read_is_none_and_says_why() -> None:
    gpu = h100_80gb(errors={"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_UNKNOWN})
    with NvmlSampler(nvml=fake_pynvml([gpu, h100_80gb(utilization=5)])) as sampler:
        broken, fine = sampler.sample(0.0).samples
    assert broken.temperature_c is None and any("temperature" in p for p in broken.problems)
    assert fine.gpu_utilization == 5.0 and fine.problems == ()


def test_a_gpu_that_falls_off_the_bus_reads_all_none_while_the_others_go_on() -> None:
    lost = h100_80gb(utilization=50)
    with NvmlSampler(nvml=fake_pynvml([lost, h100_80gb(utilization=7)])) as sampler:
        sampler.sample(0.0)
        lost.lost = True
        gone, fine = sampler.sample(2.0).samples
    assert gone.gpu_utilization is None and gone.memory_used_mib is None and gone.problems
    assert fine.gpu_utilization == 7.0


def test_gpm_metric_failure_leaves_the_instance_not_available() -> None:
    gpu = h100_80gb(["7g.80gb@0"], errors={"nvmlGpmMetricsGet": pynvml.NVML_ERROR_UNKNOWN})
    with NvmlSampler(nvml=fake_pynvml([gpu])) as sampler:
        sampler.sample(0.0)
        instance = by_profile(sampler.sample(2.0))["7g.80gb"]
    assert instance.gpu_utilization is None and any("GPM" in p for p in instance.problems)


def test_xid_errors_reach_the_gpu_and_the_instance_they_name() -> None:
    gpu = h100_80gb(["3g.40gb@0", "3g.40gb@4"])
    with NvmlSampler(nvml=fake_pynvml([gpu])) as sampler:
        assert by_profile(sampler.sample(0.0))[None].xid_errors == ()
        gpu.xids += [(79, 0xFFFFFFFF), (31, 5)]  # instance at slice 4 has GPU instance id 5 in the fake
        readings = [s for s in sampler.sample(2.0).samples]
        assert [s.xid_errors for s in readings] == [(79, 31), (), (31,)]
        assert [s.xid_errors for s in sampler.sample(4.0).samples] == [(), (), ()]  # delivered once


def test_a_gpu_without_xid_events_says_not_available() -> None:
    with NvmlSampler(nvml=fake_pynvml([h100_80gb(events=False)])) as sampler:
        assert sampler.sample(0.0).samples[0].xid_errors is None


def test_closing_frees_gpm_buffers_and_event_sets_and_shuts_nvml_down() -> None:
    module = fake_pynvml([h100_80gb(BALANCED), h100_80gb()])
    sampler = NvmlSampler(nvml=module)
    sampler.open()
    assert sampler.device_count == 6 and len(module._gpm_buffers) == 8 and len(module._event_sets) == 2
    sampler.sample(0.0)
    sampler.close()
    assert module._gpm_buffers == {} and module._event_sets == {} and state_of(module).refcount == 0


def test_a_host_without_a_driver_fails_to_open_with_a_readable_error() -> None:
    with pytest.raises(NvmlUnavailable, match="No NVIDIA driver"):
        NvmlSampler(nvml=no_library()).open()


def test_the_sampler_only_reads_nvml_and_every_name_it_uses_is_real() -> None:
    tree = ast.parse(Path(nvml_telemetry.__file__).read_text())
    names = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "nvml"
    }
    assert all(re.match(r"nvml[A-Z]|NVML|c_nvml", name) for name in names), names
    assert {"nvmlGpmMigSampleGet", "nvmlGpmMetricsGet", "nvmlDeviceGetTemperature"} <= names
    for name in names:
        assert hasattr(pynvml, name), f"the sampler uses {name}, which pynvml does not have"
    # Set-up and tear-down of the sampler's own buffers and event sets; nothing changes a GPU setting.
    own = {"nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlEventSetCreate", "nvmlEventSetFree"}
    own |= {"nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2", "nvmlGpmQueryDeviceSupport"}
    functions = {n for n in names if n.startswith("nvml")}
    assert all("Get" in n or n in own for n in functions), functions - own


def test_eight_gpus_with_seven_slices_each_are_all_sampled() -> None:
    gpus = [h100_80gb([f"1g.10gb@{i}" for i in range(7)]) for _ in range(8)]
    for gpu in gpus:
        gpu.mig_utilization.update(dict.fromkeys(range(7), 12.5))
    with NvmlSampler(nvml=fake_pynvml(gpus)) as sampler:
        sampler.sample(0.0)
        snapshot = sampler.sample(2.0)
    instances = [s for s in snapshot.samples if s.is_mig]
    assert len(snapshot.samples) == 64 and len(instances) == 56
    assert {s.gpu_utilization for s in instances} == {12.5} and not snapshot.simulated
