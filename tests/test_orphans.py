"""A process the hub starts ends with the hub even when the hub dies before the process could ask to be told
(``kill -9`` of a hub while its service is still importing): it knows its parent's pid from the hub."""

from __future__ import annotations

import os
import subprocess
import sys

from gpupool.spawner.orphans import PARENT_ENV


def test_a_child_whose_parent_died_before_it_asked_exits_at_once() -> None:
    # the parent named in the environment is not this child's parent any more: it died while the child started
    gone = subprocess.run(
        [sys.executable, "-m", "gpupool.spawner.orphans", "sleep", "60"],
        env=os.environ | {PARENT_ENV: "1"},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert gone.returncode != 0 and "the process that started this one is gone" in gone.stderr


def test_a_child_whose_parent_lives_runs_its_command() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "gpupool.spawner.orphans", "echo", "ran"],
        env=os.environ | {PARENT_ENV: str(os.getpid())},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert ran.returncode == 0 and ran.stdout == "ran\n"
