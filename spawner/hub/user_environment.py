"""A Python environment every account can run: the demo hub's servers and jobs when it is started as root.

A server that runs as a user's own account (``gp-<name>``) must execute a Python with JupyterHub, JupyterLab and
gpupool's widgets. The environment ``gpupool up`` runs from is often out of such an account's reach: a venv
inside a private folder (``/root``, a ``mktemp -d`` checkout) or on top of root's pyenv. Then one is built in a
root-owned folder that every account can read, ``/opt/gpupool-demo/env``, from a system Python every account
can run, with this hub's versions of JupyterHub, JupyterLab and ipywidgets and with gpupool from this checkout.
It is built once (pip, from the package index), and only gpupool is reinstalled when the checkout changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# Not below /opt/gpupool, which is `gpupool install`'s: uninstalling that must neither remove the demo's
# environment nor refuse because a demo hub runs from it.
DEMO_ENV = Path("/opt/gpupool-demo/env")
# The hub and its single-user servers speak one JupyterHub version; the widgets' front end and kernel side one
# ipywidgets version.
PINNED = ("jupyterhub", "jupyterlab", "ipywidgets")
# What a build of gpupool reads from the checkout (pyproject's package-dir and readme).
SOURCE_PARTS = ("pyproject.toml", "README.md", "spawner", "widgets", "hub_config")
STAMP = ".gpupool-build.json"
# What a server and a job import, checked once the environment is built as an account that owns nothing and
# belongs to no group (nobody's ids): what it can run, every user's account can.
SMOKE_IMPORTS = "import jupyterhub.singleuser, jupyterlab, ipykernel, gpupool.widgets"
NOBODY = 65534


class UserEnvironmentError(RuntimeError):
    """No environment every account can run could be found or built; the message says why."""


@dataclass(frozen=True)
class UserEnvironment:
    """Where the accounts' ``python`` and ``jupyterhub-singleuser`` are."""

    bin: Path


def ensure_user_environment(
    source: Path,
    prefix: Path = DEMO_ENV,
    say: Callable[[str], None] = print,
) -> UserEnvironment:
    """This environment when every account can reach all of it; else the one at ``prefix``, built or brought up
    to date first (saying so with ``say``, since a first build takes a while)."""
    if _reachable_by_everyone(_current_environment_paths()):
        return UserEnvironment(Path(sys.executable).parent)
    if not (source / "pyproject.toml").is_file():
        raise UserEnvironmentError(
            f"other accounts cannot run this Python ({sys.executable}), and there is no gpupool checkout to build "
            f"an environment from: install gpupool where every account can run it"
        )
    return build_environment(source, prefix, say)


def lock_file(prefix: Path) -> Path:
    """What builds of the environment at ``prefix`` take turns on: a file beside it (removing it goes with
    removing the environment)."""
    return prefix.parent / f".{prefix.name}.lock"


def build_environment(source: Path, prefix: Path, say: Callable[[str], None] = print) -> UserEnvironment:
    """The environment at ``prefix`` with gpupool from the checkout ``source``: built, or brought up to date
    first, then checked by importing what servers and jobs import as nobody."""
    wanted = {"source": _source_digest(source), "pins": _pins()}
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.parent.chmod(0o755)  # its folder (/opt/gpupool-demo): every account enters it, whatever the umask
    with _locked(lock_file(prefix)):
        python = prefix / "bin" / "python"
        built = _read_stamp(prefix)
        if python.exists() and built == wanted:
            return UserEnvironment(python.parent)
        if not python.exists() or built.get("pins") != wanted["pins"]:
            say(f"gpupool: building a Python environment every account can run, in {prefix} (once; pip)")
            shutil.rmtree(prefix, ignore_errors=True)
            _run([_base_python(), "-m", "venv", str(prefix)])
            _run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
            _install_gpupool(python, source, with_dependencies=True)
        else:
            say(f"gpupool: updating gpupool in {prefix} from {source}")
            _install_gpupool(python, source, with_dependencies=False)
        _check_as([str(python), "-c", SMOKE_IMPORTS])
        (prefix / STAMP).write_text(json.dumps(wanted))
    return UserEnvironment(python.parent)


def _current_environment_paths() -> list[Path]:
    return [
        Path(os.path.realpath(sys.executable)),
        Path(sysconfig.get_paths()["purelib"]),
        Path(__file__).resolve().parents[1],  # gpupool itself (the checkout, when installed editable)
    ]


def _reachable_by_everyone(paths: list[Path]) -> bool:
    """Every folder on the way to each path may be entered by any account (no private folder above it)."""
    return all(os.stat(folder).st_mode & 0o001 for path in paths for folder in path.parents)


def _source_digest(source: Path) -> str:
    digest = hashlib.sha256()
    for part in SOURCE_PARTS:
        root = source / part
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        for file in files:
            if file.is_file() and "__pycache__" not in file.parts:
                digest.update(str(file.relative_to(source)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def _pins() -> list[str]:
    return [f"{name}=={metadata.version(name)}" for name in PINNED]


def _read_stamp(prefix: Path) -> dict[str, object]:
    try:
        return dict(json.loads((prefix / STAMP).read_text()))
    except (OSError, ValueError):
        return {}


def _install_gpupool(python: Path, source: Path, *, with_dependencies: bool) -> None:
    """pip-install gpupool from a copy of the checkout's package files: a build in the checkout would leave
    root-owned ``build/`` folders there, whose stale modules later builds would pick up."""
    with tempfile.TemporaryDirectory(prefix="gpupool-build-") as scratch:
        copy = Path(scratch, "gpupool")
        for part in SOURCE_PARTS:
            if (source / part).is_dir():
                shutil.copytree(source / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                copy.mkdir(exist_ok=True)
                shutil.copy2(source / part, copy / part)
        install = [str(python), "-m", "pip", "install", "--quiet", str(copy)]
        if with_dependencies:
            _run([*install, *_pins()])
        else:
            _run([*install, "--no-deps", "--force-reinstall"])


def _base_python() -> str:
    """A Python 3.11+ with ``venv`` that every account can run: this one's base interpreter, else the system's."""
    minor = f"python3.{sys.version_info.minor}"
    candidates = [
        os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
        f"/usr/bin/{minor}",
        f"/usr/local/bin/{minor}",
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ]
    check = "import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))"
    for candidate in dict.fromkeys(candidates):
        if os.path.exists(candidate) and _as([candidate, "-c", check]).returncode == 0:
            return candidate
    raise UserEnvironmentError(
        f"no Python 3.11 or later with venv that every account can run (tried {', '.join(candidates)}): "
        "install one for every account (Debian: apt-get install python3-venv), or run gpupool up as an "
        "unprivileged user"
    )


def _check_as(command: list[str]) -> None:
    result = _as(command)
    if result.returncode != 0:
        raise UserEnvironmentError(
            f"an unprivileged account cannot run the environment it was given: {result.stderr[-2000:]}"
        )


def _as(command: list[str]) -> subprocess.CompletedProcess[str]:
    """``command`` run as nobody; a program it may not execute is a failure like any other."""
    try:
        return subprocess.run(
            command,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            cwd="/",
            env=_clean_env(),
            capture_output=True,
            text=True,
        )
    except OSError as error:
        return subprocess.CompletedProcess(command, 126, "", str(error))


def _run(command: list[str]) -> None:
    """A build step as root with files every account may read (umask 022)."""
    result = subprocess.run(command, env=_clean_env(), umask=0o022, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise UserEnvironmentError(f"building the environment failed at `{' '.join(command[:4])} …`:\n{tail}")


def _clean_env() -> dict[str, str]:
    """This process's environment less what would make another Python use this one's packages."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONUSERBASE")
    return {key: value for key, value in os.environ.items() if key not in drop}


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build at a time across processes (parallel starts wait for the first)."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
