"""The Kubernetes job runner: each attempt of a gpupool job is a ``batch/v1`` Job on its lease's node.

The Job comes from the pure builder (:func:`...kube.job_manifests.training_job`): the single-user image, the user's home
claim, the lease's node affinity and resource limits (:func:`...kube.resources.kube_grant`),
``GPUPOOL_CHECKPOINT_DIR`` on the home volume, ``activeDeadlineSeconds`` from the maximum runtime, and a pod
failure policy. Each attempt gets its own Job, ``gpupool-job-<id>-<attempt>``, so a requeued run never waits
for the last attempt's Job to be deleted. ``backoffLimit`` is 0: gpupool, not the Job controller, decides
about another attempt, because a new attempt needs a new lease (the old node may be gone).

**The cache.** The manager asks synchronously from its supervision step, so this runner never awaits there:
:class:`..kube.mirror.Mirror` watches of gpupool's training Jobs and their pods (by their labels) hold the
cluster's view, creates (tried again while the API server does not answer) and deletes run as tasks on the
event loop, and a create's answer goes into the cache at once. Until the first list has arrived, every run
counts as alive.

**How a run ended** is :func:`.kube_outcome.job_outcome`'s to say, from the Job and its pods. **Stopping**
(cancel, timeout, a fault or drain) deletes the Job with ``propagationPolicy: Foreground`` and the grace
period (the kubelet's SIGTERM, then ``terminationGracePeriodSeconds``); the forced stop deletes its pods with
a grace period of 0. The run counts as alive until the watch says the Job is gone.

**Logs** are :mod:`.kube_logs`' to read. **A pod the cluster refuses** (a ResourceQuota, a LimitRange, a
webhook) leaves the Job without one and the GPUs idle: the Job controller's ``FailedCreate`` events
(:mod:`...kube.create_refusals`) say why while the job waits, and after ``refused_patience_s`` the run fails.

**Identity.** No system account is needed: the pod runs as ``settings.uid`` (1000 by default) with the
user's home claim mounted at ``settings.home_mount``, and a job's paths are paths in that container.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ...kube.api_errors import NO_ANSWER, in_words
from ...kube.create_refusals import FAILED_CREATE_SELECTOR, CreateRefusals, Refusal
from ...kube.job_manifests import JOB_PREFIX, JobSettings, home_claim_name, job_name, training_job
from ...kube.job_status import disrupted_pod, finished_condition, holdup, owner_job
from ...kube.labels import SHARED_RESOURCE
from ...kube.manifests import COMPONENT_LABEL, MANAGED_BY, JsonDict, ManifestError
from ...kube.mirror import Mirror, Obj
from ...kube.resources import NotOnNode, kube_grant
from ...pool.devices import Node
from ...pool.job_states import Job
from ...pool.leases import Lease
from .kube_logs import JobLogs
from .kube_outcome import job_outcome
from .loop_tasks import LoopTasks
from .processes import Identity
from .runner import Launched, LaunchError, NoHome, Outcome

log = logging.getLogger(__name__)

SELECTOR = ",".join([*(f"{k}={v}" for k, v in MANAGED_BY.items()), f"{COMPONENT_LABEL}=training-job"])


class KubeJobRunner:
    """Runs each attempt as a ``batch/v1`` Job in ``settings.namespace`` with ``image``; ``nodes`` are the
    pool's nodes (their GPUs and MIG layout turn a lease's grants into resource limits). :meth:`start` with
    an API client on the service's event loop before the manager's loop runs; :meth:`close` at shutdown."""

    kind = "kubernetes"
    launched_as = "created as a Kubernetes Job for"
    enforces_deadline = True
    host_paths = False
    log_file = False  # the pod's log, kept by the service when it stops the run (the pod goes with the Job)
    log_lag_s = 3.0  # a read through the API server, started by the first read_log

    def __init__(
        self,
        settings: JobSettings,
        image: str,
        nodes: Iterable[Node],
        *,
        shared_resource: str = SHARED_RESOURCE,
        retry_s: float = 1.0,
        log_refresh_s: float = 0.5,
        log_limit: int = 8 << 20,
        refused_patience_s: float = 300.0,
    ) -> None:
        if not image or image != image.strip():
            raise ValueError(
                f"image: expected a container image such as quay.io/jupyter/base-notebook, got {image!r}"
            )
        self.settings = settings
        self.image = image
        self.shared_resource = shared_resource
        self.retry_s = retry_s
        self.log_refresh_s = log_refresh_s
        self.log_limit = log_limit
        self.refused_patience_s = refused_patience_s
        self._nodes = {node.name: node for node in nodes}
        self._writes = LoopTasks()  # creates, deletes and log reads, on the service's event loop
        self._batch: client.BatchV1Api | None = None
        self._core: client.CoreV1Api | None = None
        self.jobs: Mirror | None = None
        self.pods: Mirror | None = None
        self.claims: Mirror | None = None  # the namespace's volume claims: is a user's home there yet?
        self.events: Mirror | None = None  # the Job controller's FailedCreate events
        self.refusals = CreateRefusals()
        self.logs: JobLogs | None = None
        self._creating: set[str] = set()  # Jobs whose create is in flight
        self._stopping: set[str] = set()  # stopped while their create was in flight: delete once created
        self._create_failed: dict[str, str] = {}  # Job name -> why the API refused it
        self._unanswered: dict[str, str] = {}  # Job name -> why its create is being tried again
        # Job -> its pod the cluster took away, as last seen. The Job controller's finalizer and the kubelet
        # remove such a pod within moments and (its failure policy ignoring disruptions) start another, so a
        # judgement from the cache alone could miss the disruption; the watch's events never do.
        self._disrupted: dict[str, Obj] = {}

    # ---- lifecycle ---------------------------------------------------------------------------------------

    async def start(self, api: client.ApiClient) -> None:
        """List gpupool's Jobs and pods (so runs found after a restart are judged on a full view), then watch."""
        loop = asyncio.get_running_loop()
        self._writes.bind(loop)
        self._batch = client.BatchV1Api(api)
        self._core = client.CoreV1Api(api)
        namespace = self.settings.namespace
        self.jobs = Mirror(
            "jobs", self._batch.list_namespaced_job, namespace=namespace, label_selector=SELECTOR,
            retry_s=self.retry_s,
        )  # fmt: skip
        self.pods = Mirror(
            "pods", self._core.list_namespaced_pod, namespace=namespace, label_selector=SELECTOR,
            on_change=self._remember_disruptions, retry_s=self.retry_s,
        )  # fmt: skip
        self.claims = Mirror(
            "persistentvolumeclaims", self._core.list_namespaced_persistent_volume_claim, namespace=namespace,
            retry_s=self.retry_s,
        )  # fmt: skip
        self.events = Mirror(
            "events", self._core.list_namespaced_event, namespace=namespace, field_selector=FAILED_CREATE_SELECTOR,
            on_change=self._heard_events, retry_s=self.retry_s,
        )  # fmt: skip
        self.logs = JobLogs(
            self._core, namespace, spawn=self._writes.spawn, now=loop.time, refresh_s=self.log_refresh_s,
            limit=self.log_limit,
        )  # fmt: skip
        await asyncio.gather(self.jobs.start(), self.pods.start(), self.claims.start(), self.events.start())

    async def close(self) -> None:
        await self._writes.close()
        for mirror in (self.jobs, self.pods, self.claims, self.events):
            if mirror is not None:
                await mirror.stop()

    # ---- the runner interface ----------------------------------------------------------------------------

    def identity(self, user: str) -> Identity:
        """The pod's user in ``user``'s home claim; :class:`NoHome` while that claim does not exist (a Job
        mounting it would wait unscheduled until its deadline)."""
        claim = home_claim_name(self.settings, user)
        if self.claims is not None and self.claims.synced and claim not in self.claims.objects:
            raise NoHome(
                f"{user}'s jobs run in their home, the volume claim {claim} in namespace "
                f"{self.settings.namespace}, and there is none yet: KubeSpawner makes it at the user's first "
                "server when the hub keeps homes on volumes (Zero to JupyterHub's singleuser.storage). Start "
                "a server once, then submit again"
            )
        return Identity(user, self.settings.home_mount, self.settings.uid, self.settings.gid)

    def manifest(self, job: Job, lease: Lease) -> JsonDict:
        """The Job for the job's current attempt on ``lease``; ManifestError or NotOnNode when it cannot be."""
        if lease.node not in self._nodes:
            raise NotOnNode(f"lease {lease.id}: node {lease.node!r} is not in the pool")
        grant = kube_grant(self._nodes[lease.node], lease.devices, shared_resource=self.shared_resource)
        relative = posixpath.relpath(job.working_dir or self.settings.home_mount, self.settings.home_mount)
        manifest = training_job(
            self.settings,
            job_id=job.id,
            user=job.user,
            command=job.command,
            image=self.image,
            grant=grant,
            lease_id=lease.id,
            cpu_milli=lease.request.cpu_milli,
            memory_mib=lease.request.memory_mib,
            max_runtime=job.max_runtime,
            retries=0,
            env={**job.env, "GPUPOOL_JOB_ATTEMPT": str(job.attempts)},
            working_dir=None if relative == "." else relative,
            attempt=job.attempts,
        )
        return manifest

    def launch(self, job: Job, lease: Lease, identity: Identity) -> Launched:
        if self._writes.loop is None or self._batch is None:
            raise LaunchError("the Kubernetes job runner is not running (it starts with the service)")
        try:
            manifest = self.manifest(job, lease)
        except (ManifestError, NotOnNode) as error:
            raise LaunchError(f"its Kubernetes Job is invalid: {error}") from None
        name = manifest["metadata"]["name"]
        self._creating.add(name)
        self._writes.spawn(lambda: self._create(name, manifest))
        return Launched()

    def find(self, job: Job) -> Job | None:
        name = job_name(job.id, job.attempts)
        if name in self._creating or self.jobs is None or not self.jobs.synced:
            return job
        if name in self._create_failed:
            return None
        found = self.jobs.objects.get(name)
        if found is None or finished_condition(found) is not None or self._refusal(name, for_good=True):
            return None
        return None if disrupted_pod(self._pods_of(name)) is not None else job

    def stop_run(self, job: Job, *, force: bool) -> None:
        name = job_name(job.id, job.attempts)
        if name in self._creating:
            self._stopping.add(name)
            return
        self._writes.spawn(functools.partial(self._stop, job.id, name, force))

    async def _stop(self, job_id: str, name: str, force: bool) -> None:
        """Keep the log as it stands (a cancelled run's output went with its pod), then delete the Job, or
        with ``force`` its pods at once."""
        if self.logs is not None:
            await self.logs.keep(job_id, name, lambda: self._pods_of(name))
        for pod in self._pods_of(name) if force else ():
            await self._delete_pod(_name(pod))
        if not force:
            await self._delete_job(name)

    def outcome(self, job: Job) -> Outcome:
        name = job_name(job.id, job.attempts)
        if name in self._create_failed:
            return Outcome(
                None, reason=f"its Kubernetes Job could not be created: {self._create_failed[name]}"
            )
        found = self.jobs.objects.get(name) if self.jobs is not None else None
        if found is None:
            return Outcome(None, lost=f"its Kubernetes Job {name} disappeared without gpupool deleting it")
        refusal = self._refusal(name, for_good=True)
        if refusal is not None:
            return Outcome(None, reason=refusal.ended())
        return job_outcome(found, self._pods_of(name))

    def finish(self, job: Job) -> None:
        name = job_name(job.id, job.attempts)
        self._create_failed.pop(name, None)
        self._disrupted.pop(name, None)
        self.refusals.forget(name)
        found = self.jobs.objects.get(name) if self.jobs is not None else None
        if found is not None and finished_condition(found) is None:
            self._writes.spawn(lambda: self._delete_job(name))  # a lost run's Job would start another pod

    def read_log(self, job: Job, offset: int, limit: int) -> bytes:
        if self.logs is None:
            return b""
        name = job_name(job.id, job.attempts)
        return self.logs.read(job.id, name, lambda: self._pods_of(name), offset, limit)

    def holdup(self, job: Job) -> str | None:
        name = job_name(job.id, job.attempts)
        if name in self._unanswered:
            return f"its Job is not created yet: the API server does not answer ({self._unanswered[name]})"
        if name in self._creating:
            return "its Job is being created"
        found = self.jobs.objects.get(name) if self.jobs is not None else None
        if found is None:
            return None
        refusal = self._refusal(name)
        return refusal.waiting(self.refused_patience_s) if refusal else holdup(found, self._pods_of(name))

    def reap(self) -> None:
        pass  # the Job controller and the garbage collector clean up after pods

    # ---- reading the cache ---------------------------------------------------------------------------------

    def _pods_of(self, name: str) -> list[Obj]:
        """The Job's pods in the cache, and its disrupted pod even once it is gone."""
        if self.pods is None:
            return []
        pods = [pod for pod in self.pods.objects.values() if owner_job(pod) == name]
        gone = self._disrupted.get(name)
        if gone is not None and all(_name(pod) != _name(gone) for pod in pods):
            pods.append(gone)
        return pods

    def _refusal(self, name: str, *, for_good: bool = False) -> Refusal | None:
        """Why the cluster will not create the Job's pod while it has none; ``for_good``: past the patience."""
        refusal = self.refusals.of(name)
        if refusal is not None and self._pods_of(name):  # it has a pod now: a later refusal starts afresh
            self.refusals.forget(name)
            return None
        if refusal is None or not for_good:
            return refusal
        return refusal if 0 < self.refused_patience_s <= refusal.seconds else None

    def _heard_events(self, events: list[Obj]) -> None:
        """FailedCreate events of gpupool's Jobs, by name: the Jobs' list may come after the events' at start."""
        self.refusals.heard(
            e for e in events if str((e.get("involvedObject") or {}).get("name")).startswith(JOB_PREFIX)
        )

    def _remember_disruptions(self, touched: list[Obj]) -> None:
        for pod in touched:
            job = owner_job(pod)
            if job is not None and disrupted_pod([pod]) is not None:
                self._disrupted[job] = pod

    # ---- writes, on the event loop -----------------------------------------------------------------------------

    async def _create(self, name: str, manifest: JsonDict) -> None:
        """Create the Job. While the API server does not answer (a restart, an upgrade), try again ever less
        often, up to 15 s apart: the run then starts once it answers, where it used to fail for good."""
        assert self._batch is not None and self.jobs is not None
        tries, made = 0, False
        try:
            while not made and name not in self._stopping:
                try:
                    batch: Any = self._batch  # the client takes a plain dict as the body; its stubs disagree
                    response = await batch.create_namespaced_job(
                        self.settings.namespace, manifest, _preload_content=False
                    )
                    self.jobs.remember(json.loads(await response.read()))
                    made = True
                    log.info("created Job %s on %s", name, _node_of(manifest))
                except ApiException as error:
                    made = error.status == 409  # created before a restart; the watch has it
                    if not made:
                        self._create_failed[name] = in_words(error)
                        log.warning("Job %s was refused: %s", name, self._create_failed[name])
                        return
                except NO_ANSWER as error:
                    if name not in self._unanswered:
                        log.warning("Job %s: the API server does not answer (%s); trying again", name, error)
                    self._unanswered[name] = in_words(error)
                    tries += 1
                    await asyncio.sleep(min(0.5 * 2**tries, 15.0))
                except Exception as error:  # anything else: the run fails, saying why
                    self._create_failed[name] = in_words(error)
                    log.warning("Job %s could not be created: %s", name, self._create_failed[name])
                    return
        finally:
            self._creating.discard(name)
            self._unanswered.pop(name, None)
        if name in self._stopping:
            self._stopping.discard(name)
            if made:
                await self._delete_job(name)

    async def _delete_job(self, name: str) -> None:
        assert self._batch is not None
        try:
            await self._batch.delete_namespaced_job(
                name,
                self.settings.namespace,
                propagation_policy="Foreground",
                grace_period_seconds=self.settings.grace_seconds,
                _preload_content=False,
            )
            log.info("deleted Job %s (grace %d s)", name, self.settings.grace_seconds)
        except ApiException as error:
            if error.status != 404:
                log.warning("deleting Job %s failed: %s", name, in_words(error))

    async def _delete_pod(self, name: str) -> None:
        assert self._core is not None
        try:
            await self._core.delete_namespaced_pod(
                name, self.settings.namespace, grace_period_seconds=0, _preload_content=False
            )
        except ApiException as error:
            if error.status != 404:
                log.warning("deleting pod %s failed: %s", name, in_words(error))


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def _node_of(manifest: Mapping[str, Any]) -> str:
    terms = manifest["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    required = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return str(required[0]["matchExpressions"][0]["values"][0])
