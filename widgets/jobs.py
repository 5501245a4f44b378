"""Training jobs from a notebook: ``submit()`` sends a command to the pool and returns a :class:`Job` handle.

    from gpupool.widgets import submit
    job = submit(["python", "train.py", "--steps", "200"], profile="a100-pair", max_runtime=6 * 3600)
    job.status          # "queued", "running", "succeeded", …
    job.follow()        # print the log as it grows, until the job ends
    job.wait()          # block until it ends; returns the final state
    job.cancel()

The job runs as you, on the devices its lease names, whether or not this notebook is still running. Every call
asks the service afresh: a handle never holds stale state.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO
from urllib.parse import quote

from ._api import ENV_VAR, Connection

NOTEBOOK = "notebook"  # submit(environment=NOTEBOOK): the environment this notebook's server runs in

FINISHED = frozenset({"succeeded", "failed", "cancelled", "timed-out"})


class Job:
    """A handle on one job of the service; cheap to make again from its id with :func:`job`."""

    def __init__(self, job_id: str, connection: Connection) -> None:
        self.id = job_id
        self._connection = connection

    def __repr__(self) -> str:
        model = self.model()
        return f"<gpupool job {self.id} {model['name']!r}: {model['state']} ({model['reason']})>"

    def model(self) -> dict[str, Any]:
        """Everything the service knows about the job now (state, reason, devices, queue position, history)."""
        model: dict[str, Any] = self._connection.call("GET", f"jobs/{self.id}")
        return model

    @property
    def status(self) -> str:
        """The job's state now: queued, running, requeued, succeeded, failed, cancelled or timed-out."""
        return str(self.model()["state"])

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def logs(self, offset: int = 0) -> str:
        """The log so far (from byte ``offset``), every attempt's output in order."""
        return self._connection.text(f"jobs/{self.id}/logs", offset=offset)

    def follow(self, out: TextIO | None = None) -> str:
        """Write the log to ``out`` (default stdout) as it grows, until the job ends; return the final state."""
        out = out or sys.stdout
        offset = 0
        while True:
            for chunk in self._connection.stream(f"jobs/{self.id}/logs", follow="true", offset=offset):
                offset += len(chunk)
                out.write(chunk.decode("utf-8", errors="replace"))
                out.flush()
            # The service ends the stream once the job has finished; a proxy may cut it sooner: go on from here.
            if (state := self.status) in FINISHED:
                return state

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> str:
        """Block until the job ends (or ``timeout`` seconds pass: TimeoutError); return the final state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (state := self.status) not in FINISHED:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} is still {state} after {timeout:g} s")
            time.sleep(poll)
        return state

    def cancel(self) -> str:
        """Stop the job (SIGTERM, then SIGKILL after the grace period) and free its devices; return the state."""
        return str(self._connection.call("DELETE", f"jobs/{self.id}")["state"])


def submit(
    command: Sequence[str],
    profile: str,
    *,
    name: str | None = None,
    working_dir: str | None = None,
    env: Mapping[str, str] | None = None,
    max_runtime: float | str | None = None,
    retries: int = 2,
    priority_class: str = "batch",
    submission_id: str | None = None,
    environment: str | None = None,
    connection: Connection | None = None,
) -> Job:
    """Submit ``command`` (a list of arguments, never a shell string) to run on ``profile``'s devices.

    ``max_runtime`` is seconds or a duration such as ``"2h"``. ``submission_id`` makes it safe to retry: the
    same id returns the same job, never a second one. ``environment`` is one of the profile's environments,
    or ``"notebook"`` for this notebook's own.
    """
    body = submission(
        command,
        profile,
        name=name,
        working_dir=working_dir,
        env=env,
        max_runtime=max_runtime,
        retries=retries,
        priority_class=priority_class,
        submission_id=submission_id,
        environment=environment,
    )
    connection = connection or Connection()
    created = connection.call("POST", "jobs", json=body)
    return Job(str(created["id"]), connection)


def submission(
    command: Sequence[str],
    profile: str,
    *,
    name: str | None = None,
    working_dir: str | None = None,
    env: Mapping[str, str] | None = None,
    max_runtime: float | str | None = None,
    retries: int = 2,
    priority_class: str = "batch",
    submission_id: str | None = None,
    environment: str | None = None,
) -> dict[str, Any]:
    """The body of ``POST jobs`` for :func:`submit` and ``JobPanel`` (which sends it without blocking).
    ``environment="notebook"`` is the notebook's own (its server's ``GPUPOOL_ENVIRONMENT``)."""
    if isinstance(command, str):
        raise TypeError('command must be a list of arguments, e.g. ["python", "train.py"], not a string')
    if isinstance(max_runtime, float) and not math.isfinite(max_runtime):  # JSON has no NaN: say which field
        raise ValueError(f"max_runtime: seconds or a duration such as '2h', got {max_runtime}")
    body: dict[str, Any] = {
        "command": list(command),
        "profile": profile,
        "retries": retries,
        "priority_class": priority_class,
        "env": dict(env or {}),
    }
    if environment == NOTEBOOK:
        environment = os.environ.get(ENV_VAR) or None
        if environment is None:
            raise ValueError(
                f"environment: this notebook's server runs in no named environment ({ENV_VAR} is unset)"
            )
    optional = {
        "name": name,
        "working_dir": working_dir,
        "max_runtime": max_runtime,
        "environment": environment,
    }
    body |= {key: value for key, value in optional.items() if value is not None}
    if submission_id is not None:
        body["submission_id"] = submission_id
    return body


def job(job_id: str, connection: Connection | None = None) -> Job:
    """A handle on a job submitted earlier (from another notebook, or before a kernel restart); an id the
    service does not know, or another user's job, is a :class:`GpupoolError` here, not at the first use."""
    connection = connection or Connection()
    connection.call("GET", f"jobs/{quote(job_id, safe='')}")
    return Job(job_id, connection)


def my_jobs(connection: Connection | None = None) -> list[Job]:
    """Handles on every job of yours the service remembers, oldest first."""
    connection = connection or Connection()
    return [Job(str(model["id"]), connection) for model in connection.call("GET", "jobs")]
