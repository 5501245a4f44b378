"""Notebook side of gpupool: ``submit()`` and job handles, ``JobPanel`` and ``GpuMonitor``, over the one API client.

Importing this package is cheap: ``submit`` and friends need only httpx; ``JobPanel`` and ``GpuMonitor``
load ipywidgets on first use.
"""

from typing import Any

from ._api import Connection, GpupoolError
from .jobs import Job, job, my_jobs, submit

__all__ = ["Connection", "GpuMonitor", "GpupoolError", "Job", "JobPanel", "job", "my_jobs", "submit"]


def __getattr__(name: str) -> Any:
    if name == "JobPanel":
        from .job_panel import JobPanel

        return JobPanel
    if name == "GpuMonitor":
        from .gpu_monitor import GpuMonitor

        return GpuMonitor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
