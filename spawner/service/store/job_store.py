"""The job store: jobs and every transition they made, in the same database as the leases.

It shares the lease store's engine (SQLite with WAL by default, any SQLAlchemy URL otherwise) and its habits:
the tables of :mod:`.schema`, one short transaction per write with Core statements, and a write-through cache
of the jobs that are not finished (queued, running, requeued), so the job manager's loop and the API read
live jobs without a query. Finished jobs are read from the database.

A job's transitions live in their own table (``job_transitions``), one row per change, so the history is
never rewritten. A client's ``submission_id`` is unique per user: a second submission with it finds the
first job instead of making another (:meth:`JobStore.by_submission`; the unique index is the backstop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, cast

from sqlalchemy import (
    JSON,
    Engine,
    Float,
    ForeignKey,
    Integer,
    String,
    Table,
    UniqueConstraint,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Mapped, mapped_column, sessionmaker

from ...pool.job_states import FINISHED, Job, JobState, StopRequest, Transition
from .schema import Base


class JobNotFound(LookupError):
    """No job has this id."""


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("user", "submission_id", name="one_job_per_submission"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, unique=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    name: Mapped[str] = mapped_column(String(255))
    profile: Mapped[str] = mapped_column(String(63))
    command: Mapped[list[str]] = mapped_column(JSON)
    working_dir: Mapped[str] = mapped_column(String(4096))
    env: Mapped[dict[str, str]] = mapped_column(JSON)
    priority_class: Mapped[str] = mapped_column(String(32))
    retries: Mapped[int] = mapped_column(Integer)
    max_runtime: Mapped[float | None] = mapped_column(Float)
    submitted_at: Mapped[float] = mapped_column(Float)
    submission_id: Mapped[str | None] = mapped_column(String(255))
    groups: Mapped[list[str]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    attempts: Mapped[int] = mapped_column(Integer)
    lease_id: Mapped[str | None] = mapped_column(String(32))
    job_dir: Mapped[str] = mapped_column(String(4096))
    pid: Mapped[int | None] = mapped_column(Integer)
    pid_start: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    stop: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class TransitionRow(Base):
    __tablename__ = "job_transitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    state: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(String(2000))


_JOBS = cast(Table, JobRow.__table__)
_TRANSITIONS = cast(Table, TransitionRow.__table__)
_INSERT_JOB = insert(_JOBS)
_INSERT_TRANSITION = insert(_TRANSITIONS)
_UPDATE_JOB = update(_JOBS).where(_JOBS.c.id == bindparam("job_id"))
_FIELDS = (
    "state",
    "attempts",
    "lease_id",
    "job_dir",
    "pid",
    "pid_start",
    "started_at",
    "finished_at",
    "exit_code",
)


class JobStore:
    """Jobs in the database behind ``engine`` (the lease store's); every write returns the job as stored."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        with self._sessions.begin() as session:
            self._next_seq = (session.scalar(select(func.max(JobRow.seq))) or 0) + 1
        finished = [s.value for s in FINISHED]
        self._live: dict[str, Job] = {job.id: job for job in self._query(JobRow.state.not_in(finished))}

    def add(self, job: Job) -> Job:
        """Record a new job and its first transition in one transaction."""
        with self.engine.begin() as connection:
            connection.execute(
                _INSERT_JOB,
                {
                    "id": job.id,
                    "seq": self._next_seq,
                    "user": job.user,
                    "name": job.name,
                    "profile": job.profile,
                    "command": list(job.command),
                    "working_dir": job.working_dir,
                    "env": dict(job.env),
                    "priority_class": job.priority_class,
                    "retries": job.retries,
                    "max_runtime": job.max_runtime,
                    "submitted_at": job.submitted_at,
                    "submission_id": job.submission_id,
                    "groups": sorted(job.groups),
                    "stop": _stop_json(job.stop),
                    **{name: _plain(getattr(job, name)) for name in _FIELDS},
                },
            )
            connection.execute(
                _INSERT_TRANSITION,
                [
                    {"job_id": job.id, "state": t.state.value, "at": t.at, "reason": t.reason}
                    for t in job.history
                ],
            )
        self._next_seq += 1
        self._remember(job)
        return job

    def save(self, job: Job) -> Job:
        """Write what changed since the stored version: its fields, and any transitions it added."""
        old = self.get(job.id)
        if old is None:
            raise JobNotFound(f"no job {job.id!r}")
        added = job.history[len(old.history) :]
        values = {name: _plain(getattr(job, name)) for name in _FIELDS}
        with self.engine.begin() as connection:
            connection.execute(_UPDATE_JOB, {"job_id": job.id, "stop": _stop_json(job.stop), **values})
            if added:
                connection.execute(
                    _INSERT_TRANSITION,
                    [
                        {"job_id": job.id, "state": t.state.value, "at": t.at, "reason": t.reason}
                        for t in added
                    ],
                )
        self._remember(job)
        return job

    def _remember(self, job: Job) -> None:
        if job.state.finished:
            self._live.pop(job.id, None)
        else:
            self._live[job.id] = job

    def get(self, job_id: str) -> Job | None:
        live = self._live.get(job_id)
        if live is not None:
            return live
        found = self._query(JobRow.id == job_id)
        return found[0] if found else None

    def by_submission(self, user: str, submission_id: str) -> Job | None:
        """The job ``user`` submitted with ``submission_id``, if any."""
        for job in self._live.values():
            if job.user == user and job.submission_id == submission_id:
                return job
        found = self._query(JobRow.user == user, JobRow.submission_id == submission_id)
        return found[0] if found else None

    def live(self) -> list[Job]:
        """Every job not finished, oldest first: what the manager's loop watches."""
        return list(self._live.values())

    def list_for_user(self, user: str, newest: int | None = None) -> list[Job]:
        """A user's jobs, oldest first: every one, or every unfinished one and the ``newest`` last submitted
        (a three-day run stays listed behind hundreds of short ones)."""
        listed = self._query(JobRow.user == user, newest=newest)
        return listed if newest is None else self._with_live(listed, lambda job: job.user == user)

    def list_all(self, newest: int | None = None) -> list[Job]:
        listed = self._query(newest=newest)
        return listed if newest is None else self._with_live(listed, lambda job: True)

    def _with_live(self, listed: list[Job], wanted: Callable[[Job], bool]) -> list[Job]:
        by_id = {job.id: job for job in listed} | {j.id: j for j in self._live.values() if wanted(j)}
        return sorted(by_id.values(), key=lambda job: job.submitted_at)

    def _query(self, *where: Any, newest: int | None = None) -> list[Job]:
        with self._sessions.begin() as session:
            newest_first = select(JobRow).where(*where).order_by(JobRow.seq.desc()).limit(newest)
            rows = list(reversed(list(session.scalars(newest_first))))
            history: dict[str, list[Transition]] = {row.id: [] for row in rows}
            if rows:
                statement = (
                    select(TransitionRow)
                    .where(TransitionRow.job_id.in_(list(history)))
                    .order_by(TransitionRow.id)
                )
                for t in session.scalars(statement):
                    history[t.job_id].append(Transition(JobState(t.state), t.at, t.reason))
            return [_job(row, tuple(history[row.id])) for row in rows]


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, JobState) else value


def _stop_json(stop: StopRequest | None) -> dict[str, Any] | None:
    return None if stop is None else asdict(stop) | {"then": stop.then.value}


def _job(row: JobRow, history: tuple[Transition, ...]) -> Job:
    stop = None
    if row.stop is not None:
        stop = StopRequest(**(row.stop | {"then": JobState(row.stop["then"])}))
    return Job(
        id=row.id,
        user=row.user,
        name=row.name,
        profile=row.profile,
        command=tuple(row.command),
        working_dir=row.working_dir,
        env=dict(row.env),
        priority_class=row.priority_class,
        retries=row.retries,
        max_runtime=row.max_runtime,
        submitted_at=row.submitted_at,
        state=JobState(row.state),
        history=history,
        submission_id=row.submission_id,
        groups=frozenset(row.groups),
        attempts=row.attempts,
        lease_id=row.lease_id,
        job_dir=row.job_dir,
        pid=row.pid,
        pid_start=row.pid_start,
        started_at=row.started_at,
        finished_at=row.finished_at,
        exit_code=row.exit_code,
        stop=stop,
    )
