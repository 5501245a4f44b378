"""The service's database schema: every table on one metadata, created in one place when the store opens.

Leases, jobs, usage minutes, health marks and culls share one database (SQLite by default, PostgreSQL with
``GPUPOOL_DB_URL``) so that one backup holds one truth. Tables are created with ``create_all``; migrations
(Alembic) come when a table first changes.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.orm import DeclarativeBase


class Base(DeclarativeBase):
    """The declarative base of every table of the service."""


def create_schema(engine: Engine) -> None:
    """Create the tables that do not exist yet (never alters one)."""
    from . import cull_store, health_store, job_store, lease_store, usage_store  # noqa: F401  (tables join Base)

    Base.metadata.create_all(engine)
