"""One service owns the pool: a second service pointed at the same database refuses to start.

Two services on one database would each grant from their own copy of the pool and hand the same GPU out
twice. The first service to start claims the database for as long as its process lives:

- **PostgreSQL**: a session advisory lock (``pg_try_advisory_lock``) on a connection kept open for the
  claim; the server drops it when that connection ends, a ``kill -9`` included.
- **SQLite**: an exclusive ``flock`` on ``<database>.owner`` beside the file, which the kernel drops when
  the process ends. An in-memory database belongs to its process anyway.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from sqlalchemy import Connection, create_engine, make_url, text

# The advisory lock's key: any fixed 64-bit number other applications on the database are unlikely to use.
ADVISORY_KEY = 0x67707570_6F6F6C  # "gpupool"


class StoreTaken(RuntimeError):
    """Another live service owns the database; the message says which database and what to do."""


class Claim:
    """The claim on one database, held until :meth:`release` or the end of the process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._connection: Connection | None = None
        self._lock_fd: int | None = None
        parsed = make_url(url)
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
                f"another gpupool service (pid {holder}) owns the lease database {path.removesuffix('.owner')}; "
                "two services on one database would hand the same GPU out twice, so this one stops"
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
                f"another gpupool service owns the lease database {where} (it holds advisory lock "
                f"{ADVISORY_KEY}); two services on one database would hand the same GPU out twice, so this "
                "one stops"
            )
        self._connection = connection

    def release(self) -> None:
        if self._connection is not None:
            engine = self._connection.engine
            self._connection.close()
            engine.dispose()
            self._connection = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
