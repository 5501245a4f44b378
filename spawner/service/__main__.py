"""``python -m gpupool.spawner.service``: the service as JupyterHub starts it, configured from the environment.

JupyterHub sets ``JUPYTERHUB_SERVICE_URL`` (where to listen), ``JUPYTERHUB_SERVICE_PREFIX``,
``JUPYTERHUB_SERVICE_NAME`` and ``JUPYTERHUB_API_URL`` for a managed service. gpupool's own settings:

- ``GPUPOOL_BACKEND``: ``local`` (default: the pool file, NVML or the demo pool, as below) or ``kubernetes``
  (the cluster's nodes and pods, with ``GPUPOOL_KUBE_NAMESPACE``, ``GPUPOOL_KUBE_SHARED_RESOURCE`` and
  ``KUBECONFIG``; see :mod:`.kube_pool`);
- ``GPUPOOL_POOL``: a pool file (the simulated backend); unset, the host's GPUs through NVML, or the demo pool
  when there are none;
- ``GPUPOOL_PROFILES``: a profiles file; unset, the shipped example ``hub_config/profiles.yaml``;
- ``GPUPOOL_DB_URL``: an SQLAlchemy URL; unset, ``gpupool.sqlite`` in the working directory;
- ``GPUPOOL_QUOTAS``: a quotas file (example: ``hub_config/quotas.yaml``); unset, nobody is limited;
- ``GPUPOOL_POLICY``: the placement policy by name (default ``gpupool``; see ``gpupool.spawner.pool.policies``);
- ``GPUPOOL_RECONCILE_SECONDS``: seconds between reconciliation passes (default 60; 0 turns it off), with the
  hub as ``JUPYTERHUB_API_TOKEN`` (scopes ``list:users`` and ``read:servers``), see :mod:`.reconcile`;
- ``GPUPOOL_SAMPLE_SECONDS``: seconds between telemetry samples (default 2; 0 turns sampling off);
- ``GPUPOOL_GPU_IDLE_THRESHOLD``: utilisation in % below which a held GPU counts as idle (default 10; see
  :mod:`.idle_api`, what the idle culler's hook asks);
- ``GPUPOOL_METRICS_PUBLIC``: ``1`` serves ``metrics`` without a token; unset, it needs an admin's token;
- ``GPUPOOL_STOP_UNLEASED``: ``1`` to stop a server that runs a gpupool profile without a lease (two passes
  in a row); it needs ``delete:servers`` too. Unset, such servers are only reported.
- jobs (see :mod:`.jobs`): ``GPUPOOL_JOB_GRACE_SECONDS`` between SIGTERM and SIGKILL when a job is stopped
  (default 30); ``GPUPOOL_MAX_QUEUED_JOBS`` a user may have waiting (default 100);
  ``GPUPOOL_JOB_HOME_ROOT``, when the service is not root, the folder of users' homes (``<root>/<user>``)
  jobs run in; unset, the users' system homes. As root, jobs run as their user's system account.
- jobs on Kubernetes (``GPUPOOL_BACKEND=kubernetes``: each attempt a ``batch/v1`` Job, see :mod:`.kube_runner`;
  no system accounts, the pod runs as uid 1000 with the user's home volume): ``GPUPOOL_KUBE_JOB_IMAGE``
  (required: the single-user image jobs run in); ``GPUPOOL_KUEUE_QUEUE`` (optional: a Kueue LocalQueue name;
  Jobs then carry ``kueue.x-k8s.io/queue-name`` and start suspended until Kueue admits them);
  ``GPUPOOL_KUBE_HOME_CLAIM`` (the user's home PVC, default ``claim-{username}`` as KubeSpawner names it);
  ``GPUPOOL_KUBE_HOME_MOUNT`` (where the image expects the home, default ``/home/jovyan``);
  ``GPUPOOL_KUBE_JOB_TTL_SECONDS`` (how long a finished Job, its pod and so its log stay; default 86400);
  ``GPUPOOL_SERVICE_URL`` (this service as job pods reach it, given to them for the notebook widgets). The
  grace period is ``GPUPOOL_JOB_GRACE_SECONDS``, as the pods' ``terminationGracePeriodSeconds``.

Everything is read and checked before the port opens, so bad configuration stops the service at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI

from ..backends.discovery import DiscoveredPool, discover_pool
from ..backends.simulated import PoolFileError
from ..files.profiles_file import EXAMPLE_PROFILES, load_profiles
from ..files.quotas_file import QuotaFileError, load_quotas
from ..pool.policies import PlacementPolicy, policy_by_name
from ..pool.profiles import ProfileError
from .app import DEFAULT_PREFIX, create_app
from .auth import Authenticator
from .browser_login import BrowserLogin
from .dashboard import dashboard_router
from .health_api import health_router
from .idle_api import Warnings, gpu_idle_threshold, idle_router
from .job_store import JobStore
from .jobs import JobManager
from .leases import LeaseManager
from .reconcile import HubClient, reconcile_forever
from .store import LeaseStore, sqlite_url
from .telemetry_api import metrics_public, telemetry_router
from .telemetry_loop import Telemetry, make_sampler, sample_seconds
from .usage_api import usage_router
from .usage_store import UsageStore

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
    return build(env)[0]


def build(env: Mapping[str, str]) -> tuple[FastAPI, LeaseManager]:
    """The app and the lease manager it serves."""
    backend = env.get("GPUPOOL_BACKEND") or "local"
    if backend not in ("local", "kubernetes"):
        raise SystemExit(f"GPUPOOL_BACKEND must be local or kubernetes, got {backend!r}")
    kube = None
    if backend == "kubernetes":
        from .kube_pool import load_kube_pool  # only a cluster needs kubernetes_asyncio

        kube = load_kube_pool(env)
        pool = DiscoveredPool(kube.nodes, "kubernetes", kube.source)
    else:
        pool = discover_pool(env.get("GPUPOOL_POOL") or None)
    if pool.note:
        log.warning("%s", pool.note)
    log.info("pool from %s (%s): %d nodes", pool.source, pool.backend, len(pool.nodes))
    profiles = load_profiles(env.get("GPUPOOL_PROFILES") or EXAMPLE_PROFILES)
    quotas = load_quotas(env["GPUPOOL_QUOTAS"]) if env.get("GPUPOOL_QUOTAS") else None
    policy = placement_policy(env)
    store = LeaseStore(env.get("GPUPOOL_DB_URL") or sqlite_url(str(Path.cwd() / "gpupool.sqlite")))
    manager = LeaseManager(pool.nodes, store, policy=policy, quotas=quotas)
    log.info(
        "placement policy %s; %s",
        policy.name,
        f"quotas from {env['GPUPOOL_QUOTAS']}" if quotas else "no quotas",
    )
    for lease in manager.released_at_start:
        log.warning("released at start-up: lease %s of %s (%s)", lease.id, lease.user, lease.release_reason)
    api_url = env.get("JUPYTERHUB_API_URL")
    if not api_url:
        raise SystemExit("JUPYTERHUB_API_URL is not set: run the service from JupyterHub, or set it")
    name = env.get("JUPYTERHUB_SERVICE_NAME") or "gpupool"
    grace = _number(env, "GPUPOOL_JOB_GRACE_SECONDS", 30.0)
    jobs = JobManager(
        manager,
        JobStore(store.engine),
        profiles,
        grace=grace,
        max_queued=int(_number(env, "GPUPOOL_MAX_QUEUED_JOBS", 100)),
        home_root=env.get("GPUPOOL_JOB_HOME_ROOT") or None,
        job_runner=kube.job_runner(env, grace=grace) if kube is not None else None,
    )
    auth = Authenticator(api_url, name)
    prefix = env.get("JUPYTERHUB_SERVICE_PREFIX") or DEFAULT_PREFIX
    app = create_app(
        manager, profiles, backend=pool.backend, source=pool.source, auth=auth, prefix=prefix, jobs=jobs
    )
    usage = UsageStore(store.engine)  # the minutes the telemetry closes, kept for long-term reports
    telemetry = Telemetry(
        manager, make_sampler(pool.backend, pool.nodes), interval=sample_seconds(env), on_minutes=usage.add
    )
    app.include_router(
        telemetry_router(manager, telemetry, auth, prefix=prefix, public_metrics=metrics_public(env))
    )
    app.include_router(usage_router(usage, auth, prefix=prefix))
    app.include_router(health_router(jobs, telemetry, auth, prefix=prefix))
    warnings = Warnings(manager)  # the culler records them through the API; the pages read them too
    app.include_router(
        idle_router(
            manager,
            telemetry,
            auth,
            profiles,
            prefix=prefix,
            threshold=gpu_idle_threshold(env),
            warnings=warnings,
        )
    )
    login = BrowserLogin.from_env(env, name, prefix)  # the pages let a logged-in hub user in without a token
    app.include_router(
        dashboard_router(
            manager,
            telemetry,
            auth,
            prefix=prefix,
            backend=pool.backend,
            source=pool.source,
            login=login,
            warnings=warnings,
        )
    )
    if kube is not None:
        kube.attach(app, manager, jobs)
    return app, manager


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    """A setting of 0 or more; a bad value stops the service, naming it."""
    raw = env.get(name) or str(default)
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {raw!r}") from None
    if not value >= 0:
        raise SystemExit(f"{name} must be 0 or more, got {raw!r}")
    return value


def placement_policy(env: Mapping[str, str]) -> PlacementPolicy:
    """``GPUPOOL_POLICY`` (default ``gpupool``); an unknown name stops the service, listing the known ones."""
    name = env.get("GPUPOOL_POLICY") or "gpupool"
    try:
        return policy_by_name(name)
    except ValueError as error:
        raise SystemExit(f"GPUPOOL_POLICY: {error}") from None


def reconcile_seconds(env: Mapping[str, str]) -> float:
    """``GPUPOOL_RECONCILE_SECONDS`` (default 60); 0 turns reconciliation off."""
    raw = env.get("GPUPOOL_RECONCILE_SECONDS") or "60"
    try:
        seconds = float(raw)
    except ValueError:
        raise SystemExit(f"GPUPOOL_RECONCILE_SECONDS must be a number of seconds, got {raw!r}") from None
    if seconds < 0 or seconds != seconds:
        raise SystemExit(f"GPUPOOL_RECONCILE_SECONDS must be 0 (off) or more, got {raw!r}")
    return seconds


async def serve(
    server: uvicorn.Server, env: Mapping[str, str], manager: LeaseManager, listener: socket.socket
) -> None:
    """Serve the API on ``listener``, reconciling leases with the hub's servers meanwhile (a pass now, then
    every interval)."""
    interval = reconcile_seconds(env)
    token = env.get("JUPYTERHUB_API_TOKEN")
    if interval == 0 or not token:
        if interval:
            log.warning("JUPYTERHUB_API_TOKEN is not set: leases are not reconciled with the hub's servers")
        await server.serve(sockets=[listener])
        return
    hub = HubClient(env.get("JUPYTERHUB_API_URL") or "", token)
    stop_unleased = (env.get("GPUPOOL_STOP_UNLEASED") or "").lower() in ("1", "true", "yes")
    task = asyncio.create_task(
        reconcile_forever(manager, hub, interval=interval, stop_unleased=stop_unleased)
    )
    try:
        await server.serve(sockets=[listener])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await hub.aclose()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per token check is noise
    env = dict(os.environ)
    address = listen_address(env)
    reconcile_seconds(env)  # a bad value stops the service before the port opens
    sample_seconds(env)
    # The port first: a second service (say, one a restarted hub starts while the old one still serves)
    # must stop here, before it opens the store and writes to it behind the running one's back.
    listener = bind(address)
    try:
        app, manager = build(env)
    except (PoolFileError, ProfileError, QuotaFileError) as error:  # one clear line, not a traceback
        raise SystemExit(f"gpupool service: {error}") from None
    config = uvicorn.Config(app, log_level="info", access_log=False)
    # uvicorn re-raises the SIGINT it caught once it has shut down; uvicorn.run swallows it too
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(uvicorn.Server(config), env, manager, listener))


def bind(address: Listen) -> socket.socket:
    """The listening socket, or exit saying the port is taken (most likely by a gpupool service already)."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this. Without it a reply written in two parts waits on the client's
    # delayed ACK: 40 ms a request (uvicorn sets it only on sockets it binds itself).
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        listener.bind((address.host, address.port))
    except OSError as error:
        listener.close()
        raise SystemExit(
            f"gpupool service: cannot listen on {address.host}:{address.port} ({error.strerror}); is another "
            "gpupool service running there? It owns the lease store, so this one stops without touching it"
        ) from None
    listener.listen(2048)
    listener.set_inheritable(True)
    return listener


if __name__ == "__main__":
    main()
