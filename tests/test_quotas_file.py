"""The quotas file: what an admin writes becomes the limits the service enforces, and a mistake is named.

The last tests start the real service command with a broken quotas file or policy name and read what it
says before it would open its port.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.files.quotas_file import EXAMPLE_QUOTAS, QuotaFileError, load_quotas, parse_quotas
from gpupool.spawner.pool.quotas import Quota
from gpupool.spawner.pool.requests import MigSlice, Request, WholeGpus

ONE_GPU = Request(8000, 65536, WholeGpus(1))
ONE_SLICE = Request(4000, 16384, MigSlice("3g.40gb"))


def _parse(text: str) -> object:
    return parse_quotas(yaml.safe_load(text), "quotas.yaml")


def test_the_shipped_example_limits_users_and_students_as_its_comments_say() -> None:
    policy = load_quotas(EXAMPLE_QUOTAS)
    assert policy.per_user == Quota(
        whole_gpus=2, mig_slices=4, gpu_shares=2, cpu_milli=64000, memory_mib=512 * 1024
    )
    third = policy.check("alice", [], ONE_GPU, [ONE_GPU, ONE_GPU])
    assert third is not None and "alice's quota allows 2 whole GPUs at once" in str(third)
    student = policy.check("sam", ["students"], ONE_GPU, [])
    assert student is not None and "students" in str(student)
    assert policy.check("sam", ["students"], ONE_SLICE, []) is None
    assert policy.check("demo", [], ONE_GPU, [ONE_GPU, ONE_GPU, ONE_GPU]) is None  # the override lifts it


def test_cpu_and_memory_are_written_as_in_profiles() -> None:
    policy = _parse("per_user: {cpu: 0.5, memory: 16GiB}\nusers: {alice: {memory: 2048}}")
    assert policy.per_user == Quota(cpu_milli=500, memory_mib=16384)
    assert policy.user_overrides["alice"] == Quota(memory_mib=2048)


def test_an_empty_file_limits_nobody() -> None:
    policy = _parse("")
    assert policy.check("alice", [], ONE_GPU, [ONE_GPU] * 50) is None


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("per_user: {whole_gpu: 2}", "per_user: unknown field 'whole_gpu' (did you mean 'whole_gpus'?)"),
        ("per_users: {whole_gpus: 2}", "unknown field 'per_users' at the top (did you mean 'per_user'?)"),
        (
            "per_group: {lab: {mig_slices: -1}}",
            "per_group.lab: mig_slices must be a whole number of 0 or more",
        ),
        ("users: {alice: {whole_gpus: 1.5}}", "users.alice: whole_gpus must be a whole number"),
        ("users: {alice: {whole_gpus: yes}}", "users.alice: whole_gpus must be a whole number"),
        ("users: [alice]", "users: expected a mapping of user name to limits, got a list"),
        ("per_user: {cpu: -2}", "per_user: cpu must be a number of cores such as 32 or 0.5"),
        ("per_user: {cpu: .nan}", "per_user: cpu must be a number of cores such as 32 or 0.5"),
        ("per_user: {memory: 12GB}", "per_user: memory must be like 256GiB or an integer of MiB, got '12GB'"),
        ("per_user: 2", "per_user: expected limits such as {whole_gpus: 2, mig_slices: 4}, got int 2"),
        ("- whole_gpus: 2", "expected a mapping with per_user, per_group, users at the top, got a list"),
    ],
)
def test_a_mistake_is_refused_naming_the_entry_and_field(text: str, named: str) -> None:
    with pytest.raises(QuotaFileError) as error:
        _parse(text)
    assert str(error.value).startswith("quotas.yaml: ")
    assert named in str(error.value)


def test_a_missing_file_and_bad_yaml_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(QuotaFileError, match="cannot read the quotas file"):
        load_quotas(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("per_user: {whole_gpus: 2\n")
    with pytest.raises(QuotaFileError, match=r"broken\.yaml: line \d+, column \d+: invalid YAML"):
        load_quotas(broken)


def _service_refuses(tmp_path: Path, **env: str) -> str:
    """Start the service with ``env``; it must exit on its own (no port opened) and say why."""
    environ = os.environ | {
        "GPUPOOL_POOL": str(DEMO_POOL),
        "GPUPOOL_DB_URL": f"sqlite:///{tmp_path}/gpupool.sqlite",
        "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
        "JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:9",
        "GPUPOOL_RECONCILE_SECONDS": "0",
        **env,
    }
    result = subprocess.run(
        [sys.executable, "-m", "gpupool.spawner.service"],
        env=environ,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


def test_the_service_will_not_start_with_a_broken_quotas_file(tmp_path: Path) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("per_user: {mig_slice: 4}\n")
    said = _service_refuses(tmp_path, GPUPOOL_QUOTAS=str(quotas))
    assert f"{quotas}: per_user: unknown field 'mig_slice' (did you mean 'mig_slices'?)" in said


def test_the_service_will_not_start_with_an_unknown_policy(tmp_path: Path) -> None:
    said = _service_refuses(tmp_path, GPUPOOL_POLICY="fastest")
    assert "GPUPOOL_POLICY: unknown placement policy 'fastest'; choose one of" in said
    assert "gpupool" in said.rsplit("choose one of", 1)[1]
