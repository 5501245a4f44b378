"""Notebook side of gpupool: a client of the gpupool service for jobs, from inside a notebook server.

Importing this package is cheap (no widget library): ``submit`` and friends need only httpx.
"""

from .client import Connection, GpupoolError
from .jobs import Job, job, my_jobs, submit

__all__ = ["Connection", "GpupoolError", "Job", "job", "my_jobs", "submit"]
