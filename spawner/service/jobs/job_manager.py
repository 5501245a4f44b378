"""The job manager: jobs as lease owners. It asks the lease manager for a lease, starts the job when the lease
is granted, watches its process group, stops it (SIGTERM, a grace period, SIGKILL) when cancelled, past its
maximum runtime or on a device fault, and releases the lease once the group is gone.

The store comes first, as with leases: a job's lease is requested before the job is recorded (a quota refusal
stores nothing), a lease is released before the job's end is recorded, and a job is marked running before
its process starts, so after a crash anywhere the next start finds out what really happened: it re-adopts a
running group (by pid and start time, or by the job id in a process's environment), records the end of a
group that ended meanwhile (from the exit status the run wrote), and releases job leases whose job never
got recorded. Lease ids of a job are ``<job id>-<n>`` for its n-th lease, so a retried requeue reuses the
lease it already asked for instead of queueing twice.

Where a run happens is the runner's business (:mod:`.runner`): processes on this host by default,
``batch/v1`` Jobs on Kubernetes; the manager's rules are the same for both.

The supervision loop (:meth:`JobManager.run_forever`) steps every ``interval`` seconds and at once after a
grant, on the service's event loop; the methods also take a lock, so threads may call them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from ...pool.devices import Health
from ...pool.job_states import DRAINED_BY, Job, JobState, StopRequest, priority_of, uses_no_retry
from ...pool.leases import Lease, LeaseState, new_lease_id
from ...pool.profiles import Profile, find_profile
from ...pool.quotas import QuotaExceeded
from ...user_accounts import AccountError
from ..leasing.lease_manager import LeaseManager, NeverFits
from ..store.job_store import JobNotFound, JobStore
from . import processes, submission
from .runner import JobRunner, LaunchError, LocalRunner, Outcome
from .submission import Submission, TooManyQueuedJobs, check_submission, job_request, new_job, same_submission

log = logging.getLogger(__name__)

# how much of a requeued run's reason the next run's carries (a transition's reason holds 2,000 characters)
REASON_BEFORE_CHARS = 1000


class JobManager:
    """Runs jobs on ``leases`` in ``job_runner`` (default: a local one), recording each change in ``store``."""

    def __init__(
        self,
        leases: LeaseManager,
        store: JobStore,
        profiles: Sequence[Profile],
        *,
        grace: float = 30.0,
        max_queued: int = 100,
        home_root: str | None = None,
        account: str | None = None,
        clock: Callable[[], float] = time.time,
        job_runner: JobRunner | None = None,
    ) -> None:
        self.leases = leases
        self.store = store
        self.profiles = tuple(profiles)
        self.grace = grace
        self.max_queued = max_queued
        self._clock = clock
        self.runner: JobRunner = job_runner if job_runner is not None else LocalRunner(home_root, account)
        self._lock = threading.RLock()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        leases.on_granted(self._granted)
        self._restore()

    def identity(self, user: str) -> processes.Identity:
        return self.runner.identity(user)

    # ---- asking ---------------------------------------------------------------------------------------

    def submit(
        self, user: str, groups: Iterable[str], ask: Submission, *, is_admin: bool = False
    ) -> tuple[Job, bool]:
        """The job (queued, with a granted or queued lease) and whether it is new: a ``submission_id`` already
        used by ``user`` returns that job instead. Raises :class:`InvalidJob`, :class:`AccountError`,
        :class:`TooManyQueuedJobs`, :class:`SubmissionConflict`, QuotaExceeded, NeverFits or UnknownProfile."""
        groups = frozenset(groups)
        with self._lock:
            earlier = same_submission(self.store.by_submission, user, ask)
            if earlier is not None:
                return earlier, False
            profile = find_profile(self.profiles, ask.profile)
            submission.check_text(ask.command, ask.env or {}, ask.working_dir, ask.name)  # before any account
            identity = self.identity(user)
            checked = check_submission(
                identity=identity,
                profile=profile,
                command=ask.command,
                working_dir=ask.working_dir,
                env=ask.env or {},
                max_runtime=ask.max_runtime,
                priority_class=ask.priority_class,
                name=ask.name,
                is_admin=is_admin,
                on_host=self.runner.host_paths,
                environment=ask.environment,
            )
            self._check_queue_cap(user)
            job_id = new_lease_id()
            lease = self.leases.request_lease(
                *(user, groups, "job", job_id, profile.slug, checked.request),
                priority_of(checked.priority_class),
                lease_id=f"{job_id}-1",
            )
            job = new_job(job_id, user, groups, ask, checked, lease, processes.job_dir(identity, job_id))
            try:
                self.store.add(job)
            except BaseException:
                self.leases.release(lease.id, "its job could not be recorded")
                raise
        self._poke()
        return job, True

    def _check_queue_cap(self, user: str) -> None:
        waiting = sum(1 for j in self.store.live() if j.user == user and self._waits_for_devices(j))
        if waiting >= self.max_queued:
            raise TooManyQueuedJobs(
                f"{user} has {waiting} queued jobs, the most a user may have waiting "
                f"(max_queued_jobs {self.max_queued}); cancel one or wait for one to start"
            )

    def _waits_for_devices(self, job: Job) -> bool:
        """Queued with its lease queued too: what the cap counts (a granted lease starts at the next step)."""
        lease = self.lease_of(job) if job.state.waiting else None
        return lease is not None and lease.state is LeaseState.QUEUED

    def cancel(self, job_id: str, by: str) -> Job:
        """Cancel: a waiting job at once, a running one by SIGTERM, the grace period, then SIGKILL (it becomes
        cancelled when its group is gone). A finished job is returned unchanged."""
        with self._lock:
            job = self.get(job_id)
            now = self._clock()
            reason = f"cancelled by {by}"
            if job.state.waiting:
                self._release(job, reason)
                return self.store.save(job.to(JobState.CANCELLED, now, reason))
            if job.state is JobState.RUNNING:
                return self._stop(job, JobState.CANCELLED, reason, now)
            return job

    def preempt(self, job_id: str, reason: str) -> Job:
        """Stop running job ``job_id`` (SIGTERM, grace, SIGKILL) and requeue it with its checkpoint folder, for
        work that waited too long (:mod:`...pool.preemption`); it uses none of the job's retries."""
        with self._lock:
            return self._stop(self.get(job_id), JobState.REQUEUED, reason, self._clock())

    def fault(self, node: str, gpu_index: int | None, why: str = "") -> list[Job]:
        """Mark a node (or one GPU on it) unhealthy; every job running on it is stopped and put back in the
        queue (up to its retries). ``why`` (a critical XID, a lost GPU) goes into the jobs' reason. KeyError
        names an unknown node or GPU. Returns the jobs stopped."""
        said = f"{_what(node, gpu_index)} was marked unhealthy" + (f" ({why})" if why else "")
        return self._take_out(node, gpu_index, Health.UNHEALTHY, said, why)

    def drain(self, node: str, gpu_index: int | None, by: str = "an admin") -> list[Job]:
        """Drain a node (or one GPU on it): nothing new is placed there, and every job running on it is
        stopped (SIGTERM, the grace period, SIGKILL) and requeued, as on a fault but using none of its
        retries: an admin's drain is not the job's failure. Servers keep running. Draining again changes
        nothing and stops nobody new. KeyError names an unknown node or GPU."""
        said = f"{DRAINED_BY} {by}: {_what(node, gpu_index)}"
        return self._take_out(node, gpu_index, Health.DRAINED, said, f"{DRAINED_BY} {by}")

    def clear_mark(self, node: str, gpu_index: int | None, health: Health) -> None:
        """Lift a drain or fault mark from a node or GPU (it takes work again unless another mark stays) and
        admit queued work."""
        self.leases.clear_health(node, health, gpu_index)
        self._poke()

    def _take_out(self, node: str, gpu_index: int | None, health: Health, said: str, why: str) -> list[Job]:
        with self._lock:
            self.leases.set_health(node, health, gpu_index, why)
            on_it = {lease.id for lease in self.leases.leases_on(node, gpu_index)}
            stopped = []
            now = self._clock()
            for job in self.store.live():
                if job.state is JobState.RUNNING and job.lease_id in on_it and job.stop is None:
                    stopped.append(self._stop(job, JobState.REQUEUED, said, now))
            return stopped

    # ---- reading ----------------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        job = self.store.get(job_id)
        if job is None:
            raise JobNotFound(f"no job {job_id!r}")
        return job

    def jobs_for(self, user: str, newest: int | None = None) -> list[Job]:
        """``user``'s jobs (the ``newest`` last submitted, if given), oldest first."""
        return self.store.list_for_user(user, newest)

    def all_jobs(self, newest: int | None = None) -> list[Job]:
        return self.store.list_all(newest)

    def unfinished(self) -> list[Job]:
        """Every job queued, running or requeued, oldest first, from memory: the dashboard reads them every
        few seconds, and a user's thousands of finished jobs must not make each read slower."""
        return self.store.live()

    def lease_of(self, job: Job) -> Lease | None:
        return self.leases.get(job.lease_id) if job.lease_id else None

    def position(self, job: Job) -> int | None:
        """Place of the job's lease in the queue while it waits (0 is next)."""
        if not job.state.waiting or job.lease_id is None:
            return None
        return self.leases.position(job.lease_id)

    def read_log(self, job: Job, offset: int = 0, limit: int = 1 << 20) -> bytes:
        return self.runner.read_log(job, offset, limit)

    # ---- the supervision loop -----------------------------------------------------------------------------

    async def run_forever(self, interval: float = 0.25) -> None:
        """Call :meth:`step` every ``interval`` seconds, and at once after a lease is granted."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while True:
            try:
                self.step()
            except Exception:
                log.exception("job supervision step failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)
            self._wake.clear()

    def _granted(self, leases: list[Lease]) -> None:
        if any(lease.owner_kind == "job" for lease in leases):
            self._poke()

    def _poke(self) -> None:
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def step(self) -> None:
        """One pass: start jobs whose lease was granted, and watch running ones (exit, runtime, stop)."""
        with self._lock:
            self.runner.reap()
            for job in self.store.live():
                try:
                    if job.state.waiting:
                        self._start_if_granted(job)
                    elif job.state is JobState.RUNNING:
                        self._watch(job)
                except Exception:
                    log.exception("job %s of %s", job.id, job.user)

    def _start_if_granted(self, job: Job) -> None:
        lease = self.lease_of(job)
        if lease is None or lease.state is LeaseState.QUEUED:
            return
        now = self._clock()
        if lease.state is LeaseState.RELEASED:
            self.store.save(job.to(JobState.FAILED, now, f"its lease was released: {lease.release_reason}"))
            return
        attempt = job.attempts + 1
        try:
            identity = self.identity(job.user)
        except AccountError as error:
            self._release(job, "job could not start")
            self.store.save(job.to(JobState.FAILED, now, str(error)))
            return
        devices = ", ".join(g.label for g in lease.devices) or "no GPU"
        this_run = f"attempt {attempt} {self.runner.launched_as} {lease.node} ({devices})"
        # a requeued job says why while it runs again, not only in its history (a failure trial)
        before = next((t.reason for t in reversed(job.history) if t.state is JobState.REQUEUED), None)
        if before is not None and len(before) > REASON_BEFORE_CHARS:
            before = before[:REASON_BEFORE_CHARS] + "…"
        # Recorded as running first: a crash right after the launch is then found again, never run twice.
        job = self.store.save(
            job.to(
                JobState.RUNNING,
                now,
                this_run if before is None else f"{this_run}; the run before: {before}",
                attempts=attempt,
                pid=None,
                pid_start=None,
                started_at=now,
                exit_code=None,
            )
        )
        try:
            started = self.runner.launch(job, lease, identity)
        except (OSError, LaunchError) as error:
            self._release(job, "job could not start")
            self.store.save(job.to(JobState.FAILED, self._clock(), f"the command could not start: {error}"))
            return
        if started.pid is not None:
            self.store.save(replace(job, pid=started.pid, pid_start=started.pid_start))
        where = f"pid {started.pid}" if started.pid is not None else f"{self.runner.kind} on {lease.node}"
        log.info("job %s of %s: attempt %d started, %s", job.id, job.user, attempt, where)

    def _watch(self, job: Job) -> None:
        now = self._clock()
        found = self.runner.find(job)
        if found is None:
            self._ended(job, now)
            return
        if found != job:
            job = self.store.save(found)
        if job.stop is not None:
            if not job.stop.killed and now >= job.stop.kill_at:
                self.runner.stop_run(job, force=True)
                self.store.save(replace(job, stop=replace(job.stop, killed=True)))
            return
        if (
            not self.runner.enforces_deadline
            and job.max_runtime is not None
            and job.started_at is not None
            and now >= job.started_at + job.max_runtime
        ):
            self._stop(job, JobState.TIMED_OUT, f"ran past its maximum runtime of {job.max_runtime:g} s", now)
            return
        lease = self.lease_of(job)
        if lease is None or lease.state is LeaseState.RELEASED:
            # Its devices went back to the pool (someone released the lease through the API): running on
            # would use devices the pool may already have given to someone else.
            why = lease.release_reason if lease is not None else "it is gone"
            self._stop(job, JobState.CANCELLED, f"its lease was released ({why})", now)

    def _stop(self, job: Job, then: JobState, reason: str, now: float) -> Job:
        stopping = job.with_stop(StopRequest(then, reason, now, now + self.grace))
        if stopping is job:
            return job
        job = self.store.save(stopping)
        self.runner.stop_run(job, force=False)
        self._poke()
        return job

    def _ended(self, job: Job, now: float) -> None:
        """The run is gone: release its lease and record how it ended. A stop the pool asked for decides the
        state; otherwise the runner's outcome: lost (requeue), timed out, or the command's exit status."""
        outcome = self.runner.outcome(job)
        try:
            self._record_end(job, now, outcome)
        finally:
            self.runner.finish(job)

    def _record_end(self, job: Job, now: float, outcome: Outcome) -> None:
        state, reason = outcome.end(job.stop)
        if state is JobState.REQUEUED:
            self._requeue(job, now, reason, outcome.exit_code)
            return
        self._release(job, f"job {state}")
        self.store.save(job.to(state, now, reason, exit_code=outcome.exit_code))
        log.info("job %s of %s: %s (%s)", job.id, job.user, state, reason)

    def _requeue(self, job: Job, now: float, reason: str, code: int | None) -> None:
        self._release(job, reason)
        if job.requeue_fails(reason):
            said = f"{reason}; no retries left ({job.retries})"
            self.store.save(job.to(JobState.FAILED, now, said, exit_code=code))
            return
        try:
            lease = self._retry_lease(job)
        except (QuotaExceeded, NeverFits, LookupError) as error:
            self.store.save(job.to(JobState.FAILED, now, f"{reason}; it could not be requeued: {error}"))
            return
        said = (
            reason
            if uses_no_retry(reason)
            else f"{reason}; requeued (retry {job.requeues + 1} of {job.retries})"
        )
        self.store.save(
            job.to(JobState.REQUEUED, now, said, lease_id=lease.id, pid=None, pid_start=None, exit_code=code)
        )
        log.info("job %s of %s requeued: %s", job.id, job.user, reason)

    def _retry_lease(self, job: Job) -> Lease:
        """The next attempt's lease, in the queue at the job's first arrival; the one asked for already when a
        crash came between asking and recording."""
        lease_id = f"{job.id}-{job.attempts + 1}"  # lease n+1 after run n (requeues come only from runs)
        with contextlib.suppress(LookupError):
            return self.leases.get(lease_id)
        profile = find_profile(self.profiles, job.profile)
        return self.leases.request_lease(
            *(job.user, job.groups, "job", job.id, profile.slug, job_request(profile, job)),
            priority_of(job.priority_class),
            arrival=job.submitted_at,
            lease_id=lease_id,
        )

    def _release(self, job: Job, reason: str) -> None:
        if job.lease_id is not None:
            with contextlib.suppress(LookupError):
                self.leases.release(job.lease_id, reason)

    # ---- after a restart --------------------------------------------------------------------------------

    def _restore(self) -> None:
        """Release job leases whose job was never recorded; running jobs are re-adopted by the first step."""
        live = {job.id for job in self.store.live()}
        for lease in self.leases.all_leases(active_only=True):
            if lease.owner_kind == "job" and lease.owner_name not in live:
                self.leases.release(
                    lease.id, "its job was not recorded (the service stopped while submitting)"
                )
        for job in self.store.live():
            if job.state is JobState.RUNNING:
                log.info(
                    "job %s of %s: re-adopting attempt %d (pid %s)", job.id, job.user, job.attempts, job.pid
                )


def _what(node: str, gpu_index: int | None) -> str:
    return f"GPU {gpu_index} of node {node}" if gpu_index is not None else f"node {node}"
