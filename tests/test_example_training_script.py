"""The shipped training example continues a failed job's work in a new job (``--resume-from``), as the
README tells a researcher to: a trial found the README's advice and no way to follow it with this script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parent.parent / "examples" / "train_with_checkpoints.py"


def _train(checkpoints: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"GPUPOOL_CHECKPOINT_DIR": str(checkpoints), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, str(TRAIN), "--checkpoint-every", "10", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_new_job_resumes_from_an_earlier_jobs_checkpoint_folder_and_ends_where_one_run_would(
    tmp_path: Path,
) -> None:
    failed_job, new_job, whole_run = (
        tmp_path / "J1" / "checkpoint",
        tmp_path / "J2" / "checkpoint",
        tmp_path / "one",
    )
    assert _train(failed_job, "--steps", "30").returncode == 0  # the run that got this far before it failed
    resumed = _train(new_job, "--steps", "60", "--resume-from", str(failed_job))
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[0] == f"resumed at step 30 from {failed_job}"
    assert "step 31/60" in resumed.stdout and "step 30/60" not in resumed.stdout
    whole = _train(whole_run, "--steps", "60")
    assert resumed.stdout.splitlines()[-1] == whole.stdout.splitlines()[-1]  # the same weights at the end
    again = _train(new_job, "--steps", "70", "--resume-from", str(failed_job))  # its own folder comes first
    assert again.stdout.splitlines()[0] == "resumed at step 60"


def test_resuming_from_a_folder_without_a_checkpoint_names_it_and_fails(tmp_path: Path) -> None:
    answer = _train(tmp_path / "J2", "--resume-from", str(tmp_path / "nothing-here"))
    assert answer.returncode == 2
    assert f"--resume-from: no checkpoint {tmp_path / 'nothing-here' / 'train.npz'}" in answer.stderr
