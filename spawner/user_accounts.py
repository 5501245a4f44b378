"""A system account of its own for each hub user, when a hub without system users runs as root.

``gpupool up``'s hub logs users in by a shared password: they have no accounts on the host. Run as root, it
must not start their code as root, and it must not start everyone's code as one account either: processes of
one uid read each other's environment (the hub token in ``/proc/<pid>/environ``), files and kernels, so any
user could act as any other. So each hub user gets an account, ``gp-<name>``, made with ``useradd`` when their
first server or job starts (no password, no login shell), and a private home ``<homes>/<name>`` that only that
account may enter. The folder of the homes is root's: no user's code can rename a home or put a link in its
place while root is preparing it.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass

# Where gpupool up keeps the homes of a hub started as root (a folder of root's, one home in it per user).
DEFAULT_HOMES = "/var/lib/gpupool-demo"
PREFIX = "gp-"
NAME_LIMIT = 32  # useradd's longest name
# The hub user an account belongs to, in its comment field: a look-alike account made by someone else (or
# another user's name that maps to the same account name) is refused, never run as.
TAG = "gpupool user "
# A retired account's name, before its uid: no hub user's account name has this form (``account_name``'s
# digests are ten characters after the dot), so a retired account is never run as again.
RETIRED = PREFIX + "retired."
# Where useradd and nologin are, whatever PATH the hub or the service was given (users' Python first).
SYSTEM_PATH = "/usr/sbin:/sbin:/usr/bin:/bin"
_SIMPLE = re.compile(r"[a-z][a-z0-9_-]*")


class AccountError(RuntimeError):
    """The account cannot be made or used; the message says what to do instead."""


@dataclass(frozen=True)
class UserAccount:
    """The system account a hub user's servers and jobs run as, and their home."""

    name: str
    uid: int
    gid: int
    home: str


def account_name(user: str) -> str:
    """``gp-<user>`` for a name useradd takes as it is; otherwise a readable part of it and a digest after a
    ``.``, which no such plain name holds: two hub users never map to one account, nor can one take the
    other's first."""
    if _SIMPLE.fullmatch(user) and len(PREFIX) + len(user) <= NAME_LIMIT:
        return PREFIX + user
    readable = re.sub(r"[^a-z0-9]+", "-", user.lower()).strip("-")[:16]
    return f"{PREFIX}{readable}.{_digest(user)}"


def ensure_user_account(user: str, homes: str) -> UserAccount:
    """``user``'s account (made when missing) and its private home ``homes/<user>`` (made when missing,
    its own, ``0700``), in a folder of homes that is root's (:func:`prepare_homes`)."""
    home = os.path.join(homes, user)
    if os.path.dirname(os.path.normpath(home)) != os.path.normpath(homes):
        raise AccountError(f"a hub user name cannot be a path: {user!r}")
    name = account_name(user)
    prepare_homes(homes)
    entry = _entry(name) or _useradd(name, user, home)
    if entry.pw_gecos != TAG + _digest(user):
        raise AccountError(
            f"the system account {name} exists and was not made by gpupool for the hub user {user}: "
            "remove or rename it, or rename the hub user"
        )
    if entry.pw_uid == 0:
        raise AccountError(f"the account {name} is a root account (uid 0); user code never runs as root")
    make_private_home(home, entry.pw_uid, entry.pw_gid)
    return UserAccount(name, entry.pw_uid, entry.pw_gid, home)


def prepare_homes(homes: str) -> None:
    """The folder of the homes: made when missing, root's and ``0711`` (each account enters its own home, no
    account lists or renames the others')."""
    os.makedirs(homes, exist_ok=True)
    if os.path.islink(homes):
        raise AccountError(f"the folder of users' homes {homes} is a symbolic link; make it a folder")
    os.chown(homes, 0, 0, follow_symlinks=False)
    os.chmod(homes, 0o711)


def make_private_home(home: str, uid: int, gid: int) -> None:
    """``home`` as a folder owned by ``uid`` alone: made when missing, refused when something else stands
    there. Ownership is set through the opened folder, never a path a link could redirect; a home kept by an
    earlier version's shared account is handed over, contents and all."""
    made = False
    with contextlib.suppress(FileExistsError):
        os.mkdir(home, 0o700)
        made = True
    try:
        descriptor = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as error:
        raise AccountError(f"{home} is not a folder gpupool can use as a home ({error.strerror})") from None
    try:
        owner = os.fstat(descriptor).st_uid
        if owner != uid and not made:
            _hand_over(descriptor, home, owner, uid, gid)
        os.fchown(descriptor, uid, gid)
        os.fchmod(descriptor, 0o700)
    finally:
        os.close(descriptor)


def _hand_over(descriptor: int, home: str, owner: int, uid: int, gid: int) -> None:
    """Give what ``owner`` (a former shared account, never root) holds in the home to ``uid``; symbolic links
    are changed themselves, never followed, and a file with another name elsewhere (a hard link, which any
    user of the shared account could make to another's file) stays as it is."""
    if owner == 0:
        raise AccountError(f"{home} belongs to root; gpupool does not hand a root folder to a user")
    for root, folders, files in os.walk(f"/proc/self/fd/{descriptor}", followlinks=False):
        for name in folders + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            # a file with another name elsewhere may be another user's, linked here under the shared account
            linked = info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode)
            if info.st_uid == owner and not linked:
                os.chown(path, uid, gid, follow_symlinks=False)


def retire_user_account(user: str, homes: str) -> str | None:
    """When the hub deletes ``user``: their home moves to ``homes/.deleted/<user>-<time>`` (root's alone), the
    account is retired, never removed (its tag gone, locked, then renamed ``gp-retired.<uid>``), and what still
    runs as it is killed. A new hub user of the same name then gets a new account with a new uid, and no later
    account is ever given this uid (``userdel`` freed it, and the next ``useradd`` took it with the old user's
    files in ``/tmp`` and wherever else they had written). What is left to an administrator, in words (None
    when nothing is)."""
    home, attic = os.path.join(homes, user), os.path.join(homes, ".deleted")
    if os.path.isdir(home) and not os.path.islink(home):
        os.makedirs(attic, 0o700, exist_ok=True)
        os.chown(attic, 0, 0, follow_symlinks=False)
        os.chmod(attic, 0o700)
        os.rename(home, os.path.join(attic, f"{user}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"))
    name = account_name(user)
    entry = _entry(name)
    if entry is None or entry.pw_gecos != TAG + _digest(user):
        return None
    if entry.pw_uid == 0:  # never made so (ensure_user_account refuses it); never kill root's processes
        return f"the account {name} is a root account (uid 0); it stays as it was"
    usermod = shutil.which("usermod", path=SYSTEM_PATH) or "usermod"
    nologin = shutil.which("nologin", path=SYSTEM_PATH) or "/bin/false"
    # Untagged and locked first, which usermod does with processes still running: should the rename below
    # fail, the account is no longer this user's, and a new user of the name is refused it, never given it.
    untag = ["--comment", f"gpupool retired account of a deleted hub user ({_digest(user)})"]
    result = _locked_retry([usermod, *untag, "--lock", "--expiredate", "1", "--shell", nologin, name])
    if result.returncode != 0:
        return f"the account {name} stays as it was: {result.stderr.strip()}"
    _end_processes(entry.pw_uid)
    retired = f"{RETIRED}{entry.pw_uid}"
    result = _locked_retry([usermod, "--login", retired, name])
    if result.returncode != 0:
        return f"the account {name} stays, retired but not renamed: {result.stderr.strip()}"
    group = _group(entry.pw_gid)
    if group == name:  # useradd --user-group made it; its name is free for the new account's group
        groupmod = shutil.which("groupmod", path=SYSTEM_PATH) or "groupmod"
        result = _locked_retry([groupmod, "--new-name", retired, name])
        if result.returncode != 0:
            return f"the group {name} stays: {result.stderr.strip()}"
    return None


def _end_processes(uid: int, wait_s: float = 5.0) -> None:
    """SIGKILL every process whose real or effective uid is ``uid`` (never 0), and wait (a while) until none is
    left: the account cannot be renamed while one runs, and nothing of a deleted user should. Each is
    signalled through a pidfd opened before its uid is read, so a pid reused meanwhile is never signalled."""
    deadline = time.monotonic() + wait_s
    while True:
        running = [pid for pid in _pids() if uid in live_uids(pid)]
        if not running or time.monotonic() > deadline:
            return
        for pid in running:
            with contextlib.suppress(OSError):
                descriptor = os.pidfd_open(pid)
                try:
                    if uid in live_uids(pid):
                        signal.pidfd_send_signal(descriptor, signal.SIGKILL)
                finally:
                    os.close(descriptor)
        time.sleep(0.05)


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def live_uids(pid: int) -> set[int]:
    """The real and effective uids of ``pid``; none for a zombie (nothing left to kill) or one gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:  # it ended meanwhile
        return set()
    if fields.get("State", "").strip().startswith(("Z", "X")):
        return set()
    return {int(uid) for uid in fields.get("Uid", "").split()[:2]}


def _group(gid: int) -> str | None:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return None


def _locked_retry(command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (useradd, usermod, groupmod), again while another process holds the passwd lock."""
    for _attempt in range(20):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode == 0 or "lock" not in result.stderr:
            return result
        time.sleep(0.1)
    return result


def _useradd(name: str, user: str, home: str) -> pwd.struct_passwd:
    useradd = shutil.which("useradd", path=SYSTEM_PATH)
    if useradd is None:
        raise AccountError(
            f"gpupool runs as root, so it runs {user}'s servers and jobs as a system account of their own, "
            f"{name}, and useradd is not here to make it: run gpupool as an unprivileged user instead"
        )
    nologin = shutil.which("nologin", path=SYSTEM_PATH) or "/bin/false"
    command = [
        useradd,
        "--system",
        "--user-group",
        "--no-create-home",
        "--home-dir",
        home,
        "--shell",
        nologin,
    ]
    for _attempt in range(20):  # another process (the hub or the service) may hold the passwd lock
        result = subprocess.run(
            [*command, "--comment", TAG + _digest(user), name], capture_output=True, text=True
        )
        entry = _entry(name)  # made now, or meanwhile by the other process
        if entry is not None:
            return entry
        if "lock" not in result.stderr:
            break
        time.sleep(0.1)
    raise AccountError(f"could not create the system account {name}: {result.stderr.strip()}")


def _entry(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _digest(user: str) -> str:
    return hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()[:10]
