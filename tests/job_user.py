"""A system account to run test jobs as: jobs never run as root, and tests here often do.

As root, ``job_user()`` creates the account ``gpupool-job-test`` (``gpupool-job-test-gw1`` in pytest-xdist's worker
gw1; with a home) if it is missing, idempotently;
otherwise the tests run jobs as the current user in the service's simple mode (homes under a scratch folder).
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy

# One account per pytest-xdist worker: a worker cleaning its account's home never touches another's jobs.
JOB_USER = "gpupool-job-test" + os.environ.get("PYTEST_XDIST_WORKER", "").replace("gw", "-gw")
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
    private pyenv), else the system Python with this environment's NumPy on PYTHONPATH."""
    site = Path(numpy.__file__).resolve().parent.parent
    system = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() == 0 and system:
        return [system], {"PYTHONPATH": str(_readable(site, ("numpy", "numpy.libs")))}
    return [os.path.realpath(sys.executable)], {}


def train_script() -> str:
    """``examples/train_with_checkpoints.py`` where the job user may read it."""
    return str(_readable(TRAIN.parent, (TRAIN.name,)) / TRAIN.name)


def _readable(folder: Path, names: tuple[str, ...]) -> Path:
    """``folder``, or a copy of its ``names`` in a world-readable scratch folder when the job user cannot
    reach it: a checkout inside a private folder (``mktemp -d`` makes one, mode 700) hides the venv and the
    examples from every other account."""
    if os.geteuid() != 0 or all(_world_traversable(p) for p in (folder, *folder.parents)):
        return folder
    root = Path(tempfile.gettempdir(), f"gpupool-job-test-{os.getpid()}")
    if not root.exists():
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    shared = Path(root, *folder.parts[1:])
    for name in names:
        source = folder / name
        if not (shared / name).exists():
            shared.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, shared / name)
            else:
                shutil.copy2(source, shared / name)
    for path in (shared, *shared.parents):
        if path == Path(tempfile.gettempdir()):
            break
        path.chmod(0o755)
    return shared


def _world_traversable(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IXOTH)
