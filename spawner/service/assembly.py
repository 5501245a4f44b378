"""The composition root: the one place that builds the service from its settings, and the one lifespan that
starts and stops its background loops.

:func:`assemble` opens the pool, the profiles, the quotas and the store once, builds the lease and job managers,
health, telemetry and the parts the routes work on (:class:`.api.context.ServiceParts`), then the HTTP app,
and wires the Kubernetes backend in when the settings ask for it. :meth:`Service.lifespan` is the app's
lifespan and the only place a background loop starts: telemetry sampling, the folding of GPU activity, the
job manager's loop, reconciliation with the hub and the Kubernetes watches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from jupyterhub.services.auth import HubAuth, HubOAuth
from sqlalchemy import make_url

from ..backends.discovery import DiscoveredPool, discover_pool
from ..files.profiles_file import EXAMPLE_PROFILES, load_profiles
from ..files.quotas_file import EXAMPLE_QUOTAS, load_quotas
from ..limits import this_host
from ..pool.group_names import named_groups
from ..pool.policies import policy_by_name
from ..pool.profiles import Profile
from ..pool.quotas import QuotaPolicy, default_policy, describe_quota, group_limits_above_user
from ..system_groups import unknown_names
from ..telemetry.activity import ActivityTracker
from .api.app import create_app
from .api.auth import Authenticator
from .api.browser_login import BrowserLogin
from .api.context import ServiceParts
from .api.idle_routes import fold_activity_forever
from .jobs.job_manager import JobManager
from .jobs.preemption_loop import Preemptor
from .jobs.runner import LocalRunner
from .leasing.culls import Culls
from .leasing.group_names import warn_of_unknown_groups
from .leasing.health import HealthKeeper
from .leasing.lease_manager import LeaseManager
from .leasing.quota_reload import QuotaReload
from .leasing.reconcile import HubClient, reconcile_forever
from .retirement import NOT_IN_THE_HUB, retire
from .settings import ServiceSettings
from .store.cull_store import CullStore
from .store.health_store import HealthStore
from .store.job_store import JobStore
from .store.lease_store import LeaseStore
from .store.ownership import Claim, keep_claim
from .store.usage_store import UsageStore
from .telemetry.host_usage import HostUsage
from .telemetry.telemetry_loop import Telemetry, make_sampler

if TYPE_CHECKING:
    from .jobs.kube_runner import KubeJobRunner
    from .kube_pool import ClusterFollower, KubeBackend

log = logging.getLogger("gpupool.service")

AUTH_CACHE_SECONDS = 60  # how long the hub's answer for a token is reused: one hub call a minute per token


@dataclass
class Service:
    """The built service: its settings, app and the parts its routes and loops work on."""

    settings: ServiceSettings
    app: FastAPI
    parts: ServiceParts
    cluster: ClusterFollower | None = None  # the Kubernetes backend's watches
    claim: Claim | None = None  # this process's ownership of the store, kept while it serves
    _hub: HubClient | None = None  # the reconciler's client, once there is one
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _retiring: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # users reconciliation found gone

    @property
    def manager(self) -> LeaseManager:
        return self.parts.manager

    @property
    def jobs(self) -> JobManager:
        return self.parts.jobs

    @asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        """Start every loop, serve, then stop them all (newest first)."""
        async with AsyncExitStack() as stack:
            if self.cluster is not None:
                await stack.enter_async_context(self.cluster.watching())
            stack.push_async_callback(self._stop_tasks)
            if self.settings.sample_seconds > 0:
                self._start(self.parts.telemetry.run(), "gpupool-telemetry")
                self._start(
                    fold_activity_forever(self.parts.tracker, self.parts.telemetry), "gpupool-activity"
                )
            self._start(self.jobs.run_forever(), "gpupool-jobs")
            if self.claim is not None and self.claim.locks_in_server and self.settings.store_check_seconds:
                self._start(keep_claim(self.claim, self.settings.store_check_seconds), "gpupool-store-claim")
            if self.settings.quotas_file:
                self._start(
                    QuotaReload(
                        self.manager, self.settings.quotas_file, on_new=self._check_group_names
                    ).run_forever(),
                    "gpupool-quotas",
                )
            if self.settings.preempt_after_seconds > 0:
                preemptor = Preemptor(
                    self.jobs,
                    after=self.settings.preempt_after_seconds,
                    preemptible=self.settings.preemptible,
                )
                self._start(preemptor.run_forever(), "gpupool-preemption")
            hub = self._hub_client()
            if hub is not None:
                stack.push_async_callback(hub.aclose)
                self.parts.hub_has_user = hub.user_exists
                self._reconciler(hub)
            yield
            self.parts.hub_has_user = None

    def _hub_client(self) -> HubClient | None:
        """The hub's API as the service (its token): for reconciliation, the group names' check, and whether
        a user named in a question exists; None without a token."""
        if not self.settings.api_token:
            if self.settings.reconcile_seconds:
                log.warning(
                    "JUPYTERHUB_API_TOKEN is not set: leases are not reconciled with the hub's servers"
                )
            return None
        return HubClient(self.settings.hub_api_url, self.settings.api_token)

    def _reconciler(self, hub: HubClient) -> None:
        interval = self.settings.reconcile_seconds
        if interval == 0:
            return
        loop = reconcile_forever(
            self.manager,
            hub,
            interval=interval,
            stop_unleased=self.settings.stop_unleased,
            retire_missing=self._retire_missing,
        )
        self._start(loop, "gpupool-reconcile")
        self._hub = hub
        if not self.settings.system_groups:  # the host's groups are checked at start (unknown_names)
            named = named_groups(*self._admins_files())
            self._start(warn_of_unknown_groups(hub, named), "gpupool-group-names")

    async def _retire_missing(self, user: str, before: float) -> None:
        """Retire a user reconciliation found gone, in the background: waiting for their jobs to stop (the
        grace period) would hold up the pass; one retirement of a user at a time."""
        running = self._retiring.get(user)
        if running is None or running.done():
            self._retiring[user] = asyncio.create_task(
                self._retire(user, before), name=f"gpupool-retire-{user}"
            )

    async def _retire(self, user: str, before: float) -> None:
        try:
            await retire(self.parts, user, before=before, by=NOT_IN_THE_HUB)
        except Exception:  # the next pass that finds them gone tries again
            log.exception("retiring %s, whom the hub no longer has, failed", user)

    def _check_group_names(self, quotas: QuotaPolicy) -> None:
        """A quotas file read again may name a new group: a misspelt one is warned of as at start."""
        if Path(self.settings.quotas_file).resolve() == EXAMPLE_QUOTAS.resolve():
            return
        if self.settings.system_groups:
            for line in unknown_names((), quotas):
                log.warning("%s: a misspelling?", line)
        elif self._hub is not None:
            # the newest file's names only: an earlier edit's check still waiting for the hub is stale
            name = "gpupool-quota-group-names"
            for task in [t for t in self._tasks if t.get_name() == name]:
                task.cancel()
                self._tasks.remove(task)
            self._start(warn_of_unknown_groups(self._hub, named_groups((), quotas)), name)

    def _admins_files(self) -> tuple[Sequence[Profile], QuotaPolicy | None]:
        """The profiles and quotas the admin wrote: the shipped examples' groups are examples, not typos."""
        own_profiles = Path(self.settings.profiles_file).resolve() != EXAMPLE_PROFILES.resolve()
        quotas = self.settings.quotas_file
        own_quotas = bool(quotas) and Path(quotas).resolve() != EXAMPLE_QUOTAS.resolve()
        return (self.parts.profiles if own_profiles else ()), (self.manager.quotas if own_quotas else None)

    def _start(self, loop: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(loop, name=name))

    async def _stop_tasks(self) -> None:
        tasks = [*reversed(self._tasks), *self._retiring.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._retiring.clear()


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
        pool = discover_pool(settings.pool_file or None, simulated_fallback=settings.simulated_fallback)
    if pool.note:
        log.warning("%s", pool.note)
    log.info("%s", pool.summary)
    profiles = load_profiles(settings.profiles_file)
    manager = lease_manager(settings, pool, profiles)
    jobs = JobManager(
        manager,
        JobStore(manager.store.engine),
        profiles,
        grace=settings.job_grace_seconds,
        max_queued=settings.max_queued_jobs,
        job_runner=kube_job_runner(kube, settings) if kube is not None else local_job_runner(settings),
    )
    if kube is None:  # local jobs: say whether their CPU and memory limits hold here
        this_host().log(log)
    parts = service_parts(settings, pool, manager, jobs)
    for slug, why in parts.never_fits.items():  # the spawn form says so too, but only once someone opens it
        if why is not None:
            log.warning("profile %s can never start on this pool: %s", slug, why)
        closed = parts.environments_never_fit[slug]  # worked out here, not in the first GET profiles
        for environment, unrunnable in closed.items():  # the form shows it disabled, saying this
            log.info("profile %s's environment %s never runs on this pool: %s", slug, environment, unrunnable)
    cluster = kube.follow(manager, parts.health) if kube is not None else None
    if cluster is not None:
        from .kube_pool import KubeSampler

        # GET pool says when the cluster stopped answering
        parts.unreachable_since = cluster.unreachable_since
        # dcgm-exporter's readings reach the leases through their pods
        sampler = parts.telemetry.sampler
        assert isinstance(sampler, KubeSampler)
        sampler.connect(lambda: manager.all_leases(active_only=True), cluster.pods)
    service = Service(settings, create_app(parts), parts, cluster)
    service.app.router.lifespan_context = service.lifespan
    return service


def lease_manager(
    settings: ServiceSettings, pool: DiscoveredPool, profiles: Sequence[Profile]
) -> LeaseManager:
    """The lease manager over the pool and the store, with the placement policy and quotas of the settings
    (without a quotas file, the default: half the pool per user, see :func:`default_policy`)."""
    if settings.quotas_file:
        quotas, whose = load_quotas(settings.quotas_file), f"quotas from {settings.quotas_file}"
    else:
        quotas = default_policy(pool.nodes, (p.request() for p in profiles))
        whose = f"no quotas file, so each user may hold at most {describe_quota(quotas.per_user)}"
    for line in group_limits_above_user(quotas):
        log.warning("%s", line)
    if settings.system_groups:  # the host's groups and accounts are the hub's: a name it lacks is a typo
        for line in unknown_names(profiles, quotas if settings.quotas_file else None):
            log.warning("%s: a misspelling?", line)
    policy = policy_by_name(settings.policy)
    store = LeaseStore(settings.store_url)
    manager = LeaseManager(pool.nodes, store, policy=policy, quotas=quotas)
    shown = shown_store(settings.store_url)
    held = manager.all_leases(active_only=True)
    log.info(
        "lease store %s: %d active leases", shown, len(held)
    )  # which one, after a change of GPUPOOL_DB_URL
    log.info("placement policy %s; %s", policy.name, whose)
    for lease in manager.released_at_start:
        log.warning("released at start-up: lease %s of %s (%s)", lease.id, lease.user, lease.release_reason)
    return manager


def service_parts(
    settings: ServiceSettings, pool: DiscoveredPool, manager: LeaseManager, jobs: JobManager
) -> ServiceParts:
    """Telemetry, usage, health and the hub's authentication around the managers: what the routes read."""
    usage = UsageStore(manager.store.engine)  # the minutes the telemetry closes, kept for long-term reports
    telemetry = Telemetry(
        manager,
        make_sampler(pool.backend, pool.nodes),
        interval=settings.sample_seconds,
        idle_threshold=settings.gpu_idle_threshold,
        on_minutes=usage.add,
    )
    health = HealthKeeper(jobs, HealthStore(manager.store.engine))
    health.restore()  # an admin's drains and faults survive restarts; the telemetry finds its faults again
    telemetry.add_observer(health.observe)
    login = browser_login(settings)  # the pages let a logged-in hub user in without a token
    # the pages' HubOAuth is a HubAuth too: one client and one cache for the tokens of pages and API
    if login is not None:
        hub_auth: HubAuth = login.hub_oauth
    else:
        hub_auth = HubAuth(api_url=settings.hub_api_url, cache_max_age=AUTH_CACHE_SECONDS)
    return ServiceParts(
        manager=manager,
        jobs=jobs,
        profiles=jobs.profiles,
        auth=Authenticator(hub_auth, settings.service_name, with_system_groups=settings.system_groups),
        telemetry=telemetry,
        usage=usage,
        culls=Culls(manager, CullStore(manager.store.engine)),  # the culler's warnings and culls, kept
        tracker=ActivityTracker(settings.gpu_idle_threshold),
        health=health,
        backend=pool.backend,
        simulated=pool.simulated,
        source=pool.source,
        prefix=settings.service_prefix,
        public_metrics=settings.metrics_public,
        login=login,
        host_usage=HostUsage(this_host()) if pool.backend != "kubernetes" else None,
    )


def local_job_runner(settings: ServiceSettings) -> LocalRunner:
    return LocalRunner(
        settings.job_home_root or None, settings.job_account or None, settings.job_account_per_user
    )


def kube_job_runner(kube: KubeBackend, settings: ServiceSettings) -> KubeJobRunner:
    return kube.job_runner(
        image=settings.kube_job_image,
        grace=settings.job_grace_seconds,
        queue=settings.kueue_queue,
        home_claim=settings.kube_home_claim,
        home_mount=settings.kube_home_mount,
        ttl_seconds=settings.kube_job_ttl_seconds,
        service_url=settings.service_url,
        refused_seconds=settings.kube_job_refused_seconds,
    )


def browser_login(settings: ServiceSettings) -> BrowserLogin | None:
    """The pages' OAuth login; None without an API token to trade codes with (then they take tokens only)."""
    if not settings.api_token:
        return None
    hub_oauth = HubOAuth(
        api_url=settings.hub_api_url,
        api_token=settings.api_token,
        oauth_client_id=settings.oauth_client_id or f"service-{settings.service_name}",
        hub_prefix=settings.base_url.rstrip("/") + "/hub/",
        base_url=settings.service_prefix,
        cache_max_age=AUTH_CACHE_SECONDS,
    )
    return BrowserLogin(hub_oauth, settings.service_prefix)


__all__ = ["Service", "assemble", "browser_login"]


def shown_store(url: str) -> str:
    """The lease store as the log names it: a file's path as it is; a server's URL without its password,
    whether in its user part or in its query (``?password=``, ``?sslpassword=``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.database or ":memory:"
    query = {key: value for key, value in parsed.query.items() if "password" not in key.lower()}
    return parsed.set(query=query).render_as_string(hide_password=True)
