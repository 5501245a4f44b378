"""One service owns the pool: a second service pointed at the same database refuses to start.

Two services on one database would each grant from their own copy of the pool and hand the same GPU out
twice. The first service to start claims the database for as long as its process lives:

- **PostgreSQL**: a session advisory lock (``pg_try_advisory_lock``) on a connection kept open for the
  claim; the server drops it when that connection ends, a ``kill -9`` included. The server also drops it when
  *it* restarts, with the service still running: a lab's trial restarted PostgreSQL and a second service
  then started on the same database. So the owner looks every few seconds (:func:`keep_claim`), takes the
  lock again on a new connection when its session has gone, and stops if another service took it first.
- **SQLite**: an exclusive ``flock`` on ``<database>.owner`` beside the file, which the kernel drops when
  the process ends. An in-memory database belongs to its process anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Connection, create_engine, make_url, text
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger(__name__)

# The advisory lock's key: any fixed 64-bit number other applications on the database are unlikely to use.
ADVISORY_KEY = 0x67707570_6F6F6C  # "gpupool"


class StoreTaken(RuntimeError):
    """Another live service owns the database: ``who`` says which service and database; the message adds
    why this service stops."""

    def __init__(self, who: str) -> None:
        super().__init__(
            f"{who}; two services on one database would hand the same GPU out twice, so this one stops"
        )
        self.who = who


class Claim:
    """The claim on one database, held until :meth:`release` or the end of the process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._connection: Connection | None = None
        self._lock_fd: int | None = None
        parsed = make_url(url)
        self.locks_in_server = parsed.get_backend_name() != "sqlite"
        if parsed.get_backend_name() == "sqlite":
            if parsed.database not in (None, "", ":memory:"):
                self._lock_file(f"{parsed.database}.owner")
        else:
            self._advisory_lock()

    def _lock_file(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text().strip() or "unknown"
            os.close(fd)
            raise StoreTaken(
                f"another gpupool service (pid {holder}) owns the lease database {path.removesuffix('.owner')}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _advisory_lock(self) -> None:
        engine = create_engine(self.url, pool_size=1, max_overflow=0)
        connection = engine.connect()
        taken = not connection.scalar(text("SELECT pg_try_advisory_lock(:key)"), {"key": ADVISORY_KEY})
        connection.commit()  # the lock belongs to the session, not to this transaction
        if taken:
            connection.close()
            engine.dispose()
            where = make_url(self.url).render_as_string(hide_password=True)
            raise StoreTaken(
                f"another gpupool service owns the lease database {where} (it holds advisory lock {ADVISORY_KEY})"
            )
        self._connection = connection

    def keep(self) -> str | None:
        """Make sure the claim still holds; the sentence saying so when another service owns the database now.
        A session that ended (the database server restarted) is replaced and the lock taken again; while the
        server does not answer, nothing can be told, and the next look tries again."""
        if not self.locks_in_server:
            return None  # a flock lives as long as this process
        try:
            if self._connection is not None:
                self._connection.execute(text("SELECT 1"))
                self._connection.commit()
                return None
        except SQLAlchemyError:
            self._drop_connection()
            log.warning(
                "the session holding the lease database's lock ended (a database restart?); taking it again"
            )
        try:
            self._advisory_lock()
        except StoreTaken as taken:
            return str(taken)
        except SQLAlchemyError as error:
            log.warning(
                "the lease database does not answer (%s); its lock is taken again once it does", error
            )
        return None

    def _drop_connection(self) -> None:
        if self._connection is not None:
            engine = self._connection.engine
            with contextlib.suppress(SQLAlchemyError):
                self._connection.close()
            engine.dispose()
            self._connection = None

    def release(self) -> None:
        self._drop_connection()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def stop_this_process() -> None:
    """SIGTERM to this process: uvicorn's graceful shutdown, as when JupyterHub stops the service."""
    os.kill(os.getpid(), signal.SIGTERM)


async def keep_claim(claim: Claim, every_s: float, on_lost: Callable[[], None] = stop_this_process) -> None:
    """Look at the claim every ``every_s`` seconds (:meth:`Claim.keep`, in a thread: it talks to the
    database); once another service owns the database, log why and call ``on_lost``: two services on one
    database would hand the same GPU out twice, so this one stops."""
    while True:
        await asyncio.sleep(every_s)
        lost = await asyncio.to_thread(claim.keep)
        if lost is not None:
            log.error("%s (it took the database while this one's lock was gone)", lost)
            on_lost()
            return
