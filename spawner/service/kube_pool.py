"""The service on Kubernetes (``GPUPOOL_BACKEND=kubernetes``): the pool from the cluster's Nodes, kept in step
with it by the inventory's watches (:mod:`..kube.inventory`).

- **The pool** is read once at start-up (a list of Nodes and Pods before the lease manager exists, since the
  pool's nodes are fixed for the manager's life). A node that joins later, or whose MIG layout changes, is
  logged and pooled at the next restart.
- **Node health**: a node that is NotReady, cordoned, tainted (other than ``nvidia.com/gpu``) or reconfiguring
  MIG is marked unhealthy through :class:`.health.NodeConditions`, the job manager's fault path: nothing new is
  placed there and its jobs are requeued. Ready again, the mark is cleared and queued work admitted.
- **Other workloads**: what pods not labelled ``gpupool.io/lease`` hold on a node is held in the pool as
  *outside holdings* (:meth:`.leases.LeaseManager.set_outside_use`): allocations owned by
  ``outside:<node>:<n>``, never stored. The store stays the one record of gpupool's own leases; the outside
  holdings are the cluster's to say, and the inventory says them again after every restart or relist.
  So placement, availability, the queue and ``GET pool`` all see the same free capacity without a second
  bookkeeping path.

- **Jobs** run as ``batch/v1`` Jobs (:mod:`.kube_runner`): the job manager's runner is a
  :class:`.kube_runner.KubeJobRunner`, started on the app's event loop with the inventory, so its watches of
  gpupool's Jobs and pods are listed before the manager's first step judges a run.

Settings: ``GPUPOOL_KUBE_NAMESPACE`` (where gpupool's pods and Jobs go; default ``default``),
``GPUPOOL_KUBE_SHARED_RESOURCE`` (the time-sliced resource; default ``nvidia.com/gpu.shared``), and the
cluster: in a pod, its service account; else ``KUBECONFIG`` (else ``~/.kube/config``). For jobs (read by
:func:`job_runner_from_env`): ``GPUPOOL_KUBE_JOB_IMAGE`` (required: the single-user image jobs run in),
``GPUPOOL_KUEUE_QUEUE`` (optional: a Kueue LocalQueue; Jobs then carry ``kueue.x-k8s.io/queue-name`` and start
suspended), ``GPUPOOL_KUBE_HOME_CLAIM`` (the users' home PVC, default ``claim-{username}`` as KubeSpawner
names it), ``GPUPOOL_KUBE_HOME_MOUNT`` (where the image expects the home, default ``/home/jovyan``) and
``GPUPOOL_KUBE_JOB_TTL_SECONDS`` (how long a finished Job and its pod, hence its log, stay; default a day).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from ..kube.inventory import KubeInventory, connect
from ..kube.jobs import JobSettings, home_claim_name
from ..kube.labels import SHARED_RESOURCE
from ..kube.manifests import ManifestError, require_dns_label
from ..kube.resources import outside_use
from ..pool.devices import Node
from ..telemetry.samples import Snapshot
from .health import NodeConditions
from .jobs import JobManager
from .kube_runner import KubeJobRunner
from .leases import LeaseManager

log = logging.getLogger(__name__)


@dataclass
class KubeBackend:
    """What the cluster said at start-up, and how to keep listening to it."""

    kubeconfig: str | None
    namespace: str
    shared_resource: str
    source: str
    nodes: tuple[Node, ...]
    problems: dict[str, str | None] = field(default_factory=dict)
    usage: dict[str, dict[str, int]] = field(default_factory=dict)

    def attach(self, app: FastAPI, manager: LeaseManager, jobs: JobManager) -> None:
        """Apply the start-up health and outside usage, and keep them current while ``app`` serves: its
        lifespan runs the inventory's watches (on the app's event loop) around the app's own lifespan."""
        conditions = NodeConditions(jobs)
        pooled = {node.name: node for node in self.nodes}

        def health(name: str, problem: str | None) -> None:
            if name not in pooled:
                log.warning(
                    "node %s is not in the pool (it joined after start-up): %s", name, problem or "ready"
                )
                return
            conditions.update(name, problem)

        def usage(name: str, held: dict[str, int]) -> None:
            if name not in pooled:
                return
            missing = manager.set_outside_use(
                name, outside_use(pooled[name], held, shared_resource=self.shared_resource)
            )
            log.info("other workloads hold %s on %s", held or "nothing", name)
            if missing:
                log.warning("node %s: other workloads hold more than is free: %s", name, missing)

        for name, problem in self.problems.items():
            if problem is not None:
                health(name, problem)
        for name, held in self.usage.items():
            usage(name, held)
        inner = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(served: FastAPI) -> AsyncIterator[Any]:
            api = await connect(self.kubeconfig)
            inventory = KubeInventory(api, shared_resource=self.shared_resource)
            inventory.problems = dict(self.problems)  # so the first list reports only what changed since
            inventory.usage = {name: dict(held) for name, held in self.usage.items()}
            inventory.on_health(health)
            inventory.on_usage(usage)
            runner = jobs.runner if isinstance(jobs.runner, KubeJobRunner) else None
            try:
                await inventory.start()
                if runner is not None:
                    await runner.start(api)
                async with inner(served) as state:
                    yield state
            finally:
                if runner is not None:
                    await runner.close()
                await inventory.stop()
                await api.close()

        app.router.lifespan_context = lifespan

    def job_runner(self, env: Mapping[str, str], *, grace: float = 30.0) -> KubeJobRunner:
        """The Kubernetes job runner on this cluster's pool, from the settings in the module docstring;
        SystemExit naming the setting that is wrong. ``grace`` is the job manager's stop grace period."""
        return job_runner_from_env(env, self.namespace, self.nodes, self.shared_resource, grace=grace)


class KubeSampler:
    """No device telemetry on Kubernetes yet (dcgm-exporter is the way; not built): empty snapshots, never
    simulated numbers passed off as the cluster's."""

    simulated = False
    backend = "kubernetes"

    def open(self) -> None:
        pass

    def sample(self, at: float) -> Snapshot:
        return Snapshot(at, (), False, "kubernetes")

    def close(self) -> None:
        pass


def load_kube_pool(env: Mapping[str, str]) -> KubeBackend:
    """Read the settings and the cluster's nodes and pods once; SystemExit naming what is wrong."""
    namespace = env.get("GPUPOOL_KUBE_NAMESPACE") or "default"
    try:
        require_dns_label(namespace, "GPUPOOL_KUBE_NAMESPACE")
    except ManifestError as error:
        raise SystemExit(f"gpupool service: {error}") from None
    shared = env.get("GPUPOOL_KUBE_SHARED_RESOURCE") or SHARED_RESOURCE
    if "/" not in shared:
        raise SystemExit(
            f"GPUPOOL_KUBE_SHARED_RESOURCE must be a resource name such as {SHARED_RESOURCE}, got {shared!r}"
        )
    kubeconfig = env.get("KUBECONFIG") or None

    async def snapshot() -> KubeBackend:
        api = await connect(kubeconfig)
        try:
            inventory = KubeInventory(api, shared_resource=shared)
            await inventory.list_all()
            kube_nodes = inventory.kube_nodes()
            host = api.configuration.host
        finally:
            await api.close()
        return KubeBackend(
            kubeconfig=kubeconfig,
            namespace=namespace,
            shared_resource=shared,
            source=f"Kubernetes API at {host}",
            nodes=tuple(k.node for k in kube_nodes),
            problems={k.node.name: k.problem for k in kube_nodes},
            usage={k.node.name: inventory.usage.get(k.node.name, {}) for k in kube_nodes},
        )

    try:
        return asyncio.run(snapshot())
    except Exception as error:  # any failure to reach or read the cluster stops the service, saying so
        raise SystemExit(
            f"gpupool service: cannot read the cluster's nodes ({type(error).__name__}: {error})"
        ) from None


def job_runner_from_env(
    env: Mapping[str, str],
    namespace: str,
    nodes: tuple[Node, ...],
    shared_resource: str = SHARED_RESOURCE,
    *,
    grace: float = 30.0,
) -> KubeJobRunner:
    """A :class:`.kube_runner.KubeJobRunner` from ``GPUPOOL_KUBE_JOB_IMAGE``, ``GPUPOOL_KUEUE_QUEUE``,
    ``GPUPOOL_KUBE_HOME_CLAIM``, ``GPUPOOL_KUBE_HOME_MOUNT`` and ``GPUPOOL_SERVICE_URL`` (what job pods get
    as theirs); SystemExit naming a missing or bad one."""
    image = (env.get("GPUPOOL_KUBE_JOB_IMAGE") or "").strip()
    if not image:
        raise SystemExit(
            "GPUPOOL_KUBE_JOB_IMAGE must name the image jobs run in (the single-user image, e.g. "
            "registry.example.org/gpupool-singleuser:1.0) when GPUPOOL_BACKEND=kubernetes"
        )
    ttl_raw = env.get("GPUPOOL_KUBE_JOB_TTL_SECONDS") or "86400"
    if not ttl_raw.isdigit():
        raise SystemExit(f"GPUPOOL_KUBE_JOB_TTL_SECONDS must be a whole number of seconds, got {ttl_raw!r}")
    try:
        settings = JobSettings(
            namespace=namespace,
            claim_template=env.get("GPUPOOL_KUBE_HOME_CLAIM") or "claim-{username}",
            home_mount=env.get("GPUPOOL_KUBE_HOME_MOUNT") or "/home/jovyan",
            queue_name=env.get("GPUPOOL_KUEUE_QUEUE") or None,
            grace_seconds=math.ceil(grace),
            ttl_seconds_after_finished=int(ttl_raw),
            service_url=(env.get("GPUPOOL_SERVICE_URL") or "").strip(),  # for the widgets inside a job
        )
        home_claim_name(settings, "gpupool-check")  # a bad template stops the service now, not at a job
    except ManifestError as error:
        text = str(error)
        for field, name in (
            ("settings.queue_name", "GPUPOOL_KUEUE_QUEUE"),
            ("settings.claim_template", "GPUPOOL_KUBE_HOME_CLAIM"),
            ("settings.home_mount", "GPUPOOL_KUBE_HOME_MOUNT"),
        ):
            text = text.replace(field, name)
        raise SystemExit(f"gpupool service: {text}") from None
    return KubeJobRunner(settings, image, nodes, shared_resource=shared_resource)
