"""What a stopped ``gpupool up`` leaves behind it: training jobs, which outlive the hub by design.

Jobs keep running (and holding their devices) across a stop, so the next ``gpupool up`` on the same state
folder takes them back. A first-day trial stopped the hub with five jobs running and was told only that its
one server had stopped; ``gpupool cancel`` then could not reach any service. So the stop now says what keeps
running and how to reach it again.
"""

from __future__ import annotations

from pathlib import Path

from ..pool.job_states import Job, JobState

LISTED = 5  # jobs named in the line; the rest are counted


def left_running_message(database: Path, state_dir: Path) -> str | None:
    """The line to print once the hub has stopped, or None when no job is running or waiting; ``database``:
    the service's SQLite file."""
    jobs = _unfinished(f"sqlite:///file:{database}?mode=ro&uri=true")  # read only: the service owns it
    if not jobs:
        return None
    running = [j for j in jobs if j.state is JobState.RUNNING]
    waiting = len(jobs) - len(running)
    said = []
    if running:
        named = ", ".join(f"{j.id} ({j.user}'s {j.name})" for j in running[:LISTED])
        more = f" and {len(running) - LISTED} more" if len(running) > LISTED else ""
        whose = "its" if len(running) == 1 else "their"
        said.append(f"{_jobs(len(running))} running on {whose} devices: {named}{more}")
    if waiting:
        said.append(f"{_jobs(waiting)} waiting in the queue")
    return (
        f"gpupool: left running: {'; '.join(said)}. `gpupool up --state-dir {state_dir}` takes them back; "
        "then `gpupool cancel ID` ends one."
    )


def _jobs(count: int) -> str:
    return f"{count} training job{'' if count == 1 else 's'}"


def _unfinished(db_url: str) -> list[Job]:
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    from ..service.store.job_store import JobStore

    engine = create_engine(db_url)
    try:
        return JobStore(engine).live()  # oldest first
    except SQLAlchemyError:  # locked, or of another version: the stop says nothing rather than fail
        return []
    finally:
        engine.dispose()
