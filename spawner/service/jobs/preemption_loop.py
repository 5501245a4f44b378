"""The preemption loop: every few seconds, the service asks :mod:`...pool.preemption` whether a waiting server
has waited long enough to stop a batch job for it, and if so stops and requeues that job."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ...pool.job_states import JobState
from ...pool.leases import LeaseState
from ...pool.preemption import Preemption, RunningJob, WaitingServer, choose
from ...pool.requests import describe
from .job_manager import JobManager

log = logging.getLogger(__name__)


class Preemptor:
    """Stops a preemptible job for a server that has waited ``after`` seconds (see :mod:`...pool.preemption`)."""

    def __init__(
        self,
        jobs: JobManager,
        *,
        after: float,
        preemptible: frozenset[str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.jobs = jobs
        self.after = after
        self.preemptible = preemptible
        self._clock = clock

    def step(self) -> Preemption | None:
        """One look: the preemption made, or None. None while placements are held (a silent API server):
        servers then wait for the cluster, not for devices, and a stopped job's devices would go to no one."""
        if self.jobs.leases.placements_held is not None:
            return None
        waiting = [
            WaitingServer(lease.id, lease.user, lease.request.gpu, lease.created_at, describe(lease.request))
            for lease in self.jobs.leases.all_leases(active_only=True)
            if lease.state is LeaseState.QUEUED and lease.owner_kind == "server"
        ]
        if not waiting:
            return None
        running = []
        for job in self.jobs.store.live():
            lease = self.jobs.lease_of(job) if job.state is JobState.RUNNING else None
            if lease is not None and lease.state is LeaseState.GRANTED:
                since = job.started_at or job.submitted_at
                stopping = job.stop is not None
                running.append(
                    RunningJob(job.id, job.user, lease.request.gpu, job.priority_class, since, stopping)
                )
        chosen = choose(waiting, running, now=self._clock(), after=self.after, preemptible=self.preemptible)
        if chosen is not None:
            log.info("job %s of %s %s", chosen.job.job_id, chosen.job.user, chosen.reason)
            self.jobs.preempt(chosen.job.job_id, chosen.reason)
        return chosen

    async def run_forever(self, interval: float = 2.0) -> None:
        """Call :meth:`step` every ``interval`` seconds until cancelled."""
        while True:
            try:
                self.step()
            except Exception:
                log.exception("preemption step failed")
            await asyncio.sleep(interval)
