"""The one unprivileged account that ``gpupool up`` runs user code as when it is started as root.

The demo hub has no system users (its login is a shared password), so as root it would otherwise start every
server, and refuse every job, as root. Instead the servers and jobs of every hub user run as the system account
``gpupool-demo``, made on first start, each user in a home of their own below the account's home (``0700``,
so other local accounts cannot read notebooks). The demo keeps its users apart by login only: a shared server
with system users is what the production configuration is for.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DEMO_ACCOUNT = "gpupool-demo"
DEMO_HOME = Path("/var/lib/gpupool-demo")


class AccountError(RuntimeError):
    """The account cannot be made or used; the message says what to do instead."""


@dataclass(frozen=True)
class Account:
    """A system account user code runs as; users' homes are ``homes/<user>``."""

    name: str
    uid: int
    gid: int
    homes: str


def ensure_account(name: str = DEMO_ACCOUNT, home: Path = DEMO_HOME) -> tuple[Account, bool]:
    """The account ``name``, made with ``useradd`` when missing (no password, no login shell); True when it
    was made now. Its home exists, is its own and is private whether or not it was just made."""
    entry = _entry(name)
    made = entry is None
    if entry is None:
        _useradd(name, home)
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise AccountError(f"the account {name} is a root account (uid 0); user code never runs as root")
    homes = Path(entry.pw_dir)
    homes.mkdir(parents=True, exist_ok=True)
    os.chown(homes, entry.pw_uid, entry.pw_gid)
    homes.chmod(0o700)
    return Account(name, entry.pw_uid, entry.pw_gid, str(homes)), made


def _useradd(name: str, home: Path) -> None:
    useradd = shutil.which("useradd")
    if useradd is None:
        raise AccountError(
            f"gpupool up runs as root, so it runs servers and jobs as the system account {name}, and useradd "
            f"is not here to make it: create {name} (home {home}), or run gpupool up as an unprivileged user"
        )
    nologin = shutil.which("nologin") or "/bin/false"
    options = ["--system", "--user-group", "--create-home", "--home-dir", str(home), "--shell", nologin]
    comment = "gpupool up, servers and jobs of the demo hub"  # no ':' in a GECOS field
    result = subprocess.run(
        [useradd, *options, "--comment", comment, name],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 and _entry(name) is None:  # another start may have made it meanwhile
        raise AccountError(f"could not create the system account {name}: {result.stderr.strip()}")


def _entry(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None
