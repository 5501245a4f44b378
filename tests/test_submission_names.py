"""What a job is called when its submitter names nothing, and a submission the client can refuse itself."""

from __future__ import annotations

import pytest

from gpupool.spawner.service.jobs.submission import default_name
from gpupool.widgets.jobs import submission


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python", "train.py", "--steps", "4"], "train.py"),  # a trial's list read "python" on every line
        (["python3", "-u", "/home/ada/sweep/train.py"], "train.py"),
        (["python", "-m", "lab.train"], "lab.train"),
        (["python", "-c", "print(1)"], "python"),
        (["/usr/bin/sleep", "30"], "sleep"),
    ],
)
def test_an_unnamed_job_is_called_after_the_script_it_runs(command: list[str], name: str) -> None:
    assert default_name(command) == name


@pytest.mark.parametrize("runtime", [float("nan"), float("inf")])
def test_a_runtime_json_cannot_carry_is_refused_naming_the_field(runtime: float) -> None:
    """A trial's ``max_runtime=float('nan')`` ended in "Out of range float values are not JSON compliant"."""
    with pytest.raises(ValueError, match=r"^max_runtime: seconds or a duration such as '2h', got"):
        submission(["python", "train.py"], "h100", max_runtime=runtime)
