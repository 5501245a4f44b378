"""The service on Kubernetes (``GPUPOOL_BACKEND=kubernetes``): the pool from the cluster's Nodes, kept in step
with it by the inventory's watches (:mod:`..kube.node_watch`).

- **The pool** is read once at start-up (a list of Nodes and Pods before the lease manager exists, since the
  pool's nodes are fixed for the manager's life). A node that joins later, or whose MIG layout changes, is
  logged and pooled at the next restart.
- **Node health**: a node that is NotReady, cordoned, tainted (other than ``nvidia.com/gpu``) or reconfiguring
  MIG is marked unhealthy through :meth:`.leasing.health.HealthKeeper.node_condition`, the job manager's fault path: nothing new is
  placed there and its jobs are requeued. Ready again, the mark is cleared and queued work admitted.
- **A silent API server** (a watch of the inventory lost) holds placements (``LeaseManager.hold_placements``):
  new spawns and jobs queue, saying why, and start once the watches answer again.
- **Other workloads**: what pods not labelled ``gpupool.io/lease`` hold on a node is held in the pool as
  *outside holdings* (:meth:`.leases.LeaseManager.set_outside_use`): allocations owned by
  ``outside:<node>:<n>``, never stored. The store stays the one record of gpupool's own leases; the outside
  holdings are the cluster's to say, and the inventory says them again after every restart or relist.
  So placement, availability, the queue and ``GET pool`` all see the same free capacity without a second
  bookkeeping path.

- **Jobs** run as ``batch/v1`` Jobs (:mod:`.jobs.kube_runner`): the job manager's runner is a
  :class:`.kube_runner.KubeJobRunner`, started on the app's event loop with the inventory, so its watches of
  gpupool's Jobs and pods are listed before the manager's first step judges a run.

Settings (:mod:`.settings`): ``kube_namespace``, ``kube_shared_resource``, ``kubeconfig`` and, for jobs,
``kube_job_image``, ``kueue_queue``, ``kube_home_claim``, ``kube_home_mount`` and ``kube_job_ttl_seconds``;
:mod:`.assembly` passes them in.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ..kube import dcgm
from ..kube.api_errors import in_words
from ..kube.job_manifests import JobSettings, home_claim_name
from ..kube.labels import SHARED_RESOURCE
from ..kube.manifests import ManifestError
from ..kube.node_watch import KubeInventory, connect
from ..kube.resources import outside_use
from ..pool.devices import Node, pool_is_simulated
from ..pool.expected_start import time_of_day
from ..pool.leases import Lease, LeaseState
from ..telemetry.samples import Snapshot
from .jobs.kube_runner import KubeJobRunner
from .leasing.health import HealthKeeper
from .leasing.lease_manager import LeaseManager

log = logging.getLogger(__name__)
Obj = dict[str, Any]


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

    def follow(self, manager: LeaseManager, health: HealthKeeper) -> ClusterFollower:
        """Apply the health and outside usage the cluster showed at start-up to ``manager`` now; the
        follower's :meth:`ClusterFollower.watching` keeps them current."""
        return ClusterFollower(self, manager, health)

    def job_runner(
        self,
        *,
        image: str,
        grace: float = 30.0,
        queue: str = "",
        home_claim: str = "claim-{username}",
        home_mount: str = "/home/jovyan",
        ttl_seconds: int = 86400,
        service_url: str = "",
        refused_seconds: float = 300.0,
    ) -> KubeJobRunner:
        """The Kubernetes job runner on this cluster's pool; SystemExit naming the setting that is wrong.
        ``grace`` is the job manager's stop grace period; ``service_url`` is given to job pods; a run whose
        pod the cluster refuses to create fails after ``refused_seconds``."""
        if not image.strip():
            raise SystemExit(
                "GPUPOOL_KUBE_JOB_IMAGE must name the image jobs run in (the single-user image, e.g. "
                "registry.example.org/gpupool-singleuser:1.0) when GPUPOOL_BACKEND=kubernetes"
            )
        try:
            settings = JobSettings(
                namespace=self.namespace,
                claim_template=home_claim,
                home_mount=home_mount,
                queue_name=queue or None,
                grace_seconds=math.ceil(grace),
                ttl_seconds_after_finished=ttl_seconds,
                service_url=service_url.strip(),
            )
            home_claim_name(settings, "gpupool-check")  # a bad template stops the service now, not at a job
        except ManifestError as error:
            text = str(error)
            for field_name, variable in (
                ("settings.queue_name", "GPUPOOL_KUEUE_QUEUE"),
                ("settings.claim_template", "GPUPOOL_KUBE_HOME_CLAIM"),
                ("settings.home_mount", "GPUPOOL_KUBE_HOME_MOUNT"),
            ):
                text = text.replace(field_name, variable)
            raise SystemExit(f"gpupool service: {text}") from None
        return KubeJobRunner(
            settings,
            image.strip(),
            self.nodes,
            shared_resource=self.shared_resource,
            refused_patience_s=refused_seconds,
        )


class ClusterFollower:
    """Keeps the lease manager in step with the cluster: node conditions through the one health keeper
    (:meth:`.leasing.health.HealthKeeper.node_condition`), other workloads' use as outside holdings."""

    def __init__(self, backend: KubeBackend, manager: LeaseManager, health: HealthKeeper) -> None:
        self.backend = backend
        self.manager = manager
        self.health_keeper = health
        self._pooled = {node.name: node for node in backend.nodes}
        self.inventory: KubeInventory | None = None  # while watching()
        for name, problem in backend.problems.items():
            if problem is not None:
                self.health(name, problem)
        for name, held in backend.usage.items():
            self.usage(name, held)

    def pods(self) -> dict[str, Obj]:
        """The cluster's pods as the inventory last saw them (a copy, safe to read from another thread)."""
        inventory = self.inventory
        return dict(inventory.pods) if inventory is not None else {}  # one C-level copy under the GIL

    def unreachable_since(self) -> float | None:
        """Since when the cluster's API server has not answered (None while it does, or before watching)."""
        inventory = self.inventory
        return inventory.unreachable_since if inventory is not None else None

    def reach(self, silent_since: float | None) -> None:
        """Place nothing while the API server is silent: a server's pod or a job's Job placed then could not
        be made, and the pool could not be seen. Spawns and jobs wait in the queue, saying why."""
        because = None
        if silent_since is not None:
            since = time_of_day(silent_since)
            because = (
                f"gpupool has lost its watch of the cluster since {since} (its API server is down or failing): "
                "nothing starts until it is back"
            )
        self.manager.hold_placements(because)

    def health(self, name: str, problem: str | None) -> None:
        if name not in self._pooled:
            log.warning("node %s is not in the pool (it joined after start-up): %s", name, problem or "ready")
            return
        self.health_keeper.node_condition(name, problem)

    def usage(self, name: str, held: dict[str, int]) -> None:
        if name not in self._pooled:
            return
        shared = self.backend.shared_resource
        missing = self.manager.set_outside_use(
            name, outside_use(self._pooled[name], held, shared_resource=shared)
        )
        log.info("other workloads hold %s on %s", held or "nothing", name)
        if missing:
            log.warning("node %s: other workloads hold more than is free: %s", name, missing)

    @asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Watch the cluster (the inventory, and the Kubernetes job runner's Jobs and pods) until the block
        ends."""
        backend = self.backend
        api = await connect(backend.kubeconfig)
        inventory = KubeInventory(api, shared_resource=backend.shared_resource)
        self.inventory = inventory
        inventory.problems = dict(backend.problems)  # so the first list reports only what changed since
        inventory.usage = {name: dict(held) for name, held in backend.usage.items()}
        inventory.on_health(self.health)
        inventory.on_usage(self.usage)
        inventory.on_reach(self.reach)
        jobs = self.health_keeper.jobs
        runner = jobs.runner if isinstance(jobs.runner, KubeJobRunner) else None
        try:
            await inventory.start()
            if runner is not None:
                await runner.start(api)
            yield
        finally:
            if runner is not None:
                await runner.close()
            await inventory.stop()
            await api.close()


class KubeSampler:
    """Device telemetry from the cluster's dcgm-exporter pods (:mod:`gpupool.spawner.kube.dcgm`): each pass
    reads every exporter the inventory's pods show and gives each granted lease the readings of its pod's
    devices. Before :meth:`connect` (and where no exporter runs) snapshots are empty: devices read "N/A",
    never simulated numbers passed off as the cluster's. On simulated nodes (``gpupool kube up``'s) they say
    they are simulated, whatever an exporter there serves."""

    backend = "kubernetes"

    def __init__(self, nodes: Sequence[Node], timeout: float = 3.0) -> None:
        self.nodes = tuple(nodes)
        self.simulated = pool_is_simulated(self.nodes)
        self.timeout = timeout
        self._leases: Callable[[], list[Lease]] = list
        self._pods: Callable[[], dict[str, Obj]] = dict
        self._client: httpx.Client | None = None
        self._readers: ThreadPoolExecutor | None = None
        self._failing: set[str] = set()

    def connect(self, leases: Callable[[], list[Lease]], pods: Callable[[], dict[str, Obj]]) -> None:
        """Where the granted leases and the cluster's pods come from (the manager, the inventory)."""
        self._leases, self._pods = leases, pods

    def open(self) -> None:
        self._client = httpx.Client(timeout=self.timeout)
        self._readers = ThreadPoolExecutor(8, "dcgm")  # one slow exporter must not hold up the others

    def sample(self, at: float) -> Snapshot:
        pods = self._pods()
        exporters = dcgm.exporters(pods.values())
        assert self._readers is not None, "open() first"
        found = list(self._readers.map(self._read, [url for url, _ in exporters]))
        readings = [
            reading for (_, node), read in zip(exporters, found, strict=True) for reading in read
            if dcgm.on_node(reading, node, pods)  # an exporter speaks only for pods on its own node
        ]  # fmt: skip
        leases = [lease for lease in self._leases() if lease.state is LeaseState.GRANTED]
        samples = dcgm.lease_samples(readings, leases, pods, self.nodes, at)
        return Snapshot(at, tuple(samples), self.simulated, "kubernetes")

    def _read(self, url: str) -> list[dcgm.Reading]:
        assert self._client is not None, "open() first"
        try:
            answer = self._client.get(url)
            answer.raise_for_status()
            readings = dcgm.parse_readings(answer.text)
        except (httpx.HTTPError, ValueError) as error:
            if url not in self._failing:  # once per outage, not every pass
                log.warning("dcgm-exporter at %s could not be read: %s", url, error)
            self._failing.add(url)
            return []
        self._failing.discard(url)
        return readings

    def close(self) -> None:
        if self._readers is not None:
            self._readers.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()


def load_kube_pool(
    kubeconfig: str | None = None, namespace: str = "default", shared: str = SHARED_RESOURCE
) -> KubeBackend:
    """Read the cluster's nodes and pods once (through ``kubeconfig``, else the pod's service account or
    ``~/.kube/config``); SystemExit saying what is wrong."""

    async def snapshot() -> KubeBackend:
        api = await connect(kubeconfig)
        try:
            await _check_namespace(api, namespace)
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
        raise SystemExit(f"gpupool service: cannot read the cluster: {in_words(error)}") from None


async def _check_namespace(api: Any, namespace: str) -> None:
    """SystemExit when ``namespace`` does not exist: every server and Job there would fail with a 404 at its
    first start. An account that may not read namespaces (the manifests' ServiceAccount) skips the check."""
    try:
        await client.CoreV1Api(api).read_namespace(namespace)
    except ApiException as error:
        if error.status == 404:
            raise SystemExit(
                f"gpupool service: the cluster has no namespace {namespace} for servers and jobs: create it "
                f"(kubectl create namespace {namespace}) or name another (the kubeconfig context's namespace, "
                "or c.KubeGPUSpawner.namespace)"
            ) from None
        if error.status != 403:
            raise
