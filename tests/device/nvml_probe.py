"""Record what real NVML answers on this host, read-only, as JSON: a fixture that keeps the fake pynvml honest.

Run it on a machine with an NVIDIA GPU (needs only Python and ``pip install nvidia-ml-py``)::

    python tests/device/nvml_probe.py --out tests/fixtures/nvml/<gpu>-<driver>.json

It only reads: ``nvmlInit``, ``nvmlShutdown``, ``nvmlSystemGet*``, ``nvmlDeviceGet*`` and ``nvmlGpuInstanceGet*``.
It never changes MIG mode, a MIG layout or any other setting. Every call is recorded as ``{"value": ...}``
or ``{"error": "<exception class>", "code": ..., "message": ...}``, so one failure never stops the rest.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

SCHEMA = 1
# GPU-instance profile indices (NVML_GPU_INSTANCE_PROFILE_*) when pynvml does not say how many there are.
_PROFILE_INDICES = 10

Result = dict[str, Any]


def _plain(value: Any) -> Any:
    """A JSON-ready copy of an NVML result: ctypes structures become dicts, bytes become text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, ctypes.Structure):
        fields = (name for name, *_ in value._fields_ if name not in ("version", "device"))
        return {name: _plain(getattr(value, name)) for name in fields}
    if isinstance(value, ctypes._SimpleCData):
        return _plain(value.value)
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _failure(error: BaseException) -> Result:
    failure: Result = {"error": type(error).__name__, "message": str(error)}
    code = getattr(error, "value", None)
    if isinstance(code, int):
        failure["code"] = code
    return failure


def _call(function: Callable[[], Any]) -> tuple[Any, Result]:
    """``function()`` as (raw result or None, record); any exception is recorded by class name."""
    try:
        raw = function()
    except Exception as error:  # one failing call must never stop the recording
        return None, _failure(error)
    return raw, {"value": _plain(raw)}


def _mig_slot(nvml: ModuleType, parent: Any, slot: int) -> Result:
    """One MIG device slot: its error (an empty slot raises NotFound) or what the MIG device says."""
    handle, record = _call(lambda: nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot))
    entry: Result = {"slot": slot, "handle": record if handle is None else {"value": "ok"}}
    if handle is None:
        return entry
    entry["name"] = _call(lambda: nvml.nvmlDeviceGetName(handle))[1]
    entry["uuid"] = _call(lambda: nvml.nvmlDeviceGetUUID(handle))[1]
    entry["memory"] = _call(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))[1]
    entry["utilization"] = _call(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))[1]
    gi_id, entry["gpu_instance_id"] = _call(lambda: nvml.nvmlDeviceGetGpuInstanceId(handle))
    entry["gpu_instance_info"] = _gpu_instance_info(nvml, parent, gi_id)
    return entry


def _gpu_instance_info(nvml: ModuleType, parent: Any, gi_id: Any) -> Result:
    """The path the backend takes: nvmlDeviceGetGpuInstanceById, then nvmlGpuInstanceGetInfo."""
    if gi_id is None:
        return {"error": "skipped", "call": "nvmlDeviceGetGpuInstanceId"}
    instance, record = _call(lambda: nvml.nvmlDeviceGetGpuInstanceById(parent, gi_id))
    if instance is None:
        return {**record, "call": "nvmlDeviceGetGpuInstanceById"}
    _, record = _call(lambda: nvml.nvmlGpuInstanceGetInfo(instance))
    return record if "value" in record else {**record, "call": "nvmlGpuInstanceGetInfo"}


def _profiles(nvml: ModuleType, handle: Any) -> list[Result]:
    """nvmlDeviceGetGpuInstanceProfileInfo for every profile index (v2 with names, else v1)."""
    names = {
        getattr(nvml, name): name
        for name in dir(nvml)
        if re.fullmatch(r"NVML_GPU_INSTANCE_PROFILE_\d+_SLICE\w*", name)
    }
    count = int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", _PROFILE_INDICES))

    def info(index: int, *version: int) -> Callable[[], Any]:
        return lambda: nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, *version)

    entries: list[Result] = []
    for index in range(count):
        _, record = _call(info(index))
        if record.get("error") == "NVMLError_FunctionNotFound":  # a driver without the V call
            _, record = _call(info(index, 1))
        entries.append({"index": index, "constant": names.get(index), **record})
    return entries


def _gpu(nvml: ModuleType, index: int) -> Result:
    """Everything read-only NVML says about one GPU and its MIG devices."""
    handle, record = _call(lambda: nvml.nvmlDeviceGetHandleByIndex(index))
    entry: Result = {"index": index, "handle": record if handle is None else {"value": "ok"}}
    if handle is None:
        return entry
    entry["name"] = _call(lambda: nvml.nvmlDeviceGetName(handle))[1]
    entry["uuid"] = _call(lambda: nvml.nvmlDeviceGetUUID(handle))[1]
    entry["memory"] = _call(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))[1]
    entry["compute_capability"] = _call(lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))[1]
    entry["mig_mode"] = _call(lambda: nvml.nvmlDeviceGetMigMode(handle))[1]  # [current, pending]
    slots, entry["max_mig_device_count"] = _call(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    entry["utilization"] = _call(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))[1]
    sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
    entry["temperature_c"] = _call(lambda: nvml.nvmlDeviceGetTemperature(handle, sensor))[1]
    entry["power_usage_mw"] = _call(lambda: nvml.nvmlDeviceGetPowerUsage(handle))[1]
    entry["power_limit_mw"] = _call(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))[1]
    entry["gpu_instance_profiles"] = _profiles(nvml, handle)
    entry["mig_slots"] = [_mig_slot(nvml, handle, slot) for slot in range(int(slots or 0))]
    return entry


def probe(nvml: ModuleType) -> Result:
    """The recording of this host, from ``nvml`` (the ``pynvml`` module, or a fake in tests)."""
    began = time.monotonic()
    try:
        package = metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        package = None
    recording: Result = {
        "schema": SCHEMA,
        "probe": "tests/device/nvml_probe.py",
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "nvidia_ml_py": package,
    }
    _, recording["init"] = _call(lambda: nvml.nvmlInit())
    if "error" in recording["init"]:
        return recording
    try:
        recording["driver_version"] = _call(lambda: nvml.nvmlSystemGetDriverVersion())[1]
        recording["nvml_version"] = _call(lambda: nvml.nvmlSystemGetNVMLVersion())[1]
        recording["cuda_driver_version"] = _call(lambda: nvml.nvmlSystemGetCudaDriverVersion())[1]
        count, recording["device_count"] = _call(lambda: nvml.nvmlDeviceGetCount())
        recording["gpus"] = [_gpu(nvml, index) for index in range(int(count or 0))]
    finally:
        recording["shutdown"] = _call(lambda: nvml.nvmlShutdown())[1]
        recording["elapsed_s"] = round(time.monotonic() - began, 3)
    return recording


def fixture_name(recording: Result) -> str:
    """``<gpu>-<driver>.json`` for a recording, such as ``nvidia-h200-580.159.03.json``."""
    gpus = recording.get("gpus") or [{}]
    gpu = str(gpus[0].get("name", {}).get("value") or "no-gpu")
    driver = str(recording.get("driver_version", {}).get("value") or "no-driver")
    return "-".join(re.sub(r"[^a-z0-9.]+", "-", part.lower()).strip("-") for part in (gpu, driver)) + ".json"


def main(argv: list[str] | None = None) -> int:
    """Print the recording as JSON and write it to ``--out``; 1 when NVML would not start, 2 without pynvml."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="also write the JSON to this file, or into this folder as <gpu>-<driver>.json",
    )
    args = parser.parse_args(argv)
    try:
        import pynvml
    except ImportError as error:
        print(f"pynvml is missing ({error}): pip install nvidia-ml-py", file=sys.stderr)
        return 2
    recording = probe(pynvml)
    text = json.dumps(recording, indent=2) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        out = args.out / fixture_name(recording) if args.out.is_dir() else args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    return 1 if "error" in recording["init"] else 0


if __name__ == "__main__":
    sys.exit(main())
