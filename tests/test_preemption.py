"""Preemption: a server that waited too long makes room by stopping a checkpointing batch job, which resumes.

Finding 1 of the researcher's-day review: nothing ever made room; a waiting interactive user never displaced
a batch job, even one that checkpoints. Now, past ``preempt_after_seconds``, the youngest running job of a
preemptible class on devices the server can use is stopped and requeued with its checkpoint folder (using
none of its retries), and never a server or a protected class.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from job_user import python_with_numpy, train_script, user_dir
from test_job_manager import managers, until, user  # noqa: F401  (user is a fixture)

from gpupool.spawner.pool.job_states import JobState
from gpupool.spawner.pool.leases import LeaseState
from gpupool.spawner.pool.preemption import RunningJob, WaitingServer, choose
from gpupool.spawner.pool.requests import MigSlice, Request, WholeGpus
from gpupool.spawner.service.jobs.job_manager import Submission
from gpupool.spawner.service.jobs.preemption_loop import Preemptor

H100 = WholeGpus(1, frozenset({"H100-80GB"}))
BATCH = frozenset({"batch", "low"})


def job(
    job_id: str, started: float, need: object = H100, cls: str = "batch", stopping: bool = False
) -> RunningJob:
    return RunningJob(job_id, "bob", need, cls, started, stopping)  # type: ignore[arg-type]


def test_the_youngest_preemptible_job_on_devices_the_server_can_use_is_chosen_once_it_waited_long_enough() -> (
    None
):
    ada = WaitingServer("L1", "ada", H100, waiting_since=0.0, description="H100-80GB")
    running = [
        job("old", 10.0),
        job("young", 50.0),
        job("mig", 90.0, need=MigSlice("3g.40gb")),  # a MIG slice would not serve a whole-GPU server
        job("protected", 95.0, cls="interactive"),
    ]
    assert choose([ada], running, now=100.0, after=300.0, preemptible=BATCH) is None  # not waited enough
    chosen = choose([ada], running, now=400.0, after=300.0, preemptible=BATCH)
    assert chosen is not None and chosen.job.job_id == "young"
    assert chosen.reason.startswith("preempted: ada's server had waited 7 min for H100-80GB")
    # one at a time: while a job is stopping (its devices may be the ones), nobody else is stopped
    stopping = [job("old", 10.0), job("young", 50.0, stopping=True)]
    assert choose([ada], stopping, now=400.0, after=300.0, preemptible=BATCH) is None
    assert (
        choose([ada], [job("low", 50.0, cls="low")], now=400.0, after=300.0, preemptible=frozenset()) is None
    )


def test_a_waiting_server_preempts_a_checkpointing_job_which_resumes_and_finishes(
    tmp_path: Path,
    user: str,  # noqa: F811
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
    server = jobs.leases.request_lease("ada", [], "server", "", "h100", Request(1000, 1024, H100))
    assert server.state is LeaseState.QUEUED

    preemptor = Preemptor(jobs, after=0.5, preemptible=BATCH)
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
