"""``python -m gpupool.spawner.service``: the service as JupyterHub starts it, configured from the environment.

JupyterHub sets ``JUPYTERHUB_SERVICE_URL`` (where to listen), ``JUPYTERHUB_SERVICE_PREFIX``,
``JUPYTERHUB_SERVICE_NAME`` and ``JUPYTERHUB_API_URL`` for a managed service. gpupool's own settings:

- ``GPUPOOL_POOL``: a pool file (the simulated backend); unset, the host's GPUs through NVML, or the demo pool
  when there are none;
- ``GPUPOOL_PROFILES``: a profiles file; unset, the shipped example ``hub_config/profiles.yaml``;
- ``GPUPOOL_DB_URL``: an SQLAlchemy URL; unset, ``gpupool.sqlite`` in the working directory.

Everything is read and checked before the port opens, so bad configuration stops the service at start-up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI

from ..backends.discovery import discover_pool
from ..files.profiles_file import EXAMPLE_PROFILES, load_profiles
from .app import DEFAULT_PREFIX, create_app
from .auth import Authenticator
from .leases import LeaseManager
from .store import LeaseStore, sqlite_url

log = logging.getLogger("gpupool.service")


@dataclass(frozen=True)
class Listen:
    host: str
    port: int


def listen_address(env: Mapping[str, str]) -> Listen:
    """Host and port from ``JUPYTERHUB_SERVICE_URL`` (default ``http://127.0.0.1:10101``)."""
    url = urlsplit(env.get("JUPYTERHUB_SERVICE_URL") or "http://127.0.0.1:10101")
    if url.hostname is None:
        raise SystemExit(f"JUPYTERHUB_SERVICE_URL has no host: {url.geturl()!r}")
    return Listen(url.hostname, url.port or (443 if url.scheme == "https" else 80))


def build_app(env: Mapping[str, str]) -> FastAPI:
    """The app as the environment configures it: pool, profiles, store and the hub to ask about tokens."""
    pool = discover_pool(env.get("GPUPOOL_POOL") or None)
    if pool.note:
        log.warning("%s", pool.note)
    log.info("pool from %s (%s): %d nodes", pool.source, pool.backend, len(pool.nodes))
    profiles = load_profiles(env.get("GPUPOOL_PROFILES") or EXAMPLE_PROFILES)
    store = LeaseStore(env.get("GPUPOOL_DB_URL") or sqlite_url(str(Path.cwd() / "gpupool.sqlite")))
    manager = LeaseManager(pool.nodes, store)
    for lease in manager.released_at_start:
        log.warning("released at start-up: lease %s of %s (%s)", lease.id, lease.user, lease.release_reason)
    api_url = env.get("JUPYTERHUB_API_URL")
    if not api_url:
        raise SystemExit("JUPYTERHUB_API_URL is not set: run the service from JupyterHub, or set it")
    name = env.get("JUPYTERHUB_SERVICE_NAME") or "gpupool"
    return create_app(
        manager,
        profiles,
        backend=pool.backend,
        source=pool.source,
        auth=Authenticator(api_url, name),
        prefix=env.get("JUPYTERHUB_SERVICE_PREFIX") or DEFAULT_PREFIX,
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per token check is noise
    env = dict(os.environ)
    address = listen_address(env)
    app = build_app(env)
    uvicorn.run(app, host=address.host, port=address.port, log_level="info", access_log=False)


if __name__ == "__main__":
    main()
