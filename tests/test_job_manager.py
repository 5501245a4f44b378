"""The job manager in-process, on a real SQLite store and real processes: leases, restarts, faults, fair share.

The HTTP side and a real hub are in ``test_jobs_api.py``; here the manager's loop is stepped by hand, so each
test is quick and says exactly which step did what.
"""

from __future__ import annotations

import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from builders import gpu, node
from job_user import clean_home, job_user, python_with_numpy, train_script, user_dir

from gpupool.spawner.pool.job_states import JobState
from gpupool.spawner.pool.leases import LeaseState
from gpupool.spawner.pool.profiles import Profile
from gpupool.spawner.pool.quotas import Quota, QuotaExceeded, QuotaPolicy
from gpupool.spawner.pool.requests import Request, WholeGpus
from gpupool.spawner.service.jobs.job_manager import JobManager, Submission, TooManyQueuedJobs
from gpupool.spawner.service.jobs.preemption_loop import Preemptor
from gpupool.spawner.service.jobs.submission import SubmissionConflict
from gpupool.spawner.service.leasing.lease_manager import LeaseManager
from gpupool.spawner.service.store.job_store import JobStore
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url

H100 = frozenset({"H100-80GB"})
ONE = Profile("h100", "One H100", 1000, 1024, WholeGpus(1, H100), max_lifetime=600)
NODES = [node("dgx", [gpu("dgx", 0), gpu("dgx", 1)])]


def managers(tmp_path: Path, grace: float = 2.0, **kw: object) -> JobManager:
    """A job manager on the SQLite file in ``tmp_path``: a second call is the service after a restart."""
    store = LeaseStore(sqlite_url(str(tmp_path / "gpupool.sqlite")))
    leases = LeaseManager(NODES, store, quotas=kw.pop("quotas", None))  # type: ignore[arg-type]
    return JobManager(leases, JobStore(store.engine), [ONE], grace=grace, **kw)  # type: ignore[arg-type]


def until(jobs: JobManager, check: Callable[[], bool], what: str, timeout: float = 15) -> None:
    """Step the manager until ``check`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs.step()
        if check():
            return
        time.sleep(0.02)
    pytest.fail(f"{what} within {timeout}s")


def sh(script: str, **kw: object) -> Submission:
    return Submission(profile="h100", command=["sh", "-c", script], **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def user() -> Iterator[str]:
    name = job_user()
    yield name
    clean_home(name)


def test_a_job_gets_a_lease_runs_on_its_devices_and_gives_them_back(tmp_path: Path, user: str) -> None:
    jobs = managers(tmp_path)
    job, created = jobs.submit(user, [], sh('echo "devices=$CUDA_VISIBLE_DEVICES"'))
    assert created and job.state is JobState.QUEUED
    lease = jobs.leases.get(job.lease_id or "")
    assert lease.state is LeaseState.GRANTED and lease.owner_kind == "job" and lease.owner_name == job.id
    until(jobs, lambda: jobs.get(job.id).state.finished, "the job to finish")
    done = jobs.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    assert [t.state for t in done.history] == [JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED]
    assert jobs.read_log(done) == f"devices={lease.visible_devices}\n".encode()
    assert jobs.leases.get(lease.id).state is LeaseState.RELEASED
    assert jobs.leases.pool.allocations == {}


def test_a_users_own_non_zero_exit_fails_the_job_and_is_not_requeued(tmp_path: Path, user: str) -> None:
    jobs = managers(tmp_path)
    job, _ = jobs.submit(
        user, [], sh("echo step 1; echo 'no such file: data.csv' >&2; echo; exit 7", retries=3)
    )
    until(jobs, lambda: jobs.get(job.id).state.finished, "the job to finish")
    failed = jobs.get(job.id)
    assert failed.state is JobState.FAILED and failed.exit_code == 7 and failed.attempts == 1
    # a trial's `python no_such_file.py` said only "exited with status 2": its WHY now quotes the error
    assert failed.reason == "the command exited with status 7; its log ends: no such file: data.csv"
    # coloured, as rich or loguru print it, and followed by a bare colour reset (the review's case)
    coloured, _ = jobs.submit(user, [], sh(r"printf '\033[31mValueError: bad\033[0m\n\033[0m\n'; exit 3"))
    until(jobs, lambda: jobs.get(coloured.id).state.finished, "the coloured job to finish")
    assert jobs.get(coloured.id).reason == "the command exited with status 3; its log ends: ValueError: bad"


def test_a_job_whose_home_is_not_writable_fails_saying_so(tmp_path: Path, user: str) -> None:
    # it once failed as "the run ended without an exit status (killed by a signal?)"
    jobs = managers(tmp_path)
    home = Path(jobs.runner.identity(user).home)
    clean_home(user)  # no ~/.gpupool left from other tests to write into
    mode = stat.S_IMODE(home.stat().st_mode)
    home.chmod(0o555)
    try:
        job, _ = jobs.submit(user, [], sh("echo never"))
        until(jobs, lambda: jobs.get(job.id).state.finished, "the job to finish")
    finally:
        home.chmod(mode)
    failed = jobs.get(job.id)
    assert failed.state is JobState.FAILED and failed.exit_code is None
    assert failed.reason == (
        f"the job could not create its folder {failed.job_dir} or its log there as the account {user}'s jobs "
        "run as: the nearest folder above it that exists must be writable by that account"
    )


def test_the_same_submission_id_never_starts_a_second_job(tmp_path: Path, user: str) -> None:
    jobs = managers(tmp_path)
    first, created = jobs.submit(user, [], sh("sleep 0", submission_id="run-42"))
    again, created_again = jobs.submit(user, [], sh("sleep 0", submission_id="run-42"))
    assert created and not created_again and again.id == first.id
    assert len(jobs.leases.all_leases()) == 1
    jobs = managers(tmp_path)  # after a restart too
    assert jobs.submit(user, [], sh("sleep 0", submission_id="run-42"))[0].id == first.id
    with pytest.raises(SubmissionConflict, match="submission_id: 'run-42' was already used"):
        jobs.submit(user, [], sh("sleep 1", submission_id="run-42"))


def test_a_users_queued_jobs_are_capped_and_quotas_count_jobs_with_servers(tmp_path: Path, user: str) -> None:
    quotas = QuotaPolicy(user_overrides={user: Quota(whole_gpus=2)})
    jobs = managers(tmp_path, max_queued=1, quotas=quotas)
    jobs.leases.request_lease(user, [], "server", "", "h100", Request(1000, 1024, WholeGpus(1, H100)))
    jobs.submit(user, [], sh("sleep 30"))  # the second GPU: granted
    with pytest.raises(QuotaExceeded, match="allows 2 whole GPUs at once"):
        jobs.submit(user, [], sh("sleep 30"))
    (tmp_path / "capped").mkdir()
    other = managers(tmp_path / "capped", max_queued=1)
    other.submit(user, [], sh("sleep 30"))
    other.submit(user, [], sh("sleep 30"))
    queued, _ = other.submit(user, [], sh("sleep 30"))  # no GPU left: it waits
    assert other.leases.get(queued.lease_id or "").state is LeaseState.QUEUED
    with pytest.raises(TooManyQueuedJobs, match="1 queued jobs"):
        other.submit(user, [], sh("sleep 30"))
    for each in other.store.live():
        other.cancel(each.id, "test")
    until(other, lambda: not other.store.live(), "every job to stop")


def test_cancel_and_max_runtime_stop_the_group_within_the_grace_period(tmp_path: Path, user: str) -> None:
    jobs = managers(tmp_path, grace=1.0)
    ignores_term = "trap '' TERM; while :; do sleep 0.1; done"
    slow, _ = jobs.submit(user, [], sh(ignores_term))
    timed, _ = jobs.submit(user, [], sh("sleep 30", max_runtime=0.5))
    until(jobs, lambda: jobs.get(slow.id).state is JobState.RUNNING, "the job to start")
    asked = time.monotonic()
    jobs.cancel(slow.id, "user alice")
    until(jobs, lambda: jobs.get(slow.id).state.finished, "the cancelled job to stop")
    assert time.monotonic() - asked < 1.0 + 1.5  # SIGKILL after the 1 s grace, give or take a step
    until(jobs, lambda: jobs.get(timed.id).state.finished, "the timed-out job to stop")
    assert (
        jobs.get(slow.id).state is JobState.CANCELLED
        and jobs.get(slow.id).reason == "cancelled by user alice"
    )
    assert (
        jobs.get(timed.id).state is JobState.TIMED_OUT
        and "maximum runtime of 0.5 s" in jobs.get(timed.id).reason
    )
    assert jobs.leases.pool.allocations == {}


def test_a_restarted_manager_re_adopts_a_running_job_and_its_log_loses_no_line(
    tmp_path: Path, user: str
) -> None:
    jobs = managers(tmp_path)
    job, _ = jobs.submit(
        user, [], sh("i=0; while [ $i -lt 30 ]; do echo line $i; i=$((i+1)); sleep 0.05; done")
    )
    until(jobs, lambda: jobs.get(job.id).state is JobState.RUNNING, "the job to start")
    pid = jobs.get(job.id).pid
    # The service dies here (its manager is never stepped again); its job runs on.
    again = managers(tmp_path)
    assert again.get(job.id).pid == pid and again.get(job.id).state is JobState.RUNNING
    until(again, lambda: again.get(job.id).state.finished, "the re-adopted job to finish")
    assert again.get(job.id).state is JobState.SUCCEEDED  # its exit status was on disk
    assert again.read_log(again.get(job.id)).decode().split() == [
        w for i in range(30) for w in ("line", str(i))
    ]
    assert again.leases.pool.allocations == {}


def test_a_run_started_just_before_a_crash_is_found_by_its_environment_not_started_twice(
    tmp_path: Path, user: str
) -> None:
    jobs = managers(tmp_path)
    # long enough to outlast a second manager's start on a loaded machine (with "sleep 1" a fresh clone's run
    # found the job already ended, its pid never looked for)
    job, _ = jobs.submit(user, [], sh("sleep 5"))
    until(jobs, lambda: jobs.get(job.id).state is JobState.RUNNING, "the job to start")
    running = jobs.get(job.id)
    jobs.store.save(
        type(running)(**{**running.__dict__, "pid": None, "pid_start": None})
    )  # the crash lost it
    again = managers(tmp_path)
    again.step()
    assert again.get(job.id).pid == running.pid and again.get(job.id).attempts == 1
    until(again, lambda: again.get(job.id).state.finished, "the job to finish")
    assert again.get(job.id).state is JobState.SUCCEEDED


class _ServiceKilled(BaseException):
    """The service's process ending where it stands, as a kill -9 would."""


def test_a_crash_between_recording_a_run_and_starting_it_requeues_the_job_without_using_a_retry(
    tmp_path: Path, user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = managers(tmp_path)
    job, _ = jobs.submit(user, [], sh("echo ran", retries=0))

    def killed(*args: object) -> None:
        raise _ServiceKilled

    monkeypatch.setattr(jobs.runner, "launch", killed)
    with pytest.raises(_ServiceKilled):
        jobs.step()  # the run is recorded as running, then the service dies before starting it
    assert jobs.get(job.id).state is JobState.RUNNING and jobs.get(job.id).pid is None
    again = managers(tmp_path)
    until(again, lambda: again.get(job.id).state.finished, "the job to run after the restart")
    done = again.get(job.id)
    assert done.state is JobState.SUCCEEDED, done.history
    assert any(t.reason.startswith("never started") for t in done.history), done.history
    assert again.read_log(done).decode().split() == ["ran"]  # once: the first attempt never ran
    assert again.leases.pool.allocations == {}


def test_a_gpu_fault_requeues_the_training_job_which_resumes_from_its_checkpoint(
    tmp_path: Path, user: str
) -> None:
    jobs = managers(tmp_path, grace=1.0)
    python, env = python_with_numpy()
    every = 10
    args = ["--steps", "60", "--checkpoint-every", str(every), "--step-seconds", "0.03"]
    job, _ = jobs.submit(
        user,
        [],
        Submission("h100", [*python, train_script(), *args], env=env, working_dir=str(user_dir(user))),
    )
    until(jobs, lambda: b"step 25/" in jobs.read_log(jobs.get(job.id)), "training to pass step 25")
    first_lease = jobs.leases.get(jobs.get(job.id).lease_id or "")
    (device,) = first_lease.devices
    index = int(device.uuid.rsplit("-", 1)[1])
    stopped = jobs.fault("dgx", index)
    assert [j.id for j in stopped] == [job.id]
    until(jobs, lambda: jobs.get(job.id).state.finished, "the job to finish after its requeue", timeout=30)
    done = jobs.get(job.id)
    assert done.state is JobState.SUCCEEDED, done.reason
    assert [t.state for t in done.history] == [
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.REQUEUED,
        JobState.RUNNING,
        JobState.SUCCEEDED,
    ]
    assert "marked unhealthy" in done.history[2].reason
    second_lease = jobs.leases.get(done.lease_id or "")
    assert second_lease.devices[0].uuid != device.uuid  # placed away from the failed GPU
    log = jobs.read_log(done).decode()
    before, after = log.split("resumed at step ")
    last_before = max(int(n) for n in re.findall(r"step (\d+)/", before))
    resumed = int(after.split()[0])
    assert resumed % every == 0 and last_before - resumed <= every, log
    assert "done: 60 steps" in after


def test_a_drain_requeues_a_job_without_using_its_retries(tmp_path: Path, user: str) -> None:
    """A trial drained a node and saw its user's job at "requeued (retry 1 of 2)": an admin's drain cost the
    user a retry, which a preemption does not. With no retries at all the job is requeued and runs again."""
    jobs = managers(tmp_path, grace=1.0)
    job, _ = jobs.submit(user, [], sh("echo run; sleep 1", retries=0))
    until(jobs, lambda: jobs.read_log(jobs.get(job.id)) == b"run\n", "the job to start")
    device = jobs.leases.get(jobs.get(job.id).lease_id or "").devices[0]
    assert [j.id for j in jobs.drain("dgx", int(device.uuid.rsplit("-", 1)[1]), by="admin ops")] == [job.id]
    until(jobs, lambda: jobs.get(job.id).state.finished, "the job to run again and finish", timeout=30)
    done = jobs.get(job.id)
    assert done.state is JobState.SUCCEEDED, done.reason
    requeued = [t.reason for t in done.history if t.state is JobState.REQUEUED]
    assert requeued == [f"drained by admin ops: GPU {device.uuid.rsplit('-', 1)[1]} of node dgx"]
    attempts = b"run\n----- gpupool: attempt 2 of this job starts (it was requeued) -----\nrun\n"
    assert jobs.read_log(done) == attempts  # where the second attempt begins, marked


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_within_a_class_the_user_who_used_less_gpu_recently_is_admitted_first(tmp_path: Path) -> None:
    clock = Clock()
    leases = LeaseManager(NODES, LeaseStore(sqlite_url(str(tmp_path / "l.sqlite"))), clock=clock)
    gpu_job = Request(1000, 1024, WholeGpus(1, H100))
    heavy = leases.request_lease("heavy", [], "job", "h1", "h100", gpu_job, -10)
    clock.now += 90
    leases.request_lease("light", [], "job", "l1", "h100", gpu_job, -10)
    clock.now += 1
    heavy_next = leases.request_lease("heavy", [], "job", "h2", "h100", gpu_job, -10)  # arrives first
    clock.now += 1
    light_next = leases.request_lease("light", [], "job", "l2", "h100", gpu_job, -10)
    server = leases.request_lease("heavy", [], "server", "", "h100", gpu_job)  # interactive: ahead of both
    assert [leases.position(x.id) for x in (server, heavy_next, light_next)] == [0, 1, 2]
    clock.now += 8
    leases.release(heavy.id)  # heavy used 100 GPU-seconds, light 10: after the server, light goes first
    assert leases.get(server.id).state is LeaseState.GRANTED
    assert leases.position(light_next.id) == 0 and leases.position(heavy_next.id) == 1
    assert leases.recent_usage() == {"heavy": 100.0, "light": 10.0}


def test_a_job_whose_lease_is_released_from_under_it_is_stopped(tmp_path: Path, user: str) -> None:
    jobs = managers(tmp_path, grace=1.0)
    job, _ = jobs.submit(user, [], sh("echo up; sleep 30"))
    until(jobs, lambda: jobs.read_log(jobs.get(job.id)) == b"up\n", "the job to start")
    jobs.leases.release(job.lease_id or "", "released by user someone")
    until(jobs, lambda: jobs.get(job.id).state.finished, "the job to stop")
    stopped = jobs.get(job.id)
    assert stopped.state is JobState.CANCELLED
    assert stopped.reason == "its lease was released (released by user someone)"
    assert jobs.leases.pool.allocations == {}


def test_a_waiting_server_preempts_a_checkpointing_job_which_resumes_and_finishes(
    tmp_path: Path,
    user: str,
) -> None:
    jobs = managers(tmp_path, grace=1.0)
    python, env = python_with_numpy()
    args = ["--steps", "80", "--checkpoint-every", "10", "--step-seconds", "0.03"]
    train = Submission(
        "h100", [*python, train_script(), *args], env=env, working_dir=str(user_dir(user)), retries=0
    )
    first, _ = jobs.submit(user, [], train)
    time.sleep(0.05)
    second, _ = jobs.submit(user, [], train)  # the younger one: the pool's two H100s are now both busy
    until(
        jobs, lambda: all(b"step 25/" in jobs.read_log(jobs.get(j.id)) for j in (first, second)), "training"
    )
    server = jobs.leases.request_lease(
        "ada", [], "server", "", "h100", Request(1000, 1024, WholeGpus(1, H100))
    )
    assert server.state is LeaseState.QUEUED

    preemptor = Preemptor(jobs, after=0.5, preemptible=frozenset({"batch"}))
    jobs.leases.hold_placements("the cluster's API server is silent")  # the server waits for that, not GPUs
    time.sleep(0.6)
    assert preemptor.step() is None and jobs.get(second.id).stop is None
    jobs.leases.hold_placements(None)
    until(jobs, lambda: preemptor.step() is not None or jobs.get(second.id).stop is not None, "a preemption")
    until(jobs, lambda: jobs.leases.get(server.id).state is LeaseState.GRANTED, "the server's lease")
    assert jobs.get(first.id).state is JobState.RUNNING  # the older job kept running
    assert jobs.get(second.id).state is JobState.REQUEUED

    jobs.leases.release(server.id, "server stopped")  # the researcher is done: the job gets its GPU back
    until(jobs, lambda: jobs.get(second.id).state.finished, "the preempted job to finish", timeout=40)
    done = jobs.get(second.id)
    assert done.state is JobState.SUCCEEDED, done.reason  # retries=0, yet requeued: preemption uses none
    reasons = [t.reason for t in done.history if t.state is JobState.REQUEUED]
    assert len(reasons) == 1 and reasons[0].startswith("preempted: ada's server had waited"), reasons
    log = jobs.read_log(done).decode()
    before, after = log.split("resumed at step ")
    lost = max(int(n) for n in re.findall(r"step (\d+)/", before)) - int(after.split()[0])
    assert 0 <= lost <= 10, log  # at most one checkpoint interval redone
    assert "done: 80 steps" in after
