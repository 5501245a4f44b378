"""The composition root: the one place that builds the service from its settings, and the one lifespan that
starts and stops its background loops.

:func:`assemble` opens the pool, the profiles, the quotas and the store once, builds the lease and job managers,
telemetry and the HTTP app with every router, and wires the Kubernetes backend in when the settings ask for
it. :meth:`Service.lifespan` is the app's lifespan: the job manager's loop, reconciliation with the hub, the
Kubernetes watches, and (through the routers' own lifespans, which FastAPI merged into the app's) telemetry
sampling and the folding of GPU activity.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from ..backends.discovery import DiscoveredPool, discover_pool
from ..files.profiles_file import load_profiles
from ..files.quotas_file import load_quotas
from ..pool.policies import policy_by_name
from .api.app import create_app
from .api.auth import Authenticator
from .api.browser_login import BrowserLogin
from .api.health_routes import health_router
from .api.idle_routes import Warnings, idle_router
from .api.pages import dashboard_router
from .api.telemetry_routes import telemetry_router
from .api.usage_routes import usage_router
from .jobs.job_manager import JobManager
from .leasing.lease_manager import LeaseManager
from .leasing.reconcile import HubClient, reconcile_forever
from .settings import ServiceSettings
from .store.job_store import JobStore
from .store.lease_store import LeaseStore, sqlite_url
from .store.usage_store import UsageStore
from .telemetry.telemetry_loop import Telemetry, make_sampler

if TYPE_CHECKING:
    from .jobs.kube_runner import KubeJobRunner
    from .kube_pool import ClusterFollower, KubeBackend

log = logging.getLogger("gpupool.service")


@dataclass
class Service:
    """The built service: its settings, app and managers, and what its lifespan runs."""

    settings: ServiceSettings
    app: FastAPI
    manager: LeaseManager
    jobs: JobManager
    auth: Authenticator
    cluster: ClusterFollower | None = None  # the Kubernetes backend's watches
    # the routers' own lifespans (telemetry sampling, activity folding), merged by FastAPI, run inside ours
    routers_lifespan: Callable[[FastAPI], AbstractAsyncContextManager[Any]] | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Start every loop, serve, then stop them all (newest first) and close the clients."""
        async with AsyncExitStack() as stack:
            if self.cluster is not None:
                await stack.enter_async_context(self.cluster.watching())
            self._start(self.jobs.run_forever(), "gpupool-jobs")
            hub = self._reconciler()
            if hub is not None:
                stack.push_async_callback(hub.aclose)
            stack.push_async_callback(self._stop_tasks)
            stack.push_async_callback(self.auth.aclose)
            if self.routers_lifespan is not None:
                await stack.enter_async_context(self.routers_lifespan(app))
            yield

    def _reconciler(self) -> HubClient | None:
        interval = self.settings.reconcile_seconds
        if interval == 0:
            return None
        if not self.settings.api_token:
            log.warning("JUPYTERHUB_API_TOKEN is not set: leases are not reconciled with the hub's servers")
            return None
        hub = HubClient(self.settings.hub_api_url, self.settings.api_token)
        loop = reconcile_forever(
            self.manager, hub, interval=interval, stop_unleased=self.settings.stop_unleased
        )
        self._start(loop, "gpupool-reconcile")
        return hub

    def _start(self, loop: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(loop, name=name))

    async def _stop_tasks(self) -> None:
        for task in reversed(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


def assemble(settings: ServiceSettings) -> Service:
    """Build the service; SystemExit or a typed file error when a setting or file is wrong."""
    kube = None
    if settings.backend == "kubernetes":
        from .kube_pool import load_kube_pool  # only a cluster needs kubernetes_asyncio

        kube = load_kube_pool(
            settings.kubeconfig or None, settings.kube_namespace, settings.kube_shared_resource
        )
        pool = DiscoveredPool(kube.nodes, "kubernetes", kube.source)
    else:
        pool = discover_pool(settings.pool_file or None)
    if pool.note:
        log.warning("%s", pool.note)
    log.info("pool from %s (%s): %d nodes", pool.source, pool.backend, len(pool.nodes))
    profiles = load_profiles(settings.profiles_file)
    quotas = load_quotas(settings.quotas_file) if settings.quotas_file else None
    policy = policy_by_name(settings.policy)
    store = LeaseStore(settings.db_url or sqlite_url(str(Path.cwd() / "gpupool.sqlite")))
    manager = LeaseManager(pool.nodes, store, policy=policy, quotas=quotas)
    log.info(
        "placement policy %s; %s",
        policy.name,
        f"quotas from {settings.quotas_file}" if quotas else "no quotas",
    )
    for lease in manager.released_at_start:
        log.warning("released at start-up: lease %s of %s (%s)", lease.id, lease.user, lease.release_reason)
    jobs = JobManager(
        manager,
        JobStore(store.engine),
        profiles,
        grace=settings.job_grace_seconds,
        max_queued=settings.max_queued_jobs,
        home_root=settings.job_home_root or None,
        job_runner=kube_job_runner(kube, settings) if kube is not None else None,
    )
    auth = Authenticator(settings.hub_api_url, settings.service_name)
    prefix = settings.service_prefix
    app = create_app(
        manager, profiles, backend=pool.backend, source=pool.source, auth=auth, prefix=prefix, jobs=jobs
    )
    usage = UsageStore(store.engine)  # the minutes the telemetry closes, kept for long-term reports
    telemetry = Telemetry(
        manager,
        make_sampler(pool.backend, pool.nodes),
        interval=settings.sample_seconds,
        on_minutes=usage.add,
    )
    app.include_router(
        telemetry_router(manager, telemetry, auth, prefix=prefix, public_metrics=settings.metrics_public)
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
            threshold=settings.gpu_idle_threshold,
            warnings=warnings,
        )
    )
    login = browser_login(settings)  # the pages let a logged-in hub user in without a token
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
            usage=usage,
        )
    )
    cluster = kube.follow(manager, jobs) if kube is not None else None
    service = Service(settings, app, manager, jobs, auth, cluster, app.router.lifespan_context)
    app.router.lifespan_context = service.lifespan
    return service


def kube_job_runner(kube: KubeBackend, settings: ServiceSettings) -> KubeJobRunner:
    return kube.job_runner(
        image=settings.kube_job_image,
        grace=settings.job_grace_seconds,
        queue=settings.kueue_queue,
        home_claim=settings.kube_home_claim,
        home_mount=settings.kube_home_mount,
        ttl_seconds=settings.kube_job_ttl_seconds,
        service_url=settings.service_url,
    )


def browser_login(settings: ServiceSettings) -> BrowserLogin | None:
    """The pages' OAuth login; None without an API token to trade codes with (then they take tokens only)."""
    if not settings.api_token:
        return None
    return BrowserLogin(
        client_id=settings.oauth_client_id or f"service-{settings.service_name}",
        client_secret=settings.api_token,
        hub_api_url=settings.hub_api_url,
        hub_prefix=settings.base_url.rstrip("/") + "/hub/",
        service_prefix=settings.service_prefix,
    )


__all__ = ["Service", "assemble", "browser_login"]
