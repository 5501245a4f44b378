"""The cluster's nodes and pods, kept current by watches: the Kubernetes backend's inventory.

:meth:`KubeInventory.start` lists Nodes and Pods (all namespaces) once, then watches both from the lists'
``resourceVersion``. A watch that ends (its server-side timeout, an API server restart, a proxy dropping the
connection) resumes from the last version it saw, so nothing is read twice and nothing is missed; a version
the API server no longer keeps (410 Gone) makes that kind be listed afresh. Every change is judged at once:
when a node's health (:func:`.labels.node_problem`) or the GPU usage of other workloads on a node
(:func:`.labels.external_usage`) changes, the callbacks hear of it, on the event loop.

The inventory holds the API's plain dicts (the watch's ``raw_object``), so :mod:`.labels` stays pure and
tests can hand it the same dicts. It decides nothing: the service applies what it reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .labels import SHARED_RESOURCE, KubeNode, NodeLabelError, external_usage, node_problem, parse_node

log = logging.getLogger(__name__)

Obj = dict[str, Any]
HealthListener = Callable[[str, str | None], None]  # node, why it is out (None: healthy again)
UsageListener = Callable[[str, dict[str, int]], None]  # node, GPU resource -> units other workloads hold


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
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.shared_resource = shared_resource
        self.watch_timeout_s = watch_timeout_s
        self.retry_s = retry_s
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[str, Obj] = {}  # "namespace/name" -> pod
        self.problems: dict[str, str | None] = {}
        self.usage: dict[str, dict[str, int]] = {}
        self.relists = 0
        self.resumes = 0
        self._health_listeners: list[HealthListener] = []
        self._usage_listeners: list[UsageListener] = []
        self._versions: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None

    # ---- listening ---------------------------------------------------------------------------------------

    def on_health(self, listener: HealthListener) -> None:
        """Call ``listener(node, problem)`` when a node's problem changes (None: it may take work again)."""
        self._health_listeners.append(listener)

    def on_usage(self, listener: UsageListener) -> None:
        """Call ``listener(node, usage)`` when what other workloads hold on a node changes."""
        self._usage_listeners.append(listener)

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
        await self._relist("nodes")
        await self._relist("pods")

    async def start(self) -> None:
        """List nodes and pods (so the inventory is complete when this returns), then watch in the background."""
        await self.list_all()
        self._task = asyncio.create_task(self._watch_both(), name="gpupool-kube-inventory")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch_both(self) -> None:
        await asyncio.gather(self._watch("nodes"), self._watch("pods"))

    def _list_call(self, kind: str) -> Callable[..., Awaitable[Any]]:
        return self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces

    async def _relist(self, kind: str) -> None:
        """Replace everything known of ``kind`` with a fresh list; listeners hear what changed meanwhile."""
        response = await self._list_call(kind)(_preload_content=False)
        body = json.loads(await response.read())
        items = {_key(kind, item): item for item in body.get("items") or []}
        before = set(self.nodes if kind == "nodes" else self.pods)
        if kind == "nodes":
            self.nodes = items
            self._judge_nodes(before | set(items))
        else:
            touched = {_node_of(p) for p in self.pods.values()} | {_node_of(p) for p in items.values()}
            self.pods = items
            self._judge_usage(touched)
        self._versions[kind] = str(body["metadata"]["resourceVersion"])

    async def _watch(self, kind: str) -> None:
        """Watch ``kind`` forever: resume where a watch ended, relist on 410 Gone, wait a moment on errors."""
        while True:
            try:
                async with watch.Watch(return_type="object") as stream:
                    async for event in stream.stream(
                        self._list_call(kind),
                        resource_version=self._versions[kind],
                        timeout_seconds=self.watch_timeout_s,
                        allow_watch_bookmarks=True,
                    ):
                        self._apply(kind, event["type"], event["raw_object"])
                        if stream.resource_version:
                            self._versions[kind] = str(stream.resource_version)
                self.resumes += 1
                log.debug("watch of %s ended; resuming from %s", kind, self._versions[kind])
            except ApiException as error:
                if error.status == 410:
                    self.relists += 1
                    log.info("watch of %s: version %s is gone; listing afresh", kind, self._versions[kind])
                    await self._relisted(kind)
                else:
                    log.warning("watch of %s failed (%s %s); retrying", kind, error.status, error.reason)
                    await asyncio.sleep(self.retry_s)
            except (TimeoutError, aiohttp.ClientError, ConnectionError) as error:
                self.resumes += 1
                log.warning("watch of %s lost (%s); resuming from %s", kind, error, self._versions[kind])
                await asyncio.sleep(self.retry_s)

    async def _relisted(self, kind: str) -> None:
        while True:
            try:
                await self._relist(kind)
                return
            except (TimeoutError, ApiException, aiohttp.ClientError, ConnectionError) as error:
                log.warning("listing %s failed (%s); retrying", kind, error)
                await asyncio.sleep(self.retry_s)

    def _apply(self, kind: str, event: str, obj: Obj) -> None:
        if event not in ("ADDED", "MODIFIED", "DELETED"):
            return  # BOOKMARK: only its version matters, and the watch took it
        key = _key(kind, obj)
        if kind == "nodes":
            if event == "DELETED":
                self.nodes.pop(key, None)
            else:
                self.nodes[key] = obj
            self._judge_nodes({key})
            return
        old = self.pods.pop(key, None)
        if event != "DELETED":
            self.pods[key] = obj
        self._judge_usage({_node_of(obj)} | ({_node_of(old)} if old else set()))

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


def _key(kind: str, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name")) if kind == "nodes" else f"{meta.get('namespace')}/{meta.get('name')}"


def _node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")
