"""A kubelet for simulated nodes: it registers each node as the node itself, keeps it Ready with leases and
status updates, and runs the pods the scheduler binds there as local processes.

What it does as a kubelet does:

- **Identity**: each node talks to the API server with its own client certificate (``system:node:<name>`` in
  ``system:nodes``), so the Node authorizer and NodeRestriction judge it as they judge a real kubelet.
- **Heartbeats**: the node's Lease in ``kube-node-lease`` is renewed every two seconds and its status every
  ten; :meth:`NodeAgent.go_silent` stops both, and the node-lifecycle controller marks the node NotReady.
- **Pods**: a bound pod's containers run as processes with the pod's environment (``value``, ``fieldRef``,
  ``configMapKeyRef``, ``secretKeyRef``, ``envFrom``; ``$(VAR)`` expanded in command and args). The status
  (phase, conditions, container states, exit codes, pod IP) goes back through the API. A deleted pod's
  processes get SIGTERM, then SIGKILL after its grace period, and the pod is then removed as a kubelet does.
- **Devices**, as the NVIDIA device plugin and container toolkit do: a container's ``nvidia.com/…`` limits
  are given free devices of the node's pool file (``GPU-…`` and ``MIG-…`` UUIDs), named in its
  ``NVIDIA_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES``, and taken back when the pod ends.
- **Logs**: served on HTTPS to the API server only (its client certificate), for ``kubectl logs`` and
  ``GET .../pods/<name>/log`` (``follow``, ``limitBytes``, ``tailLines``).

What it does not do, and says wherever it shows (the node label ``gpupool.io/simulated`` and the containers'
``imageID``): no image is pulled. A container runs its ``command`` and ``args`` on this machine, as the user
who started the kubelet, with this Python's ``bin`` first on ``PATH``. A container with ``args`` and no ``command``
runs its args, as an image whose entrypoint is an init such as ``tini`` (Jupyter's images) would; one with
neither fails.
Volumes are not mounted: each is a folder here, and paths under a mount point in a container's ``workingDir``,
arguments and environment are rewritten to it (:mod:`.mounts`); a ``workingDir`` that does not exist here
becomes the pod's own folder, which is otherwise its ``HOME``. Every pod shares this machine's network, so each
gets an address of its own on the loopback network (127.1.x.y) and ``0.0.0.0`` in its environment or arguments
means that address. Restart policies are read as ``Never``.

The parts: :mod:`.log_server` (logs), :mod:`.pod_processes` (containers as processes), :mod:`.container_env`
(their environment), :mod:`.device_plugin` (GPU devices) and :mod:`.statuses` (what the API is told).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from . import pod_processes
from .container_env import MissingReference, container_environment, expand
from .device_plugin import NodeDevices
from .log_server import LogServer
from .mounts import VolumeNotReady, mount_points, on_host, volume_folders
from .pki import KeyPair, client_tls
from .pod_processes import Container, RunningPod
from .statuses import node_status, pod_status

log = logging.getLogger(__name__)

Obj = dict[str, Any]
LEASE_RENEW_S = 2.0
STATUS_EVERY_S = 10.0
_STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
CONFIG_RETRY_S = 2.0  # how often a container waiting for a missing Secret or ConfigMap looks again


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class PodAddresses:
    """Hands out one loopback address per pod (127.1.0.1, 127.1.0.2, …)."""

    def __init__(self) -> None:
        self._next = 0

    def take(self) -> str:
        n, self._next = self._next, self._next + 1
        return f"127.1.{n // 250}.{n % 250 + 1}"


class NodeAgent:
    """The kubelet of one node."""

    def __init__(
        self,
        node: Obj,
        resources: dict[str, str],
        *,
        api_url: str,
        ca: Path,
        identity: KeyPair,
        logs: LogServer,
        folder: Path,
        addresses: PodAddresses,
        devices: dict[str, list[str]] | None = None,
    ) -> None:
        self.name = str(node["metadata"]["name"])
        self.devices = NodeDevices(self.name, devices)
        self.node = node
        self.resources = resources
        self.folder = folder
        self.logs = logs
        self.addresses = addresses
        self.api = httpx.AsyncClient(
            base_url=api_url,
            verify=client_tls(ca, identity),
            timeout=httpx.Timeout(30, read=None),
        )
        self.pods: dict[str, RunningPod] = {}
        self._deletions: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._silent = asyncio.Event()

    # ---- lifecycle ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        answer = await self.api.post("/api/v1/nodes", json=self.node)
        if answer.status_code not in (201, 409):
            raise RuntimeError(f"node {self.name} could not register: {answer.status_code} {answer.text}")
        await self._report_status()
        await self._renew_lease()
        self._tasks = [
            asyncio.create_task(self._heartbeats(), name=f"heartbeats {self.name}"),
            asyncio.create_task(self._watch_pods(), name=f"pods {self.name}"),
        ]

    def go_silent(self) -> None:
        """Stop renewing the lease and reporting status, as a kubelet that lost the network would."""
        self._silent.set()

    async def speak_again(self) -> None:
        """Report status and renew the lease again, as a kubelet back on the network would."""
        self._silent.clear()
        await self._report_status()
        await self._renew_lease()
        self._tasks.append(asyncio.create_task(self._heartbeats(), name=f"heartbeats {self.name}"))

    async def stop(self) -> None:
        """Stop watching and heartbeating, and kill this node's processes (the pods stay in the API)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for pod in list(self.pods.values()):
            await pod_processes.kill(pod, grace_s=0)
            if pod.task is not None:
                pod.task.cancel()
        await asyncio.gather(
            *(p.task for p in self.pods.values() if p.task), *self._deletions, return_exceptions=True
        )
        await self.api.aclose()

    # ---- the node ----------------------------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        last_status = asyncio.get_running_loop().time()
        while not self._silent.is_set():
            await asyncio.sleep(LEASE_RENEW_S)
            if self._silent.is_set():
                return
            try:
                await self._renew_lease()
                if asyncio.get_running_loop().time() - last_status >= STATUS_EVERY_S:
                    await self._report_status()
                    last_status = asyncio.get_running_loop().time()
            except httpx.HTTPError as error:
                log.warning("node %s: heartbeat failed: %s", self.name, error)

    async def _renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": micro_now()}
        answer = await self.api.patch(
            path, json={"spec": spec}, headers={"Content-Type": "application/merge-patch+json"}
        )
        if answer.status_code == 404:
            lease = {"metadata": {"name": self.name, "namespace": "kube-node-lease"}, "spec": spec}
            answer = await self.api.post(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", json=lease
            )
        answer.raise_for_status()

    async def _report_status(self) -> None:
        status = node_status(self.name, self.resources, self.logs.port)
        answer = await self.api.patch(
            f"/api/v1/nodes/{self.name}/status", json={"status": status}, headers=_STRATEGIC
        )
        answer.raise_for_status()

    # ---- pods --------------------------------------------------------------------------------------------

    async def _watch_pods(self) -> None:
        selector = {"fieldSelector": f"spec.nodeName={self.name}"}
        version = ""
        while True:
            try:
                if not version:
                    listed = await self.api.get("/api/v1/pods", params=selector)
                    listed.raise_for_status()
                    body = listed.json()
                    version = body["metadata"]["resourceVersion"]
                    for pod in body["items"]:
                        await self._pod_changed("ADDED", pod)
                params = selector | {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
                async with self.api.stream("GET", "/api/v1/pods", params=params) as stream:
                    async for line in stream.aiter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            version = ""  # 410 Gone: list again
                            break
                        version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            await self._pod_changed(event["type"], event["object"])
            except (httpx.HTTPError, json.JSONDecodeError, KeyError) as error:
                log.info("node %s: pod watch ended (%s); resuming", self.name, error)
                await asyncio.sleep(1)

    async def _pod_changed(self, kind: str, pod: Obj) -> None:
        meta, status = pod["metadata"], pod.get("status", {})
        running = self.pods.get(meta["uid"])
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            if running is not None and not running.deleting:
                running.deleting = True
                grace = int(meta.get("deletionGracePeriodSeconds") or 0)
                deletion = asyncio.create_task(self._delete(running, grace))
                self._deletions.add(deletion)
                deletion.add_done_callback(self._deletions.discard)
            elif running is None and kind != "DELETED":
                await self._remove(meta["namespace"], meta["name"], meta["uid"])
            return
        if running is None and status.get("phase") not in ("Succeeded", "Failed"):
            running = RunningPod(
                meta["uid"],
                meta["namespace"],
                meta["name"],
                self.addresses.take(),
                self.folder / "pods" / meta["uid"],
            )
            self.pods[running.uid] = running
            running.task = asyncio.create_task(self._run(running, pod))

    async def _run(self, running: RunningPod, pod: Obj) -> None:
        running.folder.mkdir(parents=True, exist_ok=True)
        try:
            running.volumes = await self._volumes(running, pod)
        except (OSError, ValueError, LookupError, httpx.HTTPError) as error:
            log.warning(
                "pod %s/%s: volumes not found (%r); paths stay as written",
                running.namespace,
                running.name,
                error,
            )
        spec = pod["spec"]
        for container in spec.get("initContainers", []):
            await self._start(running, pod, container)
            if await pod_processes.wait_for(running.containers[container["name"]]) != 0:
                await self._report(running, pod)
                running.done.set()
                self.devices.release(running.uid)
                return
        for container in spec["containers"]:
            await self._start(running, pod, container)
        await self._report(running, pod)
        await pod_processes.wait_for_all(running)
        self.logs.finish_pod(running.namespace, running.name)
        running.done.set()
        self.devices.release(running.uid)
        if not running.deleting:
            await self._report(running, pod)

    async def _volumes(self, running: RunningPod, pod: Obj) -> dict[str, Path]:
        """The pod's volume folders, waiting (up to a minute) while the Node authorizer has not linked the
        pod's claims to this node: under load a Job's pod asked too soon, ran without its home and failed."""
        for _ in range(int(60 / CONFIG_RETRY_S)):
            try:
                return await volume_folders(self.api, pod, running.folder)
            except VolumeNotReady:
                if running.deleting:
                    raise
                await asyncio.sleep(CONFIG_RETRY_S)
        return await volume_folders(self.api, pod, running.folder)

    async def _start(self, running: RunningPod, pod: Obj, container: Obj) -> None:
        name = container["name"]
        record = Container(name, running.folder / f"{name}.log")
        running.containers[name] = record
        self.logs.logs[(running.namespace, running.name, name)] = (record.log, asyncio.Event())
        try:
            while True:  # a missing Secret or ConfigMap: waiting, as a kubelet does, until it is there
                try:
                    env = await self._environment(pod, container, running)
                    break
                except MissingReference as missing:
                    if record.waiting != str(missing):  # the one missing now, not the first one
                        record.waiting = str(missing)
                        await self._report(running, pod)
                    if running.deleting:
                        raise
                    await asyncio.sleep(CONFIG_RETRY_S)
            record.waiting = ""
            points = mount_points(container, running.volumes)
            argv = [expand(part, env) for part in [*container.get("command", []), *container.get("args", [])]]
            working_dir = on_host(container.get("workingDir") or "", points)
            if working_dir != (container.get("workingDir") or "") and "HOME" not in _named(container):
                env["HOME"] = working_dir  # the image's home, which its working directory is
            env = {name: on_host(value, points) for name, value in env.items()}
            argv = [on_host(part, points) for part in argv]
            await pod_processes.spawn(record, argv, env, working_dir, running)
        except (OSError, ValueError, LookupError, httpx.HTTPError) as error:
            pod_processes.failed_to_start(record, error)

    async def _environment(self, pod: Obj, container: Obj, running: RunningPod) -> dict[str, str]:
        env = await container_environment(self.api, self.name, pod, container, running)
        visible = self.devices.allocate(running.uid, container)
        if visible:
            env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        return {k: v.replace("0.0.0.0", running.ip) for k, v in env.items()}

    async def _report(self, running: RunningPod, pod: Obj) -> None:
        """Send the pod's status: phase, conditions, container states, addresses."""
        status = pod_status(running, pod)
        path = f"/api/v1/namespaces/{running.namespace}/pods/{running.name}/status"
        try:
            answer = await self.api.patch(path, json={"status": status}, headers=_STRATEGIC)
        except (
            httpx.HTTPError
        ) as error:  # the API server is away (stopping, restarting): the next report says it
            log.warning("pod %s/%s: status not sent: %r", running.namespace, running.name, error)
            return
        if answer.status_code not in (200, 404):
            log.warning("pod %s/%s: status not accepted: %s", running.namespace, running.name, answer.text)

    async def _delete(self, running: RunningPod, grace_s: int) -> None:
        """Stop a deleted pod's processes within its grace period, report how they ended, and remove it."""
        await pod_processes.kill(running, grace_s)
        pod = await self.api.get(f"/api/v1/namespaces/{running.namespace}/pods/{running.name}")
        if pod.status_code == 200:
            await self._report(running, pod.json())
        await self._remove(running.namespace, running.name, running.uid)
        self.pods.pop(running.uid, None)

    async def _remove(self, namespace: str, name: str, uid: str) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        answer = await self.api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", json=body)
        if answer.status_code not in (200, 404, 409):
            log.warning("pod %s/%s: could not be removed: %s", namespace, name, answer.text)


async def run_forever(start: Callable[[], Awaitable[object]], stop: Callable[[], Awaitable[object]]) -> None:
    """Start, wait for SIGINT or SIGTERM, stop."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, done.set)
    await start()
    try:
        await done.wait()
    finally:
        await stop()


def _named(container: Obj) -> set[str]:
    """The variables the container's own ``env`` names."""
    return {item["name"] for item in container.get("env") or []}
