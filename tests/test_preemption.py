"""Preemption: a server that waited too long makes room by stopping a checkpointing batch job, which resumes.

Finding 1 of the researcher's-day review: nothing ever made room; a waiting interactive user never displaced
a batch job, even one that checkpoints. Now, past ``preempt_after_seconds``, the youngest running job of a
preemptible class on devices the server can use is stopped and requeued with its checkpoint folder (using
none of its retries), and never a server or a protected class. The preemption of a real checkpointing job
is in ``test_job_manager`` (which shares the job user's home with it).
"""

from __future__ import annotations

from gpupool.spawner.pool.preemption import RunningJob, WaitingServer, choose
from gpupool.spawner.pool.requests import MigSlice, WholeGpus

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
