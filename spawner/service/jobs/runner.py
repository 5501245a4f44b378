"""How the job manager runs one attempt of a job: the runner interface, and the local runner behind it.

The job manager (:mod:`.job_manager`) owns the job's life: its lease, its states, when to stop it and why. A runner
owns only the run: start it on the lease's devices, say whether it is still there, stop it (gracefully, then
forced), say how it ended, and read its log. Two runners exist:

- :class:`LocalRunner`, processes on this host as the user's system account (:mod:`.processes`), each run
  in a control group with its lease's CPU and memory (:mod:`...limits`);
- :class:`~.kube_runner.KubeJobRunner`, a ``batch/v1`` Job per attempt on the lease's node.

Every method is synchronous and quick, because the manager calls them from its supervision step under its
lock: a runner that talks to a remote API answers from a cache and does its writes in the background.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from dataclasses import dataclass, replace
from typing import Protocol

from ...limits import Limits, job_group, this_host
from ...pool.job_states import NEVER_STARTED, Job, JobState, StopRequest
from ...pool.leases import Lease
from ...printable import printable
from ...user_accounts import AccountError
from . import processes

log = logging.getLogger(__name__)


class LaunchError(RuntimeError):
    """A run that could not be started (its manifest is invalid, the runner is not running); the job fails."""


@dataclass(frozen=True)
class Launched:
    """A run just started: the local runner's group leader (pid and start time); None for a remote run."""

    pid: int | None = None
    pid_start: int | None = None


@dataclass(frozen=True)
class Outcome:
    """How a run ended, as its runner saw it.

    ``exit_code`` is the command's status when it is known. ``lost`` says the pool, not the job, ended the
    run (an eviction, a drained or lost node): the manager requeues it. ``timed_out`` says the runner's own
    deadline stopped it (see :attr:`JobRunner.enforces_deadline`). ``reason`` explains an end without an
    exit status, for the job's history. ``log_ends`` is the last line the command wrote before a non-zero
    exit: mostly the error that ended it (a script not found, a traceback's last line).
    """

    exit_code: int | None
    lost: str | None = None
    timed_out: str | None = None
    reason: str | None = None
    log_ends: str = ""

    def end(self, stop: StopRequest | None) -> tuple[JobState, str]:
        """The state the run ends the job in, and why: a stop the pool asked for decides; otherwise a lost
        run is requeued, then the runner's deadline, then the command's exit status."""
        code = self.exit_code
        if stop is not None:
            return stop.then, stop.reason
        if self.lost is not None:
            return JobState.REQUEUED, self.lost
        if self.timed_out is not None:
            return JobState.TIMED_OUT, self.timed_out
        if code == 0:
            return JobState.SUCCEEDED, "the command exited with status 0"
        if code is None:
            return (
                JobState.FAILED,
                self.reason or "the run ended without an exit status (killed by a signal?)",
            )
        said = f"{self.reason} (exit status {code})" if self.reason else _exit_words(code)
        return JobState.FAILED, f"{said}; its log ends: {self.log_ends}" if self.log_ends else said


class NoHome(AccountError):
    """The user's jobs have no home to run in yet (on Kubernetes: their home volume claim does not exist)."""


class JobRunner(Protocol):
    """What the job manager needs from a place jobs run in."""

    kind: str
    """``local`` or ``kubernetes``, for logs and messages."""
    launched_as: str
    """What a launch is, in a job's history before the node's name: ``started on``, or, where a launch only
    asks for a run that may still wait (held_up says why), ``created as a Kubernetes Job for``."""
    enforces_deadline: bool
    """True when the runner stops a run past its ``max_runtime`` itself (Kubernetes' ``activeDeadlineSeconds``)
    and reports it as :attr:`Outcome.timed_out`; False, and the manager stops it on its own clock."""
    host_paths: bool
    """True when a job's command and working directory are paths on this host, checked at submission; False
    when they are paths in a container the service cannot look into."""
    log_lag_s: float
    """How long a job's log may take to arrive after a first read: 0 when :meth:`read_log` reads it at once;
    else it is fetched in the background and an empty answer may only mean "not yet"."""
    log_file: bool
    """True when a run's output is kept in ``output.log`` in the job's folder, for the user to open; False
    when the log is only what :meth:`read_log` reads (a pod's)."""

    def identity(self, user: str) -> processes.Identity:
        """Who ``user``'s jobs run as; :class:`AccountError` (:class:`~.processes.NoSystemAccount`,
        :class:`NoHome`) when they cannot run at all."""
        ...

    def launch(self, job: Job, lease: Lease, identity: processes.Identity) -> Launched:
        """Start attempt ``job.attempts`` on ``lease``. OSError or :class:`LaunchError` when it cannot start."""
        ...

    def find(self, job: Job) -> Job | None:
        """The running job as its run is known now (the local runner fills in a leader found again after a
        restart), or None once the run is gone."""
        ...

    def stop_run(self, job: Job, *, force: bool) -> None:
        """Ask the run to stop (SIGTERM; a Job deleted with the grace period) or, with ``force``, end it now."""
        ...

    def outcome(self, job: Job) -> Outcome:
        """How the run :meth:`find` no longer finds ended."""
        ...

    def finish(self, job: Job) -> None:
        """Clean up after the run's end was recorded (reap the process; delete a Job that did not end itself)."""
        ...

    def read_log(self, job: Job, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes of the job's output from ``offset``; empty when there is none (yet)."""
        ...

    def holdup(self, job: Job) -> str | None:
        """While a running job's command has not started (a pod not yet scheduled): why, in words."""
        ...

    def reap(self) -> None:
        """Called at every supervision step, for housekeeping."""
        ...


class LocalRunner:
    """Jobs as process groups on this host, by :mod:`.processes`: as their user's account when the service is
    root (an account gpupool keeps for each user with ``account_per_user``, or the one ``account`` given),
    else as the service's user with homes under ``home_root``."""

    kind = "local"
    launched_as = "started on"
    enforces_deadline = False
    host_paths = True
    log_lag_s = 0.0
    log_file = True

    def __init__(
        self, home_root: str | None = None, account: str | None = None, account_per_user: bool = False
    ) -> None:
        self.home_root = home_root
        self.account = account
        self.account_per_user = account_per_user
        self._processes: dict[str, subprocess.Popen[bytes]] = {}  # runs this process started, to reap

    def identity(self, user: str) -> processes.Identity:
        identity = processes.identity_for(
            user, home_root=self.home_root, account=self.account, account_per_user=self.account_per_user
        )
        # A home gpupool keeps is made on first use, as a first server makes it: a user's first job may come
        # before their first server.
        processes.make_home(identity)
        return identity

    def launch(self, job: Job, lease: Lease, identity: processes.Identity) -> Launched:
        env = processes.job_env(
            identity, job.id, job.job_dir, lease.visible_devices, job.env, attempt=job.attempts
        )
        request = lease.request
        cgroup = this_host().create(
            job_group(job.id, job.attempts), Limits(request.cpu_milli, request.memory_mib)
        )
        started = processes.launch(
            identity, job.command, job.working_dir, job.job_dir, job.attempts, env, cgroup
        )
        self._processes[job.id] = started.process
        return Launched(started.pid, started.start)

    def find(self, job: Job) -> Job | None:
        if job.pid is None:
            uid = processes.job_uid(job.user, account=self.account, account_per_user=self.account_per_user)
            found = processes.find_leader(job.id, job.attempts, uid) if uid is not None else None
            if found is None:
                return None
            job = replace(job, pid=found[0], pid_start=found[1])
        assert job.pid is not None
        return job if processes.group_alive(job.pid, job.pid_start, job.id) else None

    def stop_run(self, job: Job, *, force: bool) -> None:
        if job.pid is not None:
            processes.signal_group(
                job.pid, job.pid_start, job.id, signal.SIGKILL if force else signal.SIGTERM
            )

    def outcome(self, job: Job) -> Outcome:
        code = processes.exit_status(job.job_dir, job.attempts, self._uid(job.user))
        group = this_host().group(job_group(job.id, job.attempts))
        if code is not None and code != 0 and group is not None and group.oom_kills():
            return Outcome(
                code, reason="the kernel's OOM killer stopped it: it used all the memory its profile gives"
            )
        if code is not None:
            return Outcome(code, log_ends=self._last_line(job) if code else "")
        process = self._processes.get(job.id)  # None after a restart: the run's start status is then unknown
        if process is None and job.pid is None:
            # Recorded as running, then the service stopped before it knew a pid, and no run of this attempt
            # was found or left a status: the service died before starting it.
            return Outcome(None, lost=f"{NEVER_STARTED}: the service stopped while starting it")
        return Outcome(None, reason=_why_no_status(job, process.poll() if process is not None else None))

    def finish(self, job: Job) -> None:
        process = self._processes.pop(job.id, None)
        if process is not None:
            process.poll()
        group = this_host().group(job_group(job.id, job.attempts))
        if group is not None and not group.end():  # children the command left behind go with its lease
            log.warning("job %s: its control group still holds processes %s", job.id, group.pids())

    def read_log(self, job: Job, offset: int, limit: int) -> bytes:
        uid = self._uid(job.user)
        if uid is None and os.geteuid() == 0:
            return b""  # no account to check the file's owner against: read nothing as root
        return processes.read_log(job.job_dir, uid, offset, limit)

    def holdup(self, job: Job) -> None:
        return None  # a local run is its process, started at launch

    def reap(self) -> None:
        for process in list(self._processes.values()):
            process.poll()  # reap our own children, so a finished leader is not left a zombie

    def _last_line(self, job: Job, tail: int = 4096) -> str:
        """The last line this attempt wrote that says something once made printable, at most 200 characters;
        empty when there is none (gpupool's own line that starts a requeued attempt is not the job's)."""
        try:
            size = os.stat(os.path.join(job.job_dir, processes.LOG_NAME)).st_size
        except OSError:
            return ""
        text = self.read_log(job, max(0, size - tail), tail).decode(errors="replace")
        for line in reversed(text.splitlines()):
            if line.startswith(processes.ATTEMPT_MARK):
                return ""
            if said := printable(line).strip():
                return said if len(said) <= 200 else said[:199] + "…"
        return ""

    def _uid(self, user: str) -> int | None:
        """The uid that owns the files of ``user``'s jobs, looked up without making an account or a home (a
        deleted user's log read, or their last run's end recorded, must not bring the account back). None when
        there is none, or it is root's (jobs never run as root): then, as root, :meth:`read_log` reads nothing,
        and the exit status is read from a file of any owner, the run's own folder."""
        if "/" in user:  # a deleted user's filed-away records
            return None
        uid = processes.job_uid(user, account=self.account, account_per_user=self.account_per_user)
        return None if uid == 0 else uid


def _exit_words(code: int) -> str:
    """What a non-zero exit status says: a shell reports a command killed by signal N as 128 + N."""
    with contextlib.suppress(ValueError):
        if code > 128:
            return f"the command was killed by {signal.Signals(code - 128).name} (exit status {code})"
    return f"the command exited with status {code}"


def _why_no_status(job: Job, returncode: int | None) -> str | None:
    """Why a run this service started left no exit status, from the status of its start script
    (:data:`.processes.START_FAILURES`) or the signal that ended it; None when that is unknown."""
    if returncode is None:
        return None
    if returncode < 0:
        with contextlib.suppress(ValueError):  # a real-time signal has no name of its own
            return f"the run was killed by {signal.Signals(-returncode).name} before its command could finish"
        return f"the run was killed by signal {-returncode} before its command could finish"
    why = processes.START_FAILURES.get(returncode)
    return why.format(user=job.user, job_dir=job.job_dir, working_dir=job.working_dir) if why else None
