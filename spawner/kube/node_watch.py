"""The cluster's nodes and pods, kept current by watches: the Kubernetes backend's inventory.

:meth:`KubeInventory.start` lists Nodes and Pods (all namespaces) once, then watches both from the lists'
``resourceVersion``. A watch that ends (its server-side timeout, an API server restart, a proxy dropping the
connection) resumes from the last version it saw, so nothing is read twice and nothing is missed; a version
the API server no longer keeps (410 Gone) makes that kind be listed afresh (each kind is a
:class:`.mirror.Mirror`). A watch of a server that hangs says nothing, so the server is also asked its version
every ``probe_s``; ``unreachable_since`` covers both. Every change is judged at once:
when a node's health (:func:`.labels.node_problem`) or the GPU usage of other workloads on a node
(:func:`.labels.external_usage`) changes, the callbacks hear of it, on the event loop.

The inventory holds the API's plain dicts (the watch's ``raw_object``), so :mod:`.labels` stays pure and
tests can hand it the same dicts. It decides nothing: the service applies what it reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from .api_errors import NO_ANSWER
from .labels import SHARED_RESOURCE, KubeNode, NodeLabelError, external_usage, node_problem, parse_node
from .mirror import Mirror, Obj

log = logging.getLogger(__name__)

HealthListener = Callable[[str, str | None], None]  # node, why it is out (None: healthy again)
UsageListener = Callable[[str, dict[str, int]], None]  # node, GPU resource -> units other workloads hold
PROBE_S = 10.0  # how often the API server is asked to answer at all
PROBE_TIMEOUT_S = 5.0  # and how long it has to
ReachListener = Callable[[float | None], None]  # since when the API server is silent (None: it answers)


async def connect(kubeconfig: str | None = None) -> client.ApiClient:
    """An API client: the pod's service account inside a cluster, else ``kubeconfig`` (else ``KUBECONFIG``,
    else ``~/.kube/config``)."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)


class KubeInventory:
    """The latest Nodes and Pods of one cluster, and who to tell when a node's health or outside usage
    changes. ``relists`` and ``resumes`` count how watches recovered (for logs and tests)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        shared_resource: str = SHARED_RESOURCE,
        watch_timeout_s: int = 300,
        retry_s: float = 1.0,
        probe_s: float = PROBE_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        core = client.CoreV1Api(api)
        self._version = client.VersionApi(api)
        self._probe_s, self._probe_timeout_s = probe_s, probe_timeout_s
        self._probe_task: asyncio.Task[None] | None = None
        self._silent_since: float | None = None  # since when the probe has had no answer
        self.shared_resource = shared_resource
        self.problems: dict[str, str | None] = {}
        self.usage: dict[str, dict[str, int]] = {}
        self._health_listeners: list[HealthListener] = []
        self._usage_listeners: list[UsageListener] = []
        self._reach_listeners: list[ReachListener] = []
        self._told_since: float | None = None
        self._nodes = Mirror(
            "nodes",
            core.list_node,
            on_change=self._nodes_changed,
            on_reach=self._reach_changed,
            watch_timeout_s=watch_timeout_s,
            retry_s=retry_s,
        )
        self._pods = Mirror(
            "pods",
            core.list_pod_for_all_namespaces,
            key=_pod_key,
            on_change=self._pods_changed,
            on_reach=self._reach_changed,
            watch_timeout_s=watch_timeout_s,
            retry_s=retry_s,
        )

    @property
    def nodes(self) -> dict[str, Obj]:
        return self._nodes.objects

    @property
    def pods(self) -> dict[str, Obj]:
        """``namespace/name`` -> pod."""
        return self._pods.objects

    @property
    def unreachable_since(self) -> float | None:
        """Since when the API server has not answered a watch or the probe (wall clock); None while it does."""
        times = (self._nodes.lost_since, self._pods.lost_since, self._silent_since)
        return min((t for t in times if t is not None), default=None)

    @property
    def relists(self) -> int:
        return self._nodes.relists + self._pods.relists

    @property
    def resumes(self) -> int:
        return self._nodes.resumes + self._pods.resumes

    # ---- listening ---------------------------------------------------------------------------------------

    def on_health(self, listener: HealthListener) -> None:
        """Call ``listener(node, problem)`` when a node's problem changes (None: it may take work again)."""
        self._health_listeners.append(listener)

    def on_usage(self, listener: UsageListener) -> None:
        """Call ``listener(node, usage)`` when what other workloads hold on a node changes."""
        self._usage_listeners.append(listener)

    def on_reach(self, listener: ReachListener) -> None:
        """Call ``listener(since)`` when the API server falls silent (``since``: when, wall clock) and with
        None once every watch has its answers again."""
        self._reach_listeners.append(listener)

    # ---- reading -----------------------------------------------------------------------------------------

    def kube_nodes(self) -> list[KubeNode]:
        """Every node gpupool can read, sorted by name; one whose GPU labels contradict themselves is left out
        and logged (its GPUs cannot be placed on safely)."""
        found = []
        for name in sorted(self.nodes):
            try:
                found.append(parse_node(self.nodes[name], shared_resource=self.shared_resource))
            except NodeLabelError as error:
                log.error("node %s left out of the pool: %s", name, error)
        return found

    # ---- running -----------------------------------------------------------------------------------------

    async def list_all(self) -> None:
        """List nodes and pods afresh; listeners hear what differs from what the inventory held."""
        await self._nodes.relist()
        await self._pods.relist()

    async def start(self) -> None:
        """List nodes and pods (so the inventory is complete when this returns), then watch in the background."""
        await self._nodes.start()
        await self._pods.start()
        self._probe_task = asyncio.create_task(self._probe(), name="gpupool-kube-probe")

    async def stop(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
        await self._nodes.stop()
        await self._pods.stop()

    async def _probe(self) -> None:
        """Ask the API server its version every ``probe_s``: a watch of a server that hangs (stopped, or its
        network dropping packets) waits without end, and only an answer that does not come says so."""
        while True:
            await asyncio.sleep(self._probe_s)
            try:
                await asyncio.wait_for(self._version.get_code(), self._probe_timeout_s)
            except ApiException:
                pass  # an answer, if not the one asked for
            except NO_ANSWER as error:
                if self._silent_since is None:
                    self._silent_since = time.time()
                    log.warning(
                        "the API server did not answer within %g s (%r)", self._probe_timeout_s, error
                    )
                    self._reach_changed()
                continue
            if self._silent_since is not None:
                log.warning("the API server answers again")
                self._silent_since = None
                self._reach_changed()

    def _nodes_changed(self, touched: list[Obj]) -> None:
        self._judge_nodes({_name(node) for node in touched})

    def _pods_changed(self, touched: list[Obj]) -> None:
        self._judge_usage({_node_of(pod) for pod in touched})

    def _reach_changed(self) -> None:
        since = self.unreachable_since
        if since == self._told_since:
            return
        self._told_since = since
        for listener in self._reach_listeners:
            try:
                listener(since)
            except Exception:  # one failing listener must not stop the watches
                log.exception("inventory listener %r failed for the API server's reach", listener)

    # ---- judging -----------------------------------------------------------------------------------------

    def _judge_nodes(self, names: set[str]) -> None:
        for name in sorted(names):
            obj = self.nodes.get(name)
            problem = node_problem(obj) if obj is not None else "it is no longer in the cluster"
            if name in self.problems and self.problems[name] == problem:
                continue
            known = name in self.problems
            self.problems[name] = problem
            if known or problem is not None:
                self._tell(self._health_listeners, name, problem)

    def _judge_usage(self, nodes: set[str]) -> None:
        nodes.discard("")
        if not nodes:
            return
        now = external_usage(
            (p for p in self.pods.values() if _node_of(p) in nodes), shared_resource=self.shared_resource
        )
        for name in sorted(nodes):
            usage = now.get(name, {})
            if self.usage.get(name, {}) == usage:
                continue
            if usage:
                self.usage[name] = usage
            else:
                self.usage.pop(name, None)
            self._tell(self._usage_listeners, name, usage)

    @staticmethod
    def _tell(listeners: list[Callable[[str, Any], None]], name: str, value: Any) -> None:
        for listener in listeners:
            try:
                listener(name, value)
            except Exception:  # one failing listener must not stop the watches
                log.exception("inventory listener %r failed for node %s", listener, name)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def _pod_key(pod: Mapping[str, Any]) -> str:
    return f"{(pod.get('metadata') or {}).get('namespace')}/{_name(pod)}"


def _node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")
