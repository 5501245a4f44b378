"""The jobs API's request and response bodies (``POST jobs``, a job as the API shows it): pydantic models,
the OpenAPI document's schemas, as :mod:`.models` is for leases and profiles."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ...pool.job_states import MAX_RETRIES, Job
from ...pool.leases import Lease
from ...pool.profiles import parse_duration
from ..jobs.processes import checkpoint_dir
from .models import Device


class JobRequest(BaseModel):
    """``POST jobs``: a command to run on a profile's devices, as the caller."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] = Field(
        min_length=1,
        description='the program and its arguments, never a shell string: ["python", "train.py"]',
    )
    profile: str = Field(min_length=1, max_length=63, description="the profile's slug, e.g. a100-pair")
    name: str | None = Field(default=None, max_length=255, description="default: the program's name")
    working_dir: str | None = Field(
        default=None, max_length=4096, description="an absolute directory inside your home; default: the home"
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    max_runtime: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="seconds one run may take, or a duration such as 2h, 30m, 1d; default and limit: the "
        "profile's max_lifetime",
    )
    priority_class: str = Field(default="batch", description='"batch" (default) or "low"')
    retries: int = Field(
        default=2,
        ge=0,
        le=MAX_RETRIES,
        strict=True,
        description="times the pool may requeue it after a fault",
    )
    environment: str | None = Field(
        default=None,
        max_length=63,
        description="one of the profile's environments (GET profiles lists them); default: its default one. "
        "From a notebook, the server's own is in GPUPOOL_ENVIRONMENT",
    )
    submission_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="your id for this submission: sending it again returns the same job, never a second one",
    )

    @field_validator("max_runtime", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        """``"2h"`` and the like become seconds; numbers pass through to the field's own check (finite only)."""
        if isinstance(value, bool):  # JSON true is not one second
            raise ValueError(
                f"expected seconds or a duration such as 2h, 30m or 1d, got {str(value).lower()}"
            )
        if isinstance(value, str):
            seconds = parse_duration(value)
            if seconds is None and parse_duration(value.strip().removeprefix("-")) is not None:
                raise ValueError(f"must be more than 0 seconds, got {value.strip()}")
            if seconds is None:
                raise ValueError(f"expected seconds or a duration such as 2h, 30m or 1d, got {value!r}")
            return seconds
        return value


class TransitionOut(BaseModel):
    state: str
    at: float
    reason: str


class JobOut(BaseModel):
    id: str
    user: str
    name: str
    profile: str
    state: Literal["queued", "running", "requeued", "succeeded", "failed", "cancelled", "timed-out"]
    reason: str = Field(description="why it is in its state")
    command: list[str]
    working_dir: str
    env: dict[str, str]
    priority_class: str
    retries: int
    max_runtime: float | None
    submission_id: str | None
    attempts: int = Field(description="runs started so far")
    lease_id: str | None
    node: str | None
    devices: list[Device]
    visible_devices: str
    position: int | None = Field(description="place in the queue (0 is next) while waiting")
    expected_start: float | None = Field(
        default=None,
        description="while waiting: when it can expect to start (epoch seconds); null when unknown",
    )
    held_up: str | None = Field(
        default=None,
        description="what keeps it from starting beyond its place in the queue: while waiting, placements held "
        "(the cluster's API server silent); while running, a pod not yet scheduled or a Job waiting for Kueue; "
        "null once it runs",
    )
    checkpoint_dir: str
    log_path: str | None = Field(
        description="the file the run's output is also kept in, in the job's folder; null where the log is "
        "only the pod's (Kubernetes): GET jobs/{id}/logs reads it"
    )
    exit_code: int | None
    stopping: str | None = Field(
        description="while a stop is under way: what the job becomes once it is done"
    )
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    history: list[TransitionOut]

    @classmethod
    def from_job(
        cls,
        job: Job,
        lease: Lease | None,
        position: int | None,
        expected_start: float | None = None,
        held_up: str | None = None,
        log_file: bool = True,
    ) -> JobOut:
        held = lease is not None and lease.state.value == "granted" and job.state.value == "running"
        return cls(
            id=job.id,
            user=job.user,
            name=job.name,
            profile=job.profile,
            state=job.state.value,
            reason=job.reason,
            command=list(job.command),
            working_dir=job.working_dir,
            env=dict(job.env),
            priority_class=job.priority_class,
            retries=job.retries,
            max_runtime=job.max_runtime,
            submission_id=job.submission_id,
            attempts=job.attempts,
            lease_id=job.lease_id,
            node=lease.node if lease is not None and held else None,
            devices=[Device.from_grant(g) for g in lease.devices] if lease is not None and held else [],
            visible_devices=lease.visible_devices if lease is not None and held else "",
            position=position,
            expected_start=expected_start,
            held_up=held_up,
            checkpoint_dir=checkpoint_dir(job.job_dir),
            log_path=f"{job.job_dir}/output.log" if log_file else None,
            exit_code=job.exit_code,
            stopping=job.stop.then.value if job.stop is not None else None,
            submitted_at=job.submitted_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            history=[TransitionOut(state=t.state.value, at=t.at, reason=t.reason) for t in job.history],
        )
