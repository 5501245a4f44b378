"""`gpupool pool`: what an admin sees of a pool, in text and JSON, and what a broken pool file says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.cli import main


def test_demo_pool_as_json_counts_what_is_free(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pool", "--pool", str(DEMO_POOL), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "simulated"
    summary = data["summary"]
    assert (summary["nodes"], summary["gpus"], summary["mig_slices"]) == (4, 16, 6)
    assert summary["mig_slices_free"] == {"1g.10gb": 1, "2g.20gb": 3, "3g.40gb": 2}
    assert summary["shared_gpus"] == 4 and summary["shared_milli_free"] == 4000
    gpu6 = data["nodes"][0]["gpus"][6]
    assert [(m["profile"], m["start"], m["free"]) for m in gpu6["mig"]] == [
        ("3g.40gb", 0, True),
        ("3g.40gb", 4, True),
    ]


def test_without_a_driver_the_demo_pool_is_shown_and_labelled_simulated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["pool"]) == 0  # no NVIDIA driver on test machines
    captured = capsys.readouterr()
    assert "showing the simulated demo pool instead" in captured.err
    first, second = captured.out.splitlines()[:2]
    # a trial missed the stderr; a first-day trial, run from another folder, was not told where it looked
    assert first.startswith(
        f"Not the live pool (no running gpupool service found from {Path.cwd()}/.gpupool/)"
    )
    assert "(simulated)" in second
    assert "3g.40gb      @4  free" in captured.out


def test_a_service_address_from_the_environment_that_does_not_answer_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPOOL_SERVICE_URL", "http://127.0.0.1:9/services/gpupool/")  # a notebook's terminal
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "a-token")
    assert main(["pool"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("Not the live pool (cannot reach the gpupool service at http://127.0.0.1:9/"), (
        first
    )


def test_a_broken_pool_file_is_one_clear_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "nodes:\n  - name: gpu-a\n    cpu: 8\n    memory: 64GiB\n"
        "    gpus: {product: H100-80GB, count: 4}\n    mig:\n      2: [3g.40gb@2]\n"
    )
    assert main(["pool", "--pool", str(pool)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"gpupool: {pool}: node gpu-a, gpu 2: 3g.40gb cannot start at slot 2 on H100-80GB; legal starts are 0 and 4"
    )
