"""``python -m gpupool.spawner.service``: the service as JupyterHub starts it.

Its settings (:mod:`.settings`) come from the environment JupyterHub gives a managed service
(``JUPYTERHUB_SERVICE_URL``, ``JUPYTERHUB_API_URL``, ``JUPYTERHUB_API_TOKEN``, …), gpupool's ``GPUPOOL_*``
variables, an optional config file and the command line; the README lists them all. Everything is read and
checked before the port opens, so bad configuration stops the service at start-up, naming the setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys

from ..orphans import end_with_parent
from .settings import ServiceSettings

log = logging.getLogger("gpupool.service")


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per token check is noise
    end_with_parent()  # a hub killed with -9 takes its service along, so its successor starts the only one
    settings = ServiceSettings.from_environment(os.environ, sys.argv[1:] if argv is None else argv)
    # The port first: a second service (say, one a restarted hub starts while the old one still serves)
    # must stop here, before it opens the store and writes to it behind the running one's back.
    listener = bind(*settings.listen)
    # Then the rest (FastAPI, SQLAlchemy, NumPy: most of a second): from here on, a request (the hub's check
    # that the service is up, a user's through the proxy) waits on the bound port instead of being refused.
    import uvicorn
    from sqlalchemy.exc import SQLAlchemyError

    from ..backends.discovery import NoRealGpus
    from ..backends.simulated import PoolFileError
    from ..files.quotas_file import QuotaFileError
    from ..pool.profiles import ProfileError
    from .assembly import assemble
    from .store.ownership import Claim, StoreTaken

    try:
        claim = Claim(settings.store_url)  # held while the process lives: the pool has one owner
    except StoreTaken as error:
        raise SystemExit(f"gpupool service: {error}") from None
    except SQLAlchemyError as error:
        raise SystemExit(
            f"gpupool service: cannot open the lease database (GPUPOOL_DB_URL): {error}"
        ) from None
    try:
        service = assemble(settings)
    except (PoolFileError, ProfileError, QuotaFileError, NoRealGpus) as error:  # one clear line, no traceback
        raise SystemExit(f"gpupool service: {error}") from None
    service.claim = claim
    config = uvicorn.Config(service.app, log_level="info", access_log=False)
    # uvicorn re-raises the SIGINT it caught once it has shut down; uvicorn.run swallows it too
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(uvicorn.Server(config).serve(sockets=[listener]))
    claim.release()


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or exit saying the port is taken (most likely by a gpupool service already)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this. Without it a reply written in two parts waits on the client's
    # delayed ACK: 40 ms a request (uvicorn sets it only on sockets it binds itself).
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise SystemExit(
            f"gpupool service: cannot listen on {host}:{port} ({error.strerror}); is another "
            "gpupool service running there? It owns the lease store, so this one stops without touching it"
        ) from None
    listener.listen(2048)
    listener.set_inheritable(True)
    return listener


if __name__ == "__main__":
    main()
