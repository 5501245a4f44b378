"""A real PostgreSQL server for the store tests: Debian's ``postgresql`` package (``make test`` installs it),
started once per test session in a scratch folder, listening on loopback; each test gets a database of its own.

PostgreSQL refuses to run as root, so under root the server runs as the package's ``postgres`` account.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from ports import free_port

USER = "gpupool"
# loopback only; durability is not what these tests are about, speed is
SETTINGS = ("-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off")


class PostgresMissing(RuntimeError):
    """Debian's PostgreSQL is not installed here."""


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        raise PostgresMissing(
            "PostgreSQL's server is not installed (no /usr/lib/postgresql/*/bin/postgres): `make test` "
            "installs Debian's postgresql package; or run: apt-get install postgresql"
        )
    return Path(found[-1]).parent


class PostgresServer:
    """One running server; :meth:`new_database` makes an empty database and returns its SQLAlchemy URL."""

    def __init__(self, port: int) -> None:
        self.port = port

    def _connect(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname=database, autocommit=True)

    def new_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with self._connect() as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{name}"


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a throwaway server (trust authentication on loopback, no fsync) and stop it afterwards."""
    bin_dir = _bin_dir()
    folder = Path(tempfile.mkdtemp(prefix="gpupool-postgres-"))
    account = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
    if account is not None:  # the server's own account must own its folder
        os.chown(folder, account.pw_uid, account.pw_gid)
    as_owner = {"user": account.pw_uid, "group": account.pw_gid} if account is not None else {}
    data, log = folder / "data", folder / "server.log"
    subprocess.run(
        [bin_dir / "initdb", "-D", data, "-U", USER, "-A", "trust", "-E", "UTF8", "--no-sync"],
        check=True,
        capture_output=True,
        **as_owner,  # type: ignore[arg-type]
    )
    port = free_port()
    with log.open("wb") as out:
        server = subprocess.Popen(
            [bin_dir / "postgres", "-D", data, "-p", str(port), "-k", folder, *SETTINGS],
            stdout=out,
            stderr=subprocess.STDOUT,
            **as_owner,  # type: ignore[arg-type]
        )
    running = PostgresServer(port)
    try:
        _wait_ready(running, server, log)
        yield running
    finally:
        server.send_signal(signal.SIGINT)  # "fast" shutdown: SIGTERM's "smart" one waits for every client
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _wait_ready(running: PostgresServer, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"PostgreSQL exited at start:\n{log.read_text(errors='replace')[-2000:]}")
        try:
            running._connect().close()
            return
        except psycopg.OperationalError:
            time.sleep(0.1)
    raise RuntimeError(
        f"PostgreSQL did not accept connections within 30 s:\n{log.read_text(errors='replace')}"
    )
