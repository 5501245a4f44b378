"""Recordings of real NVML (``tests/device/nvml_probe.py``) keep the fake pynvml and the NVML backend honest.

Each ``tests/fixtures/nvml/*.json`` becomes a fake host (:func:`fake_gpus`); the probe is run again on that
fake, and both recordings must agree on every call the fake models. ``example-*`` files come from the fake
itself and only exercise this file; every other file is real hardware output, marked ``real:`` in test ids.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from collections import Counter
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import fake_pynvml as fake_module
import pytest
from fake_pynvml import FakeGpu, fake_pynvml

from gpupool.spawner.backends.nvml import discover_node, mig_profile_for_nvml_id
from gpupool.spawner.pool import mig
from gpupool.spawner.pool.devices import GpuMode, Health
from gpupool.spawner.pool.products import UnknownProduct, normalize_product

HERE = Path(__file__).parent
PROBE_PATH = HERE / "device" / "nvml_probe.py"
RECORDINGS = sorted((HERE / "fixtures" / "nvml").glob("*.json"))
MIB = 2**20
MIG_MEMORY_TOLERANCE = 0.10  # the fake gives a MIG device slices/8 of the GPU's memory; NVML reserves some
_MIG_PROFILE = re.compile(r"\bMIG\s+(\S+)\s*$")
_FAKE_PROFILE = re.compile(r"\d+g\.\d+gb(\+me)?")  # the profile names tests/fake_pynvml.py parses
_MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Recording key of a GPU -> the NVML function it records (errors there are replayed by the fake).
_GPU_CALLS = {
    "handle": "nvmlDeviceGetHandleByIndex",
    "name": "nvmlDeviceGetName",
    "uuid": "nvmlDeviceGetUUID",
    "memory": "nvmlDeviceGetMemoryInfo",
    "compute_capability": "nvmlDeviceGetCudaComputeCapability",
    "mig_mode": "nvmlDeviceGetMigMode",
    "max_mig_device_count": "nvmlDeviceGetMaxMigDeviceCount",
    "utilization": "nvmlDeviceGetUtilizationRates",
}

Record = dict[str, Any]


def _load_probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nvml_probe", PROBE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nvml_probe = _load_probe()


def _param(path: Path) -> Any:
    real = not path.name.startswith("example-")
    return pytest.param(path, id=f"real:{path.stem}" if real else path.stem)


recordings = pytest.mark.parametrize("path", [_param(path) for path in RECORDINGS])


# ---- reading a recording -----------------------------------------------------------------------------------


def outcome(record: Record | None) -> str:
    """``"value"``, or the exception class a call raised: what the fake must reproduce."""
    if record is None:
        return "absent"
    return "value" if "value" in record else str(record["error"])


def value(record: Record | None) -> Any:
    return None if record is None else record.get("value")


def mig_on(gpu: Record) -> bool:
    mode = value(gpu.get("mig_mode"))
    return mode is not None and int(mode[0]) == 1


def profile_of(slot: Record) -> str | None:
    """The profile in a MIG device's name: ``NVIDIA H200 MIG 1g.18gb`` -> ``1g.18gb``."""
    match = _MIG_PROFILE.search(value(slot.get("name")) or "")
    return match.group(1) if match else None


def profile_name(info: Record) -> str:
    """``MIG 1g.18gb`` (as NVML names a GPU-instance profile) -> ``1g.18gb``."""
    return re.sub(r"^MIG\s+", "", str(info["name"]))


def product_of(gpu: Record) -> str:
    """The product discovery should report: canonical when gpupool knows it, else NVML's name."""
    name, total_mib = value(gpu["name"]), value(gpu["memory"])["total"] // MIB
    try:
        return str(normalize_product(name, total_mib))
    except UnknownProduct:
        return str(name)


def occupied_slots(gpu: Record) -> list[Record]:
    return [slot for slot in gpu.get("mig_slots", []) if outcome(slot["handle"]) == "value"]


def recorded_start(slot: Record) -> int | None:
    info = value(slot.get("gpu_instance_info"))
    return None if info is None else int(info["placement"]["start"])


@cache
def load(path: Path) -> Record:
    recording: Record = json.loads(path.read_text())
    return recording


# ---- a recording as a fake host ----------------------------------------------------------------------------


def _starts(gpu: Record, slots: list[Record]) -> list[int]:
    """Each occupied slot's start: as NVML placed it, or a legal placement where it would not say."""
    known = [recorded_start(slot) for slot in slots]
    if None not in known:
        return [start for start in known if start is not None]
    geo = mig.geometry(product_of(gpu))
    fixed = [
        mig.Placement(s, profile_of(slot) or "")
        for s, slot in zip(known, slots, strict=True)
        if s is not None
    ]
    missing = [profile_of(slot) or "" for s, slot in zip(known, slots, strict=True) if s is None]
    guessed = list(mig.fit(geo, missing, existing=fixed) or ())
    assert len(guessed) == len(missing), f"no legal placement of {missing} next to {fixed}"
    starts: list[int] = []
    for start, slot in zip(known, slots, strict=True):
        if start is None:
            spot = next(p for p in guessed if p.profile == profile_of(slot))
            guessed.remove(spot)
            start = spot.start
        starts.append(start)
    return starts


def fake_gpu(gpu: Record) -> FakeGpu:
    """``FakeGpu`` arguments that make the fake answer as this recorded GPU did."""
    errors: dict[str, int] = {}
    for key, function in _GPU_CALLS.items():
        error = gpu.get(key, {})
        if "code" in error and not (key == "utilization" and mig_on(gpu) and error["code"] == 3):
            errors[function] = int(error["code"])  # NotSupported (3) in MIG mode is what the fake does anyway
    mig_capable = outcome(gpu.get("mig_mode")) != "NVMLError_NotSupported"
    if not mig_capable:
        errors.pop("nvmlDeviceGetMigMode")
        errors.pop("nvmlDeviceGetMaxMigDeviceCount", None)
    if "handle" in errors:
        return FakeGpu("unreadable", errors=errors)
    layout: list[str | None] | None = None
    if mig_on(gpu):
        slots = gpu["mig_slots"]
        used = occupied_slots(gpu)
        starts = iter(_starts(gpu, used))
        layout = [f"{profile_of(s)}@{next(starts)}" if s in used else None for s in slots]
        while layout and layout[-1] is None:
            layout.pop()
        for slot in used:
            for key in ("gpu_instance_id", "gpu_instance_info"):
                error = slot[key]
                if "code" in error:
                    errors[error.get("call", "nvmlDeviceGetGpuInstanceId")] = int(error["code"])
    utilization = value(gpu.get("utilization"))
    capability = value(gpu.get("compute_capability")) or (0, 0)
    return FakeGpu(
        name=value(gpu.get("name")) or "unreadable",
        mig=layout,
        uuid=value(gpu.get("uuid")),
        memory_mib=(value(gpu.get("memory")) or {"total": 0})["total"] // MIB,
        compute_capability=(int(capability[0]), int(capability[1])),
        mig_capable=mig_capable,
        utilization=int(utilization["gpu"]) if utilization else 0,
        errors=errors,
    )


def fake_host(recording: Record) -> ModuleType:
    """A fake ``pynvml`` for the recorded host."""
    gpus = [fake_gpu(gpu) for gpu in recording["gpus"]]
    return fake_pynvml(gpus, driver=value(recording["driver_version"]) or "")


@cache
def replay(path: Path) -> Record:
    """The probe's recording of the fake built from the recording at ``path``."""
    replayed: Record = nvml_probe.probe(fake_host(load(path)))
    return replayed


def both(path: Path) -> list[tuple[Record, Record]]:
    """(recorded GPU, the fake's answer for it), GPU by GPU."""
    real, fake = load(path), replay(path)
    assert len(fake["gpus"]) == len(real["gpus"])
    return list(zip(real["gpus"], fake["gpus"], strict=True))


# ---- the recordings ----------------------------------------------------------------------------------------


def test_there_is_at_least_the_example_recording() -> None:
    assert any(path.name.startswith("example-") for path in RECORDINGS)


@recordings
def test_recording_is_a_usable_probe_recording(path: Path) -> None:
    recording = load(path)
    assert recording["schema"] == nvml_probe.SCHEMA
    assert outcome(recording["init"]) == "value", "NVML did not start; record on a host with a working driver"
    assert value(recording["device_count"]) == len(recording["gpus"]) > 0
    for gpu in recording["gpus"]:
        for key in ("name", "uuid", "memory"):
            assert outcome(gpu.get(key)) == "value", f"GPU {gpu['index']}: {key} was not read"
        modelled = [gpu.get(key) for key in _GPU_CALLS] + [
            slot.get(key) for slot in gpu.get("mig_slots", []) for key in ("handle", "utilization")
        ]
        odd = [record for record in modelled if record and "error" in record and "code" not in record]
        assert odd == [], "calls failed outside NVML (an old nvidia-ml-py?), so the fake cannot replay them"


@recordings
def test_fake_reports_the_same_driver_names_uuids_memory_and_capability(path: Path) -> None:
    assert value(replay(path)["driver_version"]) == value(load(path)["driver_version"])
    for real, fake in both(path):
        for key in ("handle", "name", "uuid", "compute_capability"):
            assert (outcome(fake.get(key)), value(fake.get(key))) == (
                outcome(real.get(key)),
                value(real.get(key)),
            ), key
        assert value(fake["memory"])["total"] // MIB == value(real["memory"])["total"] // MIB


@recordings
def test_fake_reports_the_same_mig_mode_and_empty_slots(path: Path) -> None:
    for real, fake in both(path):
        assert outcome(fake["mig_mode"]) == outcome(real["mig_mode"])
        if value(real["mig_mode"]) is not None:
            current, pending = value(real["mig_mode"])
            assert value(fake["mig_mode"])[0] == current
            if current == pending:  # the fake has no pending change of MIG mode
                assert value(fake["mig_mode"]) == [current, pending]
        assert (outcome(fake["max_mig_device_count"]), value(fake["max_mig_device_count"])) == (
            outcome(real["max_mig_device_count"]),
            value(real["max_mig_device_count"]),
        )
        if mig_on(
            real
        ):  # which MIG device slots raise (NotFound for an empty one), as the backend walks them
            assert [outcome(s["handle"]) for s in fake["mig_slots"]] == [
                outcome(s["handle"]) for s in real["mig_slots"]
            ]


@recordings
def test_fake_utilisation_raises_the_same_errors(path: Path) -> None:
    for real, fake in both(path):
        assert outcome(fake["utilization"]) == outcome(real["utilization"])
        if mig_on(real):
            assert [outcome(s.get("utilization")) for s in fake["mig_slots"]] == [
                outcome(s.get("utilization")) for s in real["mig_slots"]
            ]


@recordings
def test_fake_mig_devices_match_names_gpu_instances_and_memory(path: Path) -> None:
    for real, fake in both(path):
        if not mig_on(real):
            continue
        for real_slot, fake_slot in zip(occupied_slots(real), occupied_slots(fake), strict=True):
            assert value(fake_slot["name"]) == value(real_slot["name"])
            for slot in (real_slot, fake_slot):
                assert _MIG_UUID.match(value(slot["uuid"])), value(slot["uuid"])
            assert outcome(fake_slot["gpu_instance_id"]) == outcome(real_slot["gpu_instance_id"])
            real_info, fake_info = real_slot["gpu_instance_info"], fake_slot["gpu_instance_info"]
            assert (outcome(fake_info), fake_info.get("call")) == (outcome(real_info), real_info.get("call"))
            if outcome(real_info) == "value":  # the instance id itself is the driver's choice
                for key in ("profileId", "placement"):
                    assert value(fake_info)[key] == value(real_info)[key], key
            real_mib = value(real_slot["memory"])["total"] // MIB
            fake_mib = value(fake_slot["memory"])["total"] // MIB
            assert abs(fake_mib - real_mib) <= MIG_MEMORY_TOLERANCE * real_mib, (
                profile_of(real_slot),
                real_mib,
            )


@recordings
def test_gpu_instance_profile_ids_match_the_fake_and_gpupool(path: Path) -> None:
    for gpu in load(path)["gpus"]:
        infos = [value(entry) for entry in gpu.get("gpu_instance_profiles", []) if outcome(entry) == "value"]
        names = {profile_name(info): int(info["id"]) for info in infos}
        shape = FakeGpu(value(gpu["name"]), memory_mib=value(gpu["memory"])["total"] // MIB)
        for info in infos:
            name = profile_name(info)
            if not _FAKE_PROFILE.fullmatch(name):
                continue  # a profile the fake has no words for (``+gfx``, ``-me``): nothing to compare
            assert int(name.split("g.")[0]) == info["sliceCount"], info
            _, fake_id = fake_module._parse_profile(name, shape)
            assert fake_id == info["id"], f"the fake gives {name} id {fake_id}; NVML says {info['id']}"
        try:
            geo = mig.geometry(product_of(gpu))
        except mig.NotMigCapable:
            continue
        if names:  # gpupool offers only profiles the driver knows, under the driver's ids
            assert {name: p.shape.nvml_profile_id for name, p in geo.profiles.items()} == {
                name: names.get(name) for name in geo.profiles
            }
            for name in set(names) & set(geo.profiles):
                assert mig_profile_for_nvml_id(geo.product, names[name]).name == name


@recordings
def test_discovery_on_the_replayed_host_agrees_with_the_recording(path: Path) -> None:
    recording = load(path)
    node = discover_node("recorded", nvml=fake_host(recording), cpu_milli=8000, memory_mib=65536)
    assert len(node.gpus) == len(recording["gpus"])
    for gpu, real in zip(node.gpus, recording["gpus"], strict=True):
        assert (gpu.uuid, gpu.product) == (value(real["uuid"]), product_of(real))
        assert gpu.memory_mib == value(real["memory"])["total"] // MIB
        assert gpu.driver_version == value(recording["driver_version"])
        assert gpu.mode is (GpuMode.MIG if mig_on(real) else GpuMode.WHOLE)
        assert gpu.health is Health.HEALTHY
        slots = occupied_slots(real) if mig_on(real) else []
        assert Counter(m.profile for m in gpu.mig_instances) == Counter(profile_of(s) for s in slots)
        placed = {(recorded_start(s), profile_of(s)) for s in slots if recorded_start(s) is not None}
        assert placed <= {(m.start, m.profile) for m in gpu.mig_instances}
        recorded_mib = sorted(value(s["memory"])["total"] // MIB for s in slots)
        for found, recorded in zip(
            sorted(m.memory_mib for m in gpu.mig_instances), recorded_mib, strict=True
        ):
            assert abs(found - recorded) <= MIG_MEMORY_TOLERANCE * recorded


# ---- the probe ---------------------------------------------------------------------------------------------


def test_probe_only_reads_and_needs_nothing_but_the_standard_library_and_pynvml() -> None:
    tree = ast.parse(PROBE_PATH.read_text())
    called = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    nvml_calls = {name for name in called if name.startswith("nvml")}
    allowed = re.compile(r"nvml(Init|Shutdown|SystemGet\w+|DeviceGet\w+|GpuInstanceGet\w+)$")
    assert nvml_calls and {name for name in nvml_calls if not allowed.match(name)} == set()
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    foreign = {name for name in imported if name.split(".")[0] not in (*sys.stdlib_module_names, "pynvml")}
    assert foreign == set()


def test_probe_writes_a_fixture_named_for_the_gpu_and_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    host = fake_pynvml([fake_module.h200(["7g.141gb@0"])], driver="580.159.03")
    monkeypatch.setitem(sys.modules, "pynvml", host)
    assert nvml_probe.main(["--out", str(tmp_path)]) == 0
    written = tmp_path / "nvidia-h200-580.159.03.json"
    recording = json.loads(written.read_text())
    assert json.loads(capsys.readouterr().out) == recording
    assert fake_module.state_of(host).refcount == 0  # NVML shut down again
    (gpu,) = recording["gpus"]
    assert (
        outcome(recording["nvml_version"]) == "AttributeError"
    )  # calls the fake lacks are recorded, not fatal
    assert [outcome(slot["handle"]) for slot in gpu["mig_slots"]] == ["value"] + ["NVMLError_NotFound"] * 6


def test_probe_records_a_driver_that_will_not_start_and_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_module.no_library())
    assert nvml_probe.main(["--out", str(tmp_path / "x.json")]) == 1
    assert json.loads((tmp_path / "x.json").read_text())["init"]["error"] == "NVMLError_LibraryNotFound"
