"""The jobs API: submit, list, read, follow the log of, and cancel training jobs.

Mounted by :func:`.app.create_app` beside the lease routes, with the same conventions: every error is a
``Problem``; 400 names the field (an empty command, a working directory outside the home, an unknown profile,
a runtime over the profile's limit); 403 for a job of another user (whose it is is not said), a profile the
user's groups may not use, a quota or the cap on queued jobs (``quota_exceeded``), and a user with no system
account to run as; 404 for no such job; 409 for a ``submission_id`` reused for a different job and for an
environment no GPU of the profile can run. Users see
and touch only their own jobs; admins (``custom:gpupool:admin``) and the hub (``custom:gpupool:leases``) see
all. This module has no ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Response, status
from fastapi.responses import JSONResponse, StreamingResponse

from ...pool.job_states import Job, JobState
from ...pool.preemption import PREEMPTED
from ...pool.profiles import refuse_environment
from ...user_accounts import AccountError
from ..jobs.job_manager import JobManager
from ..jobs.runner import NoHome
from ..jobs.submission import InvalidJob, Submission, SubmissionConflict, TooManyQueuedJobs
from ..store.job_store import JobNotFound
from .auth import Caller
from .context import CallerDep, PartsDep, usable_profile
from .job_models import JobOut, JobRequest
from .models import Problem

_STREAM_POLL = 0.2  # seconds between looks at a followed log
# A followed log may stream for days: its token is asked of the hub afresh this often, and a token the hub
# no longer accepts (revoked, expired) ends the stream.
STREAM_TOKEN_CHECK = 10.0

router = APIRouter()

# GET jobs answers the newest jobs only: a hostile-user trial's thousands of finished jobs made every listing
# (the job panel refreshes it) slower for everyone
LISTED = 200
MAX_LISTED = 5000


def _out(jobs: JobManager, job_id: str) -> JobOut:
    return job_out(jobs, jobs.get(job_id))


def job_out(jobs: JobManager, job: Job) -> JobOut:
    """The job as the API shows it: with its lease's devices (and what holds up its start on a cluster), or
    while it waits its place and expected start."""
    position = jobs.position(job)
    start = jobs.leases.expected_start(job.lease_id) if position is not None and job.lease_id else None
    held_up = None
    if job.state is JobState.RUNNING:
        held_up = jobs.runner.holdup(job)
    elif job.state.waiting:  # e.g. the cluster's API server silent: no place in the queue moves
        held_up = jobs.leases.placements_held
    return JobOut.from_job(job, jobs.lease_of(job), position, start, held_up, jobs.runner.log_file)


def _visible(jobs: JobManager, caller: Caller, job_id: str) -> str:
    job = jobs.get(job_id)
    caller.check_may_see(job.user, f"job {job_id}")
    return job.id


@router.post("/jobs", status_code=status.HTTP_201_CREATED, summary="Submit a job (queued until it runs)")
async def post_job(body: JobRequest, parts: PartsDep, caller: CallerDep, response: Response) -> JobOut:
    jobs = parts.jobs
    if caller.kind != "user":
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "jobs run as a user; submit with a user's token (in their notebook it is already set; else the "
            "user makes one on the hub's token page, /hub/token, for JUPYTERHUB_API_TOKEN)",
        )
    parts.check_not_retiring(caller.name)
    # an unknown profile is a 400, one the user's groups may not use a 403, an environment it cannot run a 409
    profile = usable_profile(jobs.profiles, body.profile, caller.groups, caller.uses_every_profile)
    refuse_environment(profile, body.environment, parts.environments_never_fit[profile.slug])
    ask = Submission(
        profile=body.profile,
        command=body.command,
        name=body.name,
        working_dir=body.working_dir,
        env=body.env,
        max_runtime=body.max_runtime,
        priority_class=body.priority_class,
        retries=body.retries,
        submission_id=body.submission_id,
        environment=body.environment,
    )
    job, created = jobs.submit(caller.name, caller.groups, ask, is_admin=caller.is_admin)
    if not created:
        response.status_code = status.HTTP_200_OK
    return _out(jobs, job.id)


@router.get("/jobs", summary="The caller's newest jobs; every user's (or one user's) for admins and the hub")
async def list_jobs(
    parts: PartsDep,
    caller: CallerDep,
    user: str | None = None,
    limit: Annotated[
        int, Query(ge=1, le=MAX_LISTED, description="the newest this many, oldest first")
    ] = LISTED,
) -> list[JobOut]:
    jobs = parts.jobs
    if user is not None and user != caller.name and not caller.sees_everyone:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"user: {caller.name} may list only their own jobs")
    everyone = user is None and caller.sees_everyone
    found = jobs.all_jobs(limit) if everyone else jobs.jobs_for(user or caller.name, limit)
    await parts.check_hub_has(user, caller, found)
    return [job_out(jobs, job) for job in found]


@router.get("/jobs/{job_id}", summary="One job, with its history")
async def get_job(job_id: str, parts: PartsDep, caller: CallerDep) -> JobOut:
    jobs = parts.jobs
    return _out(jobs, _visible(jobs, caller, job_id))


@router.get(
    "/jobs/{job_id}/logs",
    summary="The job's output; with follow=true, streamed until the job ends",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/plain": {}}}},
)
async def get_logs(
    request: Request,
    job_id: str,
    parts: PartsDep,
    caller: CallerDep,
    follow: bool = False,
    offset: int = 0,
) -> Response:
    jobs = parts.jobs
    _visible(jobs, caller, job_id)
    if offset < 0:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "offset: must be 0 or more")
    if not follow:
        return Response(await _read_settled(jobs, job_id, offset), media_type="text/plain; charset=utf-8")

    async def still_accepted() -> bool:
        token = parts.auth.token_of(request, request.headers.get("authorization"))
        try:
            await parts.auth.check(token, fresh=True)
        except HTTPException:
            return False
        return True

    stream = _follow(jobs, job_id, offset, still_accepted)
    return StreamingResponse(stream, media_type="text/plain; charset=utf-8")


@router.post(
    "/jobs/{job_id}/requeue",
    summary="Admins: stop a running job and put it back in the queue with its checkpoint folder (no retry used)",
)
async def requeue_job(job_id: str, parts: PartsDep, caller: CallerDep) -> JobOut:
    """What preemption does, by hand: to make room, or to move a job off a node about to be serviced."""
    caller.check_admin("requeue jobs")
    jobs = parts.jobs
    job = jobs.get(job_id)
    if job.state is not JobState.RUNNING:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"job {job_id} is {job.state}; only a running job is requeued"
        )
    jobs.preempt(job_id, f"{PREEMPTED} by {caller.kind} {caller.name}; requeued with its checkpoint folder")
    return _out(jobs, job_id)


@router.delete(
    "/jobs/{job_id}", summary="Cancel a job; it answers once the job has stopped (or its grace ran out)"
)
async def delete_job(job_id: str, parts: PartsDep, caller: CallerDep) -> JobOut:
    jobs = parts.jobs
    _visible(jobs, caller, job_id)
    job = jobs.cancel(job_id, f"{caller.kind} {caller.name}")
    deadline = asyncio.get_running_loop().time() + jobs.grace + 5
    while not job.state.finished and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
        job = jobs.get(job_id)
    return _out(jobs, job_id)


async def _read_settled(jobs: JobManager, job_id: str, offset: int) -> bytes:
    """The whole log from ``offset``; where the runner fetches logs in the background (Kubernetes), an empty
    first answer is given its time to arrive (a finished job's log read once, later, came back empty)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + jobs.runner.log_lag_s
    while not (body := _read_all(jobs, job_id, offset)) and loop.time() < deadline:
        await asyncio.sleep(0.1)
    return body


def _read_all(jobs: JobManager, job_id: str, offset: int) -> bytes:
    job = jobs.get(job_id)
    chunks = []
    while chunk := jobs.read_log(job, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


async def _follow(
    jobs: JobManager, job_id: str, offset: int, still_accepted: Callable[[], Awaitable[bool]]
) -> AsyncIterator[bytes]:
    """The log from ``offset`` as it grows; ends once the job has finished and everything is sent, or once
    the caller's token is no longer accepted (checked every :data:`STREAM_TOKEN_CHECK` seconds)."""
    loop = asyncio.get_running_loop()
    next_check = loop.time() + STREAM_TOKEN_CHECK
    while True:
        if loop.time() >= next_check:
            if not await still_accepted():
                return
            next_check = loop.time() + STREAM_TOKEN_CHECK
        job = jobs.get(job_id)  # read the state first: a job that finished has written its last line
        chunk = jobs.read_log(job, offset)
        if chunk:
            offset += len(chunk)
            yield chunk
            continue
        if job.state.finished:
            return
        await asyncio.sleep(_STREAM_POLL)


class _JobProblem(Exception):
    def __init__(self, code: int, error: str, detail: str, field: str | None = None) -> None:
        self.code, self.error, self.detail, self.field = code, error, detail, field
        super().__init__(detail)


def add_job_error_handlers(app: FastAPI) -> None:
    """The job errors as :class:`Problem` bodies, mapped once."""

    def problem(code: int, error: str, detail: str, fields: list[str]) -> JSONResponse:
        return JSONResponse(Problem(error=error, detail=detail, fields=fields).model_dump(), status_code=code)

    async def invalid(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidJob)
        return problem(400, "invalid_request", str(exc), [exc.field])

    async def no_account(_request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, NoHome):  # the user may fix it (a first server makes it), not an admin
            return problem(409, "no_home", str(exc), [])
        return problem(403, "no_system_account", str(exc), [])

    async def capped(_request: Request, exc: Exception) -> JSONResponse:
        return problem(403, "quota_exceeded", str(exc), [])

    async def conflict(_request: Request, exc: Exception) -> JSONResponse:
        return problem(409, "submission_conflict", str(exc), ["submission_id"])

    async def not_found(_request: Request, exc: Exception) -> JSONResponse:
        return problem(404, "not_found", str(exc), [])

    async def job_problem(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, _JobProblem)
        return problem(exc.code, exc.error, exc.detail, [exc.field] if exc.field else [])

    app.add_exception_handler(InvalidJob, invalid)
    app.add_exception_handler(AccountError, no_account)
    app.add_exception_handler(TooManyQueuedJobs, capped)
    app.add_exception_handler(SubmissionConflict, conflict)
    app.add_exception_handler(JobNotFound, not_found)
    app.add_exception_handler(_JobProblem, job_problem)
