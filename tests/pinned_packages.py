"""Other versions of a few packages over this venv's: ``pip install --no-deps --target`` into a cache folder,
put first on ``PYTHONPATH`` by the tests that run gpupool under JupyterHub versions other than the venv's (the
5.x of Zero to JupyterHub's hub image). Made once per set of pins (``GPUPOOL_PINS_CACHE``, default
``~/.cache/gpupool/pins``), from the package index like ``make test``'s own installs."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

CACHE = Path(os.environ.get("GPUPOOL_PINS_CACHE") or Path.home() / ".cache" / "gpupool" / "pins")


def pinned(requirements: Sequence[str]) -> Path:
    """A folder holding exactly ``requirements`` (``name==version``), without their dependencies."""
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]
    folder = CACHE / key
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test workers wait for one install
        if (folder / ".complete").exists():
            return folder
        partial = folder.with_name(f"{key}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial)]
        result = subprocess.run([*command, *requirements], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"pip could not install {' '.join(requirements)}:\n{result.stderr[-2000:]}")
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
        (folder / ".complete").write_text("\n".join(requirements) + "\n")
    return folder


def installed_over(requirements_txt: Path, names: Sequence[str]) -> list[str]:
    """What ``pip install jupyterhub-gpupool`` leaves of ``names`` in an image built from a pip-compiled
    requirements file: its pin, unless gpupool's own requirements exclude that version, when pip upgrades it
    (to the version this venv has, which satisfies them)."""
    needs = {
        (requirement := Requirement(text)).name.lower(): requirement.specifier
        for text in metadata.requires("jupyterhub-gpupool") or []
        if "extra ==" not in text
    }
    wanted = {name.lower() for name in names}
    pins = []
    for line in requirements_txt.read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        name, version = name.strip().lower(), version.strip()
        if not version or name not in wanted:
            continue
        if name in needs and not needs[name].contains(version):
            version = metadata.version(name)
        pins.append(f"{name}=={version}")
    return sorted(pins)
