"""The local job runner: start a job's command as its user in a process group of its own, find it again after
a restart, signal it, and read what it left (exit status, log).

Identity. "Runs as the user, never as root": when the service runs as root, a job runs as its user's system
account (``pwd``), with that account's groups, and a user without one (or whose account is root) is refused
with :class:`NoSystemAccount`. With ``account_per_user`` (``gpupool up`` as root) each user's jobs run as an
account gpupool makes for them, in ``home_root/<user>``, as the embedded hub's servers do (see
``user_accounts``); given one ``account``, every user's as that one instead. When the service is
not root, jobs run as the service's own user, the simple single-machine mode that
:class:`~...hub.spawner.SimpleLocalGPUSpawner` is for servers; homes are then ``home_root/<user>``.

Files. Each job has a directory in its user's home, ``~/.gpupool/jobs/<id>/``, made by the job's own process
as the user (so the service never writes into a home as root): ``output.log`` (stdout and stderr, appended by
every attempt, private to the user), ``checkpoint/`` (``GPUPOOL_CHECKPOINT_DIR``, the same for every attempt)
and ``exit.<attempt>`` (the command's exit status). The job writes its log itself, so nothing is lost while the
service is down; the service only reads it, refusing symlinks and files the user does not own.

The process: ``/bin/sh`` as the group leader (a fixed script; the command's arguments are passed to it as
positional parameters and never parsed by the shell) runs the command, then records its exit status. The
group is identified by the leader's pid plus its start time from ``/proc/<pid>/stat``, and, once the leader
is gone, by members whose environment carries the job's ``GPUPOOL_JOB_ID``: a reused pid is never mistaken
for the job.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ...device_env import device_env
from ...limits import Cgroup
from ...user_accounts import (
    DEFAULT_HOMES,
    AccountError,
    account_name,
    ensure_user_account,
    live_uids,
    make_private_home,
)

JOBS_SUBDIR = ".gpupool/jobs"
LOG_NAME = "output.log"
# not "checkpoints": Jupyter Server routes `<path>/checkpoints` to its own file checkpoints, so JupyterLab could
# not open a folder of that name
CHECKPOINTS = "checkpoint"
# $1 job dir, $2 working dir, $3 attempt, then the command. It first waits for the service to close its
# stdin, which the service does once the script is in the job's control group: nothing runs outside it. The
# log and the checkpoint directory are private to the user (umask 077 in a subshell only: the command keeps
# the umask it would have had). After an earlier attempt's output, a line in the log marks where the next
# attempt begins.
ATTEMPT_MARK = "----- gpupool: attempt "  # how gpupool's line before a requeued attempt's output begins
_SCRIPT = (
    "read -r gpupool_gate || :\n"
    '(umask 077 && mkdir -p -- "$1/checkpoint" && : >>"$1/output.log") || exit 125\n'
    'exec >>"$1/output.log" 2>&1 </dev/null\n'
    '[ "$3" = 1 ] || [ ! -s "$1/output.log" ] || '
    f'echo "{ATTEMPT_MARK}$3 of this job starts (it was requeued) -----"\n'
    'cd -- "$2" || exit 126\n'
    "gpupool_dir=$1; gpupool_attempt=$3; shift 3\n"
    '"$@"\n'
    'echo $? >"$gpupool_dir/exit.$gpupool_attempt"\n'
)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# What the script's own exit statuses mean: it could not make the job's files, or not enter the working
# directory, as the user (the command never ran, so there is no exit file to say so).
START_FAILURES = {
    125: "the job could not create its folder {job_dir} or its log there as the account {user}'s jobs run "
    "as: the nearest folder above it that exists must be writable by that account",
    126: "the job could not enter its working directory {working_dir} as {user}",
}


class NoSystemAccount(AccountError):
    """The service runs as root and the user has no system account to run a job as (or it is root's); its
    base, :class:`AccountError`, also covers an account or home gpupool could not make."""


@dataclass(frozen=True)
class Identity:
    """Who a job runs as: ``uid`` None means the service's own user (the simple local mode)."""

    user: str
    home: str
    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] = ()
    kept_home: bool = field(default=False, compare=False)  # a home gpupool keeps, not a system account's


def identity_for(
    user: str,
    *,
    home_root: str | None = None,
    account: str | None = None,
    account_per_user: bool = False,
    euid: int | None = None,
) -> Identity:
    """The identity a job of ``user`` runs with, by the rule in the module docstring."""
    if "/" in user:  # a deleted user's filed-away records ("grace/deleted …"): nobody runs, or has a home, so
        raise NoSystemAccount(f"{user} is a deleted hub user: nothing runs as them")
    euid = os.geteuid() if euid is None else euid
    if euid == 0 and account_per_user:
        return _own_account_identity(user, home_root)
    if euid == 0 and account:
        return _shared_account_identity(user, account, home_root)
    if euid != 0:
        if home_root:
            return Identity(user, os.path.join(home_root, user), kept_home=True)
        try:
            return Identity(user, pwd.getpwnam(user).pw_dir)
        except KeyError:
            raise NoSystemAccount(
                f"{user} has no home on this host: set GPUPOOL_JOB_HOME_ROOT to run jobs in "
                "<home_root>/<user> as the service's own user"
            ) from None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise NoSystemAccount(
            f"{user} has no system account on this host; the service runs as root and runs jobs only as "
            "their user's own account, so an administrator must create one (useradd)"
        ) from None
    if entry.pw_uid == 0:
        raise NoSystemAccount(f"{user} is a root account here; jobs never run as root")
    groups = tuple(g for g in os.getgrouplist(user, entry.pw_gid) if g != entry.pw_gid)
    return Identity(user, entry.pw_dir, entry.pw_uid, entry.pw_gid, groups)


def job_uid(user: str, *, account: str | None = None, account_per_user: bool = False) -> int | None:
    """The uid ``user``'s jobs run as, by the rule of :func:`identity_for`, looked up without making an account
    or a home (a deleted user's must not come back): None when that account does not exist."""
    if os.geteuid() != 0:
        return os.geteuid()
    name = account_name(user) if account_per_user else account or user
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def _shared_account_identity(user: str, account: str, home_root: str | None) -> Identity:
    """``user``'s jobs as the one unprivileged ``account``, in ``home_root/<user>`` (default: under the
    account's own home)."""
    try:
        entry = pwd.getpwnam(account)
    except KeyError:
        raise NoSystemAccount(
            f"the account {account} that runs every user's jobs does not exist on this host"
        ) from None
    if entry.pw_uid == 0:
        raise NoSystemAccount(f"{account} is a root account here; jobs never run as root")
    home = os.path.join(home_root or entry.pw_dir, user)
    return Identity(user, home, entry.pw_uid, entry.pw_gid, kept_home=True)


def _own_account_identity(user: str, home_root: str | None) -> Identity:
    """``user``'s jobs as the account gpupool keeps for them (made now if need be), in their home."""
    own = ensure_user_account(user, home_root or DEFAULT_HOMES)
    return Identity(user, own.home, own.uid, own.gid, kept_home=True)


def make_home(identity: Identity) -> None:
    """Create a home gpupool keeps if it is missing: private (0700), and its owner's when it has a uid (set
    through the folder, never a path a link could redirect). A system account's home is the system's."""
    if not identity.kept_home:
        return
    if identity.uid is None or os.geteuid() != 0:
        os.makedirs(identity.home, 0o700, exist_ok=True)
        return
    os.makedirs(os.path.dirname(identity.home), exist_ok=True)
    make_private_home(identity.home, identity.uid, identity.gid if identity.gid is not None else -1)


def job_dir(identity: Identity, job_id: str) -> str:
    return os.path.join(identity.home, JOBS_SUBDIR, job_id)


def checkpoint_dir(directory: str) -> str:
    return os.path.join(directory, CHECKPOINTS)


def job_env(
    identity: Identity,
    job_id: str,
    directory: str,
    visible_devices: str,
    user_env: Mapping[str, str],
    *,
    attempt: int,
    path: str | None = None,
) -> dict[str, str]:
    """The job's whole environment: a clean login-like base, the user's variables, then what gpupool sets (the
    lease's devices and the job's id and checkpoint directory), which the user cannot override."""
    base = {
        "PATH": path or os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": identity.home,
        "USER": identity.user,
        "LOGNAME": identity.user,
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",  # a Python job's prints reach its log as they happen
    }
    return {
        **base,
        **user_env,
        **device_env(visible_devices),
        "GPUPOOL_JOB_ID": job_id,
        "GPUPOOL_JOB_ATTEMPT": str(attempt),
        "GPUPOOL_CHECKPOINT_DIR": checkpoint_dir(directory),
    }


@dataclass(frozen=True)
class Started:
    """A run just started: the group leader's pid and start time, and the Popen to reap it with."""

    pid: int
    start: int
    process: subprocess.Popen[bytes]


def launch(
    identity: Identity,
    command: tuple[str, ...],
    working_dir: str,
    directory: str,
    attempt: int,
    env: Mapping[str, str],
    cgroup: Cgroup | None = None,
) -> Started:
    """Start ``command`` (an argument list) as ``identity`` in a new session, in ``cgroup`` when given;
    OSError if it cannot start."""
    switch = identity.uid is not None  # as root: the user's account, its group and its other groups
    process = subprocess.Popen(
        ["/bin/sh", "-c", _SCRIPT, "gpupool-job", directory, working_dir, str(attempt), *command],
        env=dict(env),
        cwd="/",  # the script changes to the working directory as the user, so the user's rights apply
        stdin=subprocess.PIPE,  # the gate: the script waits for its end (see _SCRIPT)
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        user=identity.uid,
        group=identity.gid,
        extra_groups=list(identity.groups) if switch else None,
    )
    assert process.stdin is not None
    try:
        if cgroup is not None:
            cgroup.add(process.pid)
    except OSError:
        process.kill()
        process.wait()
        raise
    finally:
        process.stdin.close()  # open the gate
    start = _stat(process.pid)
    return Started(process.pid, start[1] if start else 0, process)


# ---- finding and signalling a process group ---------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, start time in ticks since boot, process group) of ``pid``, or None when there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # the name in parentheses may hold spaces
    return fields[0].decode(), int(fields[19]), int(fields[2])


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None when it is gone or a zombie."""
    found = _stat(pid)
    return None if found is None or found[0] in ("Z", "X") else found[1]


def group_alive(pid: int, pid_start: int | None, job_id: str) -> bool:
    """Whether the job's process group (led by ``pid``) still has a live member: the leader itself (same start
    time), or a process in group ``pid`` whose environment names ``job_id``. Zombies do not count."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    marker = f"GPUPOOL_JOB_ID={job_id}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        member = int(entry.name)
        found = _stat(member)
        if found is None or found[2] != pid or found[0] in ("Z", "X"):
            continue
        if member == pid and pid_start is not None and found[1] == pid_start:
            return True
        with contextlib.suppress(OSError):
            if _environ_holds(member, marker):
                return True
    return False


def find_leader(job_id: str, attempt: int, uid: int) -> tuple[int, int] | None:
    """(pid, start time) of the live group leader of ``job_id``'s run ``attempt``, found by its environment:
    for a run whose start the service could not record before it died. Only a process of ``uid``, the account
    the job runs as, counts: another user's process may set the same variables (where every user's jobs run as
    one account, as without per-user accounts, that tells no user from another)."""
    marker = f"GPUPOOL_JOB_ID={job_id}".encode()
    attempt_marker = f"GPUPOOL_JOB_ATTEMPT={attempt}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        found = _stat(pid)
        if found is None or found[2] != pid or found[0] in ("Z", "X"):
            continue
        with contextlib.suppress(OSError):
            if uid in live_uids(pid) and _environ_holds(pid, marker, attempt_marker):
                return pid, found[1]
    return None


def _environ_holds(pid: int, *variables: bytes) -> bool:
    """Whether ``pid``'s environment has each of ``variables`` (``NAME=value``) as a variable of its own: a
    job's ``env`` value that only spells one (``A=GPUPOOL_JOB_ID=<another job's id>``, from a hostile-user
    trial) does not make its process another job's."""
    held = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
    return all(variable in held for variable in variables)


def signal_group(pid: int, pid_start: int | None, job_id: str, sig: signal.Signals) -> bool:
    """Send ``sig`` to the job's process group if it is still the job's; whether it was sent."""
    if not group_alive(pid, pid_start, job_id):
        return False
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    return True


# ---- what a run leaves --------------------------------------------------------------------------------------


def _open_owned(path: str, uid: int | None) -> int | None:
    """A read-only descriptor of ``path`` if it is a regular file (not a symlink) owned by ``uid`` (any owner
    when None); None otherwise. The service may be root reading a user's home: it reads only their files."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (uid is not None and info.st_uid != uid):
        os.close(fd)
        return None
    return fd


def exit_status(directory: str, attempt: int, uid: int | None) -> int | None:
    """The exit status the run recorded, or None (killed before it could, or never started)."""
    fd = _open_owned(os.path.join(directory, f"exit.{attempt}"), uid)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as file:
        text = file.read(32).strip()
    return int(text) if text.isdigit() else None


def read_log(directory: str, uid: int | None, offset: int = 0, limit: int = 1 << 20) -> bytes:
    """Up to ``limit`` bytes of the job's log from ``offset``; empty when there is none (yet)."""
    fd = _open_owned(os.path.join(directory, LOG_NAME), uid)
    if fd is None:
        return b""
    with os.fdopen(fd, "rb") as file:
        file.seek(offset)
        return file.read(limit)


def find_executable(command: str, working_dir: str, path: str, identity: Identity) -> str | None:
    """Where ``command`` (a name looked up on ``path``, or a path relative to ``working_dir``) is, as a file
    ``identity`` may run, or None. Judged as that account, not the service: a service running as root
    would otherwise tell a user which files exist in folders closed to them."""
    if "/" in command:
        full = os.path.join(working_dir, command)
        return full if runnable_by(full, identity) else None
    for folder in path.split(os.pathsep):
        full = os.path.join(folder or ".", command)
        if runnable_by(full, identity):
            return full
    return None


def runnable_by(path: str, identity: Identity) -> bool:
    """Whether ``identity`` may execute the regular file ``path``: every folder on the way, as written and
    with links resolved, searchable and the file executable, by the permission bits (ACLs aside)."""
    if identity.uid is None:  # the service's own account: the kernel answers for it
        return os.path.isfile(path) and os.access(path, os.X_OK)
    written, resolved = os.path.abspath(path), os.path.realpath(path)
    try:
        folders = {os.stat(folder) for name in (written, resolved) for folder in _folders_above(name)}
        target = os.stat(resolved)
    except OSError:
        return False
    searchable = all(_allows(folder, identity) for folder in folders)
    return searchable and stat.S_ISREG(target.st_mode) and _allows(target, identity)


def _folders_above(path: str) -> list[str]:
    folders = []
    while (parent := os.path.dirname(path)) != path:
        folders.append(parent)
        path = parent
    return folders


def _allows(entry: os.stat_result, identity: Identity) -> bool:
    """The execute (for a folder: search) bit of the class ``identity`` falls in: owner, group or other."""
    if entry.st_uid == identity.uid:
        return bool(entry.st_mode & stat.S_IXUSR)
    if entry.st_gid == identity.gid or entry.st_gid in identity.groups:
        return bool(entry.st_mode & stat.S_IXGRP)
    return bool(entry.st_mode & stat.S_IXOTH)
