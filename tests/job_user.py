"""A system account to run test jobs as: jobs never run as root, and tests here often do.

As root, ``job_user()`` creates the account ``gpupool-job-test`` (with a home) if it is missing, idempotently;
otherwise the tests run jobs as the current user in the service's simple mode (homes under a scratch folder).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy

JOB_USER = "gpupool-job-test"
REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "examples" / "train_with_checkpoints.py"


def job_user() -> str:
    """The account test jobs run as (created when missing and the tests run as root)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    try:
        pwd.getpwnam(JOB_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--create-home", "--shell", "/bin/sh", JOB_USER], check=True, capture_output=True
        )
    return JOB_USER


def user_dir(user: str, home_root: str | None = None) -> Path:
    """A fresh folder inside ``user``'s home, owned by them."""
    home = Path(home_root, user) if home_root else Path(pwd.getpwnam(user).pw_dir)
    home.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="test-", dir=home))
    account = pwd.getpwnam(user)
    os.chown(path, account.pw_uid, account.pw_gid)
    return path


def clean_home(user: str) -> None:
    """Remove what tests left in the test account's home (their folders and job directories); only ever
    the dedicated test account's."""
    if user != JOB_USER:
        return
    home = Path(pwd.getpwnam(user).pw_dir)
    for path in [*home.glob("test-*"), home / ".gpupool"]:
        shutil.rmtree(path, ignore_errors=True)


def python_with_numpy() -> tuple[list[str], dict[str, str]]:
    """A Python the job user may run, with NumPy: this interpreter when the job user may reach it (not root's
    private pyenv), else the system Python with this environment's packages on PYTHONPATH."""
    site = str(Path(numpy.__file__).resolve().parent.parent)
    system = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() == 0 and system:
        return [system], {"PYTHONPATH": site}
    return [os.path.realpath(sys.executable)], {}
