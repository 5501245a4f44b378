"""A job submission: what a user asks to run, checked before anything is stored (each problem an
:class:`InvalidJob` naming the field), and the job it becomes.

What is checked here needs the host (the user's home, the command on disk), so it lives in the service, not
the domain: the working directory must resolve (symlinks followed) inside the user's home, the command must
be an executable found from there, the environment may not set what gpupool sets, and the maximum runtime
must fit the profile's limit. A job that runs in a container (the Kubernetes runner: ``on_host=False``) names
paths inside it, which the service cannot look at: the working directory must then be the home in the
container or below it, as a plain path, and the command is looked up in the image when the job starts.
"""

from __future__ import annotations

import os
import posixpath
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ...pool.environments import ENV_VAR, FIELD, UnknownEnvironment, choose
from ...pool.job_states import DEFAULT_JOB_CLASS, PRIORITY_CLASSES, USER_JOB_CLASSES, Job
from ...pool.leases import Lease
from ...pool.profiles import Profile, format_duration
from ...pool.requests import Request
from .processes import Identity, find_executable

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
# What a name may not hold, by Unicode category: control characters (Cc), line and paragraph separators (Zl,
# Zp), and format characters (Cf: the marks that reverse or isolate the direction of what follows, U+061C
# among them, and invisible ones such as U+200B), except the joiners some scripts and emoji need.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp"})
_JOINERS = frozenset("\u200c\u200d")
_PYTHON = re.compile(r"python[0-9.]*")
MAX_ARGS = 1024
MAX_ARG_BYTES = 128 * 1024  # Linux's MAX_ARG_STRLEN: a longer argument fails only at execve (E2BIG)
MAX_ENV = 256
MAX_ENV_BYTES = 32 * 1024
# The command and env together, as stored and sent back with every GET jobs: a hostile-user trial stored 60
# jobs of 896 KiB each, and each of its listings then took 1.4 s and held up everyone's requests. A longer
# input belongs in a file the job reads.
MAX_TOTAL_BYTES = 64 * 1024


class TooManyQueuedJobs(ValueError):
    """The user already has as many jobs waiting as a user may; the message says how many."""


class SubmissionConflict(ValueError):
    """A submission id already used for a different job."""


def default_name(command: Sequence[str]) -> str:
    """A job's name when none is given: the program, or for ``python train.py`` (``python -m pkg.train``) the
    script (module) it runs, so a user's list does not read "python" on every line."""
    program = os.path.basename(command[0])
    rest = list(command[1:])
    if _PYTHON.fullmatch(program) and "-c" not in rest:
        if "-m" in rest[:-1]:
            return rest[rest.index("-m") + 1]
        script = next((arg for arg in rest if not arg.startswith("-")), None)
        if script is not None:
            return os.path.basename(script)
    return program


@dataclass(frozen=True)
class Submission:
    """What a user asks to run (see ``POST jobs``)."""

    profile: str
    command: Sequence[str]
    name: str | None = None
    working_dir: str | None = None
    env: Mapping[str, str] | None = None
    max_runtime: float | None = None
    priority_class: str = DEFAULT_JOB_CLASS
    retries: int = 2
    submission_id: str | None = None
    environment: str | None = None  # one of the profile's environments (default: its default one)


class InvalidJob(ValueError):
    """A submission the service cannot run; ``field`` names the part at fault, the message says why."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class CheckedJob:
    """A submission with its defaults filled in and its paths resolved."""

    command: tuple[str, ...]
    working_dir: str
    env: dict[str, str]
    max_runtime: float | None
    priority_class: str
    name: str
    request: Request  # what its lease asks the pool for: the profile's, for max_runtime, in its environment


def check_submission(
    *,
    identity: Identity,
    profile: Profile,
    command: Sequence[str],
    working_dir: str | None,
    env: Mapping[str, str],
    max_runtime: float | None,
    priority_class: str,
    name: str | None,
    is_admin: bool,
    on_host: bool = True,
    environment: str | None = None,
) -> CheckedJob:
    """The submission checked and completed, or :class:`InvalidJob` for its first problem. ``on_host`` False:
    the paths are in the job's container (see the module docstring)."""
    check_text(command, env, working_dir, name)
    checked_env = dict(env)
    try:
        chosen = choose(profile.environments, environment, profile.slug)
    except UnknownEnvironment as error:
        raise InvalidJob(FIELD, str(error).removeprefix(f"{FIELD}: ")) from None
    if chosen is not None:  # its bin first on PATH, so `python` is the environment's
        checked_env[ENV_VAR] = chosen.slug
        if chosen.bin and on_host:
            checked_env["PATH"] = f"{chosen.bin}:{checked_env.get('PATH') or os.environ.get('PATH') or ''}"
    if on_host:
        directory = resolve_working_dir(working_dir, identity.home)
        path = checked_env.get("PATH") or os.environ.get("PATH") or ""
        if find_executable(command[0], directory, path, identity) is None:
            # the service's own PATH is not the user's to read: say where to look, not what it holds
            if command[0].startswith("/"):
                where = "that the job's account may run"
            elif "/" in command[0]:
                where = f"in {directory} that the job's account may run"
            else:
                where = "on the job's PATH (give a full path, or set PATH in env)"
            raise InvalidJob("command", f"{command[0]!r} is not an executable file {where}")
    else:
        directory = container_working_dir(working_dir, identity.home)
    _check_priority_class(priority_class, is_admin)
    limit = profile.max_lifetime
    _check_max_runtime(max_runtime, limit, profile.slug)
    return CheckedJob(
        command=tuple(command),
        working_dir=directory,
        env=checked_env,
        max_runtime=max_runtime if max_runtime is not None else limit,
        priority_class=priority_class,
        name=name or default_name(command),
        request=profile.request(max_runtime if max_runtime is not None else limit, environment),
    )


def check_text(
    command: Sequence[str], env: Mapping[str, str], working_dir: str | None, name: str | None
) -> None:
    """What a submission's text must be, whoever runs it: checked before anything is made for its user (a
    trial's refused jobs each made a system account first)."""
    if not command or not command[0]:
        raise InvalidJob("command", 'must be a non-empty list of arguments, e.g. ["python", "train.py"]')
    _check_text(command, env, working_dir, name)
    _check_sizes(command, env)
    _check_env(env)


def _check_priority_class(priority_class: str, is_admin: bool) -> None:
    if priority_class not in PRIORITY_CLASSES:
        raise InvalidJob(
            "priority_class", f"must be one of {', '.join(PRIORITY_CLASSES)}, got {priority_class!r}"
        )
    if priority_class not in USER_JOB_CLASSES and not is_admin:
        allowed = " or ".join(sorted(USER_JOB_CLASSES))
        raise InvalidJob(
            "priority_class", f"{priority_class} is for servers and administrators; use {allowed}"
        )


def _check_max_runtime(max_runtime: float | None, limit: float | None, profile: str) -> None:
    if max_runtime is not None and max_runtime <= 0:
        raise InvalidJob("max_runtime", f"must be more than 0 seconds, got {max_runtime:g}")
    if max_runtime is not None and limit is not None and max_runtime > limit:
        # past 31 years the figures would run to hundreds of digits (1e308 is a valid JSON number)
        seconds = f"{max_runtime:.0f}" if max_runtime < 1e9 else f"{max_runtime:.3g}"
        asked = format_duration(max_runtime) if max_runtime < 1e9 else f"{seconds} s"
        raise InvalidJob(
            "max_runtime",
            f"{asked} is over profile {profile}'s limit of {format_duration(limit)} "
            f"({seconds} s against {limit:.0f} s)",
        )


def resolve_working_dir(raw: str | None, home: str) -> str:
    """The working directory with symlinks resolved; it must be the home or inside it, and exist."""
    real_home = os.path.realpath(home)
    if not raw:
        raw = home
    if not os.path.isabs(raw):
        raise InvalidJob("working_dir", f"must be an absolute path inside your home {home}, got {raw!r}")
    real = os.path.realpath(raw)
    if real != real_home and not real.startswith(real_home.rstrip("/") + "/"):
        raise InvalidJob(
            "working_dir", f"{raw} is outside your home {home} (after following '..' and symlinks)"
        )
    if not os.path.isdir(real):
        raise InvalidJob("working_dir", f"{raw} is not an existing directory")
    return real


def container_working_dir(raw: str | None, home: str) -> str:
    """The working directory in the job's container: the home (``home``, where the user's volume is mounted)
    or a plain absolute path below it, without ``..`` or repeated slashes."""
    if not raw:
        return home
    if not posixpath.isabs(raw) or posixpath.normpath(raw) != raw.rstrip("/"):
        raise InvalidJob(
            "working_dir", f"must be a plain absolute path inside your home {home} (no '..'), got {raw!r}"
        )
    path = posixpath.normpath(raw)
    if path != home and not path.startswith(home.rstrip("/") + "/"):
        raise InvalidJob("working_dir", f"{raw} is outside your home {home} in the job's container")
    return path


def _check_sizes(command: Sequence[str], env: Mapping[str, str]) -> None:
    """Limits a job must keep: what Linux's ``execve`` takes (an argument of at most 128 KiB) and what the
    service stores and sends back with every ``GET jobs``."""
    if len(command) > MAX_ARGS:
        raise InvalidJob("command", f"at most {MAX_ARGS} arguments, got {len(command)}")
    for index, arg in enumerate(command):
        if len(arg.encode()) > MAX_ARG_BYTES:
            raise InvalidJob(f"command.{index}", f"an argument is at most {MAX_ARG_BYTES // 1024} KiB")
    if len(env) > MAX_ENV:
        raise InvalidJob("env", f"at most {MAX_ENV} variables, got {len(env)}")
    for key, value in env.items():
        if len(value.encode()) > MAX_ENV_BYTES:
            raise InvalidJob(f"env.{key}", f"a value is at most {MAX_ENV_BYTES // 1024} KiB")
    total = sum(len(a.encode()) + 1 for a in command) + sum(
        len(k) + len(v.encode()) + 2 for k, v in env.items()
    )
    if total > MAX_TOTAL_BYTES:
        raise InvalidJob(
            "command",
            f"the command and env together are at most {MAX_TOTAL_BYTES // 1024} KiB; pass longer input in a file",
        )


def _check_env(env: Mapping[str, str]) -> None:
    for key in env:
        if not _ENV_NAME.fullmatch(key):
            raise InvalidJob(
                f"env.{key}", "a variable name is letters, digits and '_', not starting with a digit"
            )
        if key in _RESERVED or key.startswith("GPUPOOL_"):
            raise InvalidJob(f"env.{key}", "gpupool sets this from the job's lease; leave it out")


def _check_text(
    command: Sequence[str], env: Mapping[str, str], working_dir: str | None, name: str | None
) -> None:
    """Text the service passes to ``execve``, stores and prints back: no NUL (``execve`` ends a string there),
    no unpaired surrogate (it has no UTF-8), and a name of one line without control, direction or invisible characters
    (it is printed in other people's terminals: ``gpupool jobs`` for an admin)."""
    texts = [
        *((f"command.{index}", arg) for index, arg in enumerate(command)),
        *((f"env.{key}", value) for key, value in env.items()),
        ("working_dir", working_dir or ""),
        ("name", name or ""),
    ]
    for field, text in texts:
        if "\0" in text:
            raise InvalidJob(field, "may not contain NUL characters")
        try:
            text.encode()
        except UnicodeEncodeError:
            raise InvalidJob(
                field, "holds an unpaired surrogate (\\ud800 to \\udfff), which is not text"
            ) from None
    unprintable = next((c for c in name or "" if _unprintable(c)), None)
    if unprintable is not None:
        raise InvalidJob(
            "name",
            f"one line of text without control, direction or invisible characters; it holds "
            f"U+{ord(unprintable):04X} ({unicodedata.name(unprintable, 'unnamed')})",
        )


def _unprintable(character: str) -> bool:
    return unicodedata.category(character) in _UNPRINTABLE and character not in _JOINERS


def new_job(
    job_id: str,
    user: str,
    groups: frozenset[str],
    ask: Submission,
    checked: CheckedJob,
    lease: Lease,
    job_dir: str,
) -> Job:
    """The job as first recorded: queued on its first lease."""
    return Job(
        id=job_id,
        user=user,
        name=checked.name,
        profile=lease.profile,
        command=checked.command,
        working_dir=checked.working_dir,
        env=checked.env,
        priority_class=checked.priority_class,
        retries=ask.retries,
        max_runtime=checked.max_runtime,
        submitted_at=lease.created_at,
        submission_id=ask.submission_id,
        groups=groups,
        lease_id=lease.id,
        job_dir=job_dir,
    )


def same_submission(
    by_submission: Callable[[str, str], Job | None], user: str, ask: Submission
) -> Job | None:
    """The job ``ask.submission_id`` already made for ``user`` (found with ``by_submission``), if any;
    :class:`SubmissionConflict` when ``ask`` differs from it: retrying a submission never changes what runs."""
    earlier = by_submission(user, ask.submission_id) if ask.submission_id is not None else None
    if earlier is not None and (earlier.command != tuple(ask.command) or earlier.profile != ask.profile):
        raise SubmissionConflict(
            f"submission_id: {ask.submission_id!r} was already used for job {earlier.id} "
            "with a different command or profile"
        )
    return earlier


def job_request(profile: Profile, job: Job) -> Request:
    """What a requeued job's next lease asks for: as its first, in the environment it was submitted with."""
    return profile.request(job.max_runtime, job.env.get(ENV_VAR))
