"""``gpupool install`` and ``gpupool uninstall``: one lab GPU server, set up as an admin would by hand.

``install`` (as root, from a checkout) puts gpupool, JupyterHub, JupyterLab and configurable-http-proxy in
``/opt/gpupool`` where every account can run them: the hub, the service and every user's server and job use
that one environment. It writes ``/etc/gpupool`` (the production configuration, and the demo's profiles and
quotas marked as examples; files already there are kept), makes the state folder ``/var/lib/gpupool`` root's
alone, a launcher and the systemd unit that runs it, and the ``gpu-users`` group whose members may log in.
``uninstall`` removes the programs and the unit; ``--purge`` the configuration and the state too.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import shutil
import subprocess
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from . import install_files
from .install_files import Layout
from .user_environment import build_environment, lock_file

USERS_GROUP = "gpu-users"  # the production configuration's allowed_groups
PROXY_PACKAGE = "configurable-http-proxy@4"
SYSTEMD_RUNNING = Path("/run/systemd/system")  # exists exactly when systemd is PID 1 (sd_booted)


class InstallError(RuntimeError):
    """The install or uninstall cannot go on; the message says why and what to do."""


def install(layout: Layout, source: Path, *, simulated: bool, say: Callable[[str], None] = print) -> None:
    """Install from the checkout ``source``; ``simulated`` names the demo pool in the environment file."""
    _require_root("install")
    if not (source / "pyproject.toml").is_file():
        raise InstallError(f"{source} is not a gpupool checkout (no pyproject.toml): run it from a clone")
    build_environment(source, layout.env, say)
    _install_proxy(layout, say)
    _ensure_group(USERS_GROUP, say)
    _write_config(layout, simulated, say)
    _folder(layout.state.parent)
    layout.state.mkdir(exist_ok=True)
    os.chown(layout.state, 0, 0)
    layout.state.chmod(0o700)  # databases, the cookie secret and the service's token: root's alone
    _write(layout.launcher, install_files.launcher(layout), 0o755)
    _write(layout.unit, install_files.unit(layout), 0o644)
    if SYSTEMD_RUNNING.is_dir():
        subprocess.run(["systemctl", "daemon-reload"], check=False)
        start = f"systemctl enable --now {install_files.UNIT_NAME}"
    else:
        start = f"{layout.launcher}   (no systemd here: run it under your supervisor of choice)"
    say(
        f"gpupool: installed. Edit {layout.config}/ (the lines marked EDIT, the example profiles), then start:"
    )
    say(f"    {start}")
    say(f"Users in the {USERS_GROUP} group log in with their system passwords.")


def uninstall(layout: Layout, *, purge: bool, say: Callable[[str], None] = print) -> None:
    """Remove the programs and the unit (the configuration and state too with ``purge``), once nothing runs
    from them: a hub, or a user's server that outlived it."""
    _require_root("uninstall")
    running = _running_from(layout.prefix)  # first: stopping the hub now would strand its users' servers
    if running:
        listed = ", ".join(f"{pid} ({user})" for pid, user in running)
        raise InstallError(
            f"processes still run from {layout.prefix}: {listed}; stop users' servers (the admin panel's "
            f"Stop All), then the hub (systemctl stop {install_files.UNIT_NAME}), first"
        )
    if SYSTEMD_RUNNING.is_dir() and layout.unit.exists():
        subprocess.run(["systemctl", "disable", install_files.UNIT_NAME], check=False)
    for path in (layout.env, layout.node, layout.launcher.parent):
        shutil.rmtree(path, ignore_errors=True)
    layout.unit.unlink(missing_ok=True)
    lock_file(layout.env).unlink(missing_ok=True)
    if layout.prefix.is_dir() and not any(layout.prefix.iterdir()):
        layout.prefix.rmdir()
    store = _database_store(layout.environment_file)  # read before --purge removes its only record
    if purge:
        shutil.rmtree(layout.config, ignore_errors=True)
        shutil.rmtree(layout.state, ignore_errors=True)
        say(f"gpupool: removed, with {layout.config} and {layout.state}")
    else:
        say(f"gpupool: removed; kept {layout.config} and {layout.state} (--purge removes them)")
    say(f"The {USERS_GROUP} group is kept: its members may belong to it for other reasons.")
    if store:
        say(f"The lease store {store} is kept, with its role: drop them in PostgreSQL once no longer wanted.")


def _database_store(environment: Path) -> str | None:
    """The ``GPUPOOL_DB_URL`` of the environment file when it names a database server's store (password
    hidden), read as the launcher reads it (``export``, blanks and a pair of quotes dropped)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        lines = environment.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.strip().removeprefix("export ").partition("=")
        if key.strip() == "GPUPOOL_DB_URL" and (value := value.strip()):
            if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            try:
                url = make_url(value)
            except ArgumentError:
                return None
            return None if url.get_backend_name() == "sqlite" else url.render_as_string(hide_password=True)
    return None


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise InstallError(f"gpupool {what} writes to /opt, /etc and /var/lib: run it as root (sudo)")


def _install_proxy(layout: Layout, say: Callable[[str], None]) -> None:
    if (layout.proxy_bin / "configurable-http-proxy").exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError(
            "npm is missing (Debian: apt-get install npm): configurable-http-proxy comes from it"
        )
    say(f"gpupool: installing {PROXY_PACKAGE} into {layout.node} (npm)")
    command = [npm, "install", "--prefix", str(layout.node), "--no-audit", "--no-fund", PROXY_PACKAGE]
    result = subprocess.run(command, umask=0o022, capture_output=True, text=True)
    if result.returncode != 0:
        raise InstallError(f"npm could not install {PROXY_PACKAGE}:\n{result.stderr[-2000:]}")


def _ensure_group(name: str, say: Callable[[str], None]) -> None:
    try:
        grp.getgrnam(name)
    except KeyError:
        made = subprocess.run(["groupadd", "--system", name], capture_output=True, text=True)
        if made.returncode != 0:
            raise InstallError(f"groupadd could not make the group {name}: {made.stderr.strip()}") from None
        say(f"gpupool: made the group {name}; add users with: usermod -aG {name} USER")


def _write_config(layout: Layout, simulated: bool, say: Callable[[str], None]) -> None:
    """The admin's files, each written only when absent: a re-install never undoes an edit."""
    shipped = resources.files("gpupool.hub_config")
    pool = layout.config / "pool.yaml" if simulated else None
    files: dict[Path, tuple[str, int]] = {
        layout.hub_config: (shipped.joinpath("jupyterhub_config.py").read_text(), 0o644),
        layout.config / "profiles.yaml": (
            install_files.EXAMPLE_HEADER + shipped.joinpath("profiles.yaml").read_text(),
            0o644,
        ),
        layout.config / "quotas.yaml": (
            install_files.EXAMPLE_HEADER + shipped.joinpath("quotas.yaml").read_text(),
            0o644,
        ),
        layout.environment_file: (install_files.environment(layout, pool), 0o600),
    }
    if pool is not None:
        files[pool] = (shipped.joinpath("pools", "demo.yaml").read_text(), 0o644)
    _folder(layout.config)
    for path, (text, mode) in files.items():
        if path.exists():
            say(f"gpupool: kept {path} (yours)")
        else:
            _write(path, text, mode)
    if simulated and f"GPUPOOL_POOL={pool}" not in layout.environment_file.read_text():
        say(
            f"gpupool: {layout.environment_file} was kept and names no simulated pool: add GPUPOOL_POOL={pool}"
        )


def _write(path: Path, text: str, mode: int) -> None:
    """``text`` into ``path``, created with ``mode`` (never readable by others first, whatever the umask)."""
    _folder(path.parent)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), mode)
        file.write(text)


def _folder(path: Path) -> None:
    """``path`` and its parents, each one made here ``0755`` whatever root's umask."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir()
        folder.chmod(0o755)


def _running_from(prefix: Path) -> list[tuple[int, str]]:
    """Processes that run something under ``prefix``, with their users: its program or any argument there
    (a venv's python is a link to the system's, so a script's path counts), or ``prefix`` on its ``PATH`` (a
    job's ``python train.py``, started by a server that has the environment first)."""
    found = []
    marker = str(prefix).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
            environment = (entry / "environ").read_bytes().split(b"\0")
            uid = entry.stat().st_uid
        except OSError:
            continue
        path = next((v.removeprefix(b"PATH=").split(b":") for v in environment if v.startswith(b"PATH=")), [])
        if any(_under(folder, marker) for folder in (*path, *arguments)):
            found.append((int(entry.name), _user_name(uid)))
    return sorted(found)


def _under(path: bytes, prefix: bytes) -> bool:
    """Whether ``path`` is ``prefix`` or inside it: ``/opt/gpupool-demo`` is not inside ``/opt/gpupool``."""
    return path == prefix or path.startswith(prefix + b"/")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def add_install_commands(commands: Any) -> None:
    """``gpupool install`` and ``gpupool uninstall`` on the ``gpupool`` command line."""
    layout = Layout()
    install_parser = commands.add_parser(
        "install",
        help=f"as root: install gpupool for this host's users into {layout.prefix}, {layout.config}, "
        f"{layout.state} and a systemd unit",
    )
    install_parser.add_argument(
        "--simulated",
        action="store_true",
        help="serve the simulated demo pool (for a machine without GPUs; labelled simulated everywhere)",
    )
    install_parser.add_argument(
        "--source", default=".", metavar="DIR", help="the gpupool checkout to install (default: here)"
    )
    install_parser.set_defaults(handler=_install_command)
    uninstall_parser = commands.add_parser(
        "uninstall", help="as root: remove what gpupool install put in place"
    )
    uninstall_parser.add_argument(
        "--purge", action="store_true", help=f"also remove {layout.config} and {layout.state}"
    )
    uninstall_parser.set_defaults(handler=_uninstall_command)


def _install_command(args: argparse.Namespace) -> int:
    install(Layout(), Path(args.source).resolve(), simulated=args.simulated)
    return 0


def _uninstall_command(args: argparse.Namespace) -> int:
    uninstall(Layout(), purge=args.purge)
    return 0
