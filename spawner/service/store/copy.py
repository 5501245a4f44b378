"""Copying the service's store into another database: how a lab moves from SQLite to PostgreSQL (or to a new
database server) keeping every lease, queued request, job and its history, health mark and usage minute.

A new, empty store knows none of the running servers' leases, so without a copy every server had to be
stopped first. The copy runs while the service is stopped: it claims both databases as the service does
(:mod:`.ownership`), so a service still running on either one stops it with that service's own sentence. The
target must hold none of gpupool's rows: nothing there is overwritten or merged. Rows go in one transaction,
table by table in the order their keys need, and each table's count is checked against the source's before
it commits, so a copy that fails leaves the target as empty as it was. The source keeps its rows; its
schema is brought up to date first, as the service would on opening it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, Engine, Integer, Table, func, select, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from .health_store import HealthStore
from .lease_store import LeaseStore
from .ownership import Claim, StoreTaken
from .schema import Base

BATCH = 5000  # rows read and written at a time: usage minutes run to millions


class StoreCopyError(ValueError):
    """The copy cannot run or did not finish; the message names the option (--from, --to) and what to do."""


@dataclass(frozen=True)
class Copied:
    """Rows copied, per table, in the order they were copied."""

    rows: tuple[tuple[str, int], ...]

    def in_words(self) -> str:
        return ", ".join(f"{name.replace('_', ' ')} {count:,}" for name, count in self.rows)


def copy_store(source: str, target: str, say: Callable[[str], None] = lambda _: None) -> Copied:
    """Copy every row of the store at ``source`` into the empty store at ``target`` (SQLAlchemy URLs)."""
    _check_urls(source, target)
    claims: list[Claim] = []
    stores: list[LeaseStore] = []
    try:
        for option, url in (("--from", source), ("--to", target)):
            claims.append(_claim(option, url))
        for option, url in (("--from", source), ("--to", target)):
            stores.append(_open(option, url))
        HealthStore(stores[0].engine)  # brings a database from before health marks up to date first
        return _copy_rows(stores[0].engine, stores[1].engine, say)
    finally:
        for store in stores:
            store.close()
        for claim in claims:
            claim.release()


def _check_urls(source: str, target: str) -> None:
    parsed = {}
    for option, url in (("--from", source), ("--to", target)):
        try:
            parsed[option] = make_url(url)
        except ArgumentError:
            raise StoreCopyError(
                f"{option}: expected a database URL such as sqlite:////var/lib/gpupool/gpupool.sqlite or "
                f"postgresql+psycopg://gpupool@db.example.org/gpupool, got {url!r}"
            ) from None
    if _same_place(parsed["--from"], parsed["--to"]):
        raise StoreCopyError("--to: names the same database as --from; copy into another, empty one")
    found, new = parsed["--from"], parsed["--to"]
    if found.get_backend_name() == "sqlite" and not Path(str(found.database or "")).is_file():
        raise StoreCopyError(f"--from: there is no SQLite database at {found.database!r}{_slashes(found)}")
    if new.get_backend_name() == "sqlite" and not Path(str(new.database or "")).resolve().parent.is_dir():
        raise StoreCopyError(
            f"--to: there is no folder for the SQLite database {new.database!r}{_slashes(new)}"
        )


def _slashes(url: URL) -> str:
    """A relative SQLite path is mostly a slash short of the absolute one meant."""
    relative = not str(url.database or "").startswith("/")
    return " (a relative path: an absolute one takes four slashes, sqlite:////var/lib/…)" if relative else ""


def _same_place(source: URL, target: URL) -> bool:
    """The same database, however spelled (a relative and an absolute path to one SQLite file, say)."""
    if source.get_backend_name() == target.get_backend_name() == "sqlite":
        return Path(str(source.database or "")).resolve() == Path(str(target.database or "")).resolve()
    return source == target


def _claim(option: str, url: str) -> Claim:
    try:
        return Claim(url)
    except StoreTaken as taken:
        also = " (or --to names the same database as --from)" if option == "--to" else ""
        raise StoreCopyError(
            f"{option}: {taken.who}; stop the hub (and its service) before copying{also}"
        ) from None
    except (SQLAlchemyError, OSError, ImportError) as error:
        raise StoreCopyError(f"{option}: cannot open the database: {_why_not(error)}") from None


def _open(option: str, url: str) -> LeaseStore:
    try:
        return LeaseStore(url)  # creates any table an older database lacks, as the service would
    except (SQLAlchemyError, OSError, ImportError) as error:
        raise StoreCopyError(f"{option}: cannot open the database: {_why_not(error)}") from None


def _why_not(error: BaseException) -> str:
    """The error's first line, with what to write instead where the URL names a driver or a dialect wrongly."""
    said = _first_line(error)
    if isinstance(error, ImportError):
        return f"{said}: gpupool's PostgreSQL driver is psycopg (postgresql+psycopg://…)"
    if "sqlalchemy.dialects:postgres." in said:
        return f"{said}: the scheme is postgresql+psycopg://, not postgres"
    return said


def _copy_rows(source: Engine, target: Engine, say: Callable[[str], None]) -> Copied:
    tables = Base.metadata.sorted_tables  # parents before the rows that point at them
    copied = []
    with source.connect() as reading, target.begin() as writing:
        for table in tables:
            held = writing.scalar(select(func.count()).select_from(table)) or 0
            if held:
                raise StoreCopyError(
                    f"--to: the database already holds {held:,} row(s) in {table.name}; gpupool copies only "
                    "into an empty store, so nothing there is overwritten"
                )
        for table in tables:
            try:
                count = _copy_table(reading, writing, table)
            except SQLAlchemyError as error:  # a value the target refuses (a string longer than its column)
                raise StoreCopyError(
                    f"--to: {table.name}: {_first_line(error)}; nothing was copied"
                ) from None
            say(f"{table.name}: {count:,}")
            copied.append((table.name, count))
    return Copied(tuple(copied))


def _copy_table(reading: Connection, writing: Connection, table: Table) -> int:
    expected = reading.scalar(select(func.count()).select_from(table)) or 0
    result = reading.execution_options(stream_results=True).execute(select(table))
    for batch in result.mappings().partitions(BATCH):
        writing.execute(table.insert(), [dict(row) for row in batch])
    if writing.scalar(select(func.count()).select_from(table)) != expected:
        raise StoreCopyError(f"--to: {table.name} did not take every row of the source's; nothing was copied")
    _advance_sequence(writing, table)
    return expected


def _advance_sequence(writing: Connection, table: Table) -> None:
    """On PostgreSQL, move a serial key's sequence past the copied ids, or the next insert would reuse one."""
    if writing.dialect.name != "postgresql":
        return
    for column in table.primary_key.columns:
        if isinstance(column.type, Integer) and column.autoincrement in (True, "auto"):
            writing.execute(
                text(
                    f"SELECT setval(pg_get_serial_sequence('{table.name}', '{column.name}'), "
                    f"COALESCE((SELECT MAX({column.name}) FROM {table.name}), 0) + 1, false)"
                )
            )


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
