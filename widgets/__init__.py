"""Notebook side of gpupool: a client of the gpupool service for jobs, and ``JobPanel``.

Importing this package is cheap: ``submit`` and friends need only httpx, and ``JobPanel`` loads ipywidgets
on first use.
"""

from typing import Any

from .client import Connection, GpupoolError
from .jobs import Job, job, my_jobs, submit

__all__ = ["Connection", "GpupoolError", "Job", "JobPanel", "job", "my_jobs", "submit"]


def __getattr__(name: str) -> Any:
    if name == "JobPanel":
        from .job_panel import JobPanel

        return JobPanel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
