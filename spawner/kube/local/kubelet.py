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
Volumes are not mounted: a ``workingDir`` that does not exist here becomes the pod's own folder, which is also
its ``HOME``. Every pod shares this machine's network, so each gets an address of its own on the loopback
network (127.1.x.y) and ``0.0.0.0`` in its environment or arguments means that address. Restart policies are
read as ``Never``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import signal
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .pki import KeyPair, client_tls

log = logging.getLogger(__name__)

Obj = dict[str, Any]
LEASE_RENEW_S = 2.0
STATUS_EVERY_S = 10.0
SIMULATED_IMAGE_ID = "gpupool-simulated://not-pulled"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class PodAddresses:
    """Hands out one loopback address per pod (127.1.0.1, 127.1.0.2, …)."""

    def __init__(self) -> None:
        self._next = 0

    def take(self) -> str:
        n, self._next = self._next, self._next + 1
        return f"127.1.{n // 250}.{n % 250 + 1}"


@dataclass
class Container:
    name: str
    log: Path
    process: asyncio.subprocess.Process | None = None
    started_at: str = ""
    exit_code: int | None = None
    finished_at: str = ""
    failure: str = ""  # why it could not start


@dataclass
class RunningPod:
    uid: str
    namespace: str
    name: str
    ip: str
    folder: Path
    containers: dict[str, Container] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    deleting: bool = False
    task: asyncio.Task[None] | None = None


class LogServer:
    """The kubelet's log endpoint for every node of this kubelet (one port; the path names the pod)."""

    def __init__(self, serving: KeyPair, ca: Path) -> None:
        self.port = 0
        self._serving, self._ca = serving, ca
        self.logs: dict[tuple[str, str, str], tuple[Path, asyncio.Event]] = {}
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, port: int) -> None:
        app = Starlette(routes=[Route("/containerLogs/{namespace}/{pod}/{container}", self._logs)])
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            ssl_certfile=str(self._serving.cert),
            ssl_keyfile=str(self._serving.key),
            ssl_ca_certs=str(self._ca),
            ssl_cert_reqs=ssl.CERT_REQUIRED,  # only the API server (a client certificate from our CA)
        )
        self.port = port
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task

    async def _logs(self, request: Request) -> Response:
        key = (request.path_params["namespace"], request.path_params["pod"], request.path_params["container"])
        if key not in self.logs:
            return PlainTextResponse(f"no container {key[2]} in pod {key[0]}/{key[1]} here", status_code=404)
        path, finished = self.logs[key]
        query = request.query_params
        text = path.read_bytes() if path.exists() else b""
        if "tailLines" in query:
            text = b"".join(text.splitlines(keepends=True)[-int(query["tailLines"]) :])
        limit = int(query["limitBytes"]) if "limitBytes" in query else None
        if query.get("follow") not in ("true", "1"):
            return Response(text[:limit] if limit else text, media_type="text/plain")

        async def follow() -> AsyncIterator[bytes]:
            sent = len(text)
            yield text
            offset = path.stat().st_size if path.exists() else 0
            while True:
                ended = finished.is_set()
                size = path.stat().st_size if path.exists() else 0
                if size > offset:
                    with path.open("rb") as handle:
                        handle.seek(offset)
                        chunk = handle.read(size - offset)
                    offset = size
                    sent += len(chunk)
                    yield chunk
                if ended or (limit and sent >= limit):
                    return
                await asyncio.sleep(0.1)

        return StreamingResponse(follow(), media_type="text/plain")


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
        self.free_devices = {resource: list(uuids) for resource, uuids in (devices or {}).items()}
        self.allocated: dict[str, list[tuple[str, str]]] = {}  # pod uid -> (resource, device) pairs
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
            await self._kill(pod, grace_s=0)
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
        stamp = now()

        def condition(kind: str, status: str, reason: str, message: str) -> Obj:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }

        status = {
            "capacity": self.resources,
            "allocatable": self.resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "simulated"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "simulated"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "simulated"),
                condition(
                    "Ready", "True", "KubeletReady", "gpupool's simulated kubelet is posting ready status"
                ),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.logs.port}},
            "nodeInfo": {
                "machineID": self.name,
                "systemUUID": self.name,
                "bootID": self.name,
                "kernelVersion": os.uname().release,
                "osImage": "gpupool simulated node (processes, no images)",
                "containerRuntimeVersion": "gpupool-processes://1",
                "kubeletVersion": "v0.0.0-gpupool-simulated",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
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
        spec = pod["spec"]
        for container in spec.get("initContainers", []):
            code = await self._start_and_wait(running, pod, container)
            if code != 0:
                await self._report(running, pod)
                running.done.set()
                self._release_devices(running.uid)
                return
        for container in spec["containers"]:
            await self._start(running, pod, container)
        await self._report(running, pod)
        waits = [c.process.wait() for c in running.containers.values() if c.process and c.exit_code is None]
        await asyncio.gather(*waits)
        for container in running.containers.values():
            if container.process is not None and container.exit_code is None:
                container.exit_code = _exit_code(container.process.returncode)
                container.finished_at = now()
        for key, (_, finished) in self.logs.logs.items():
            if key[:2] == (running.namespace, running.name):
                finished.set()
        running.done.set()
        self._release_devices(running.uid)
        if not running.deleting:
            await self._report(running, pod)

    async def _start_and_wait(self, running: RunningPod, pod: Obj, container: Obj) -> int:
        await self._start(running, pod, container)
        record = running.containers[container["name"]]
        if record.process is not None:
            record.exit_code = _exit_code(await record.process.wait())
            record.finished_at = now()
        return record.exit_code if record.exit_code is not None else 1

    async def _start(self, running: RunningPod, pod: Obj, container: Obj) -> None:
        name = container["name"]
        record = Container(name, running.folder / f"{name}.log")
        running.containers[name] = record
        self.logs.logs[(running.namespace, running.name, name)] = (record.log, asyncio.Event())
        try:
            env = await self._environment(pod, container, running)
            argv = [
                _expand(part, env) for part in [*container.get("command", []), *container.get("args", [])]
            ]
            if not argv:
                raise ValueError(
                    "gpupool's simulated kubelet pulls no image, so it cannot run the image's own command; "
                    "give the container a command or args"
                )
            argv = [part.replace("0.0.0.0", running.ip) for part in argv]
            folder = Path(container.get("workingDir") or running.folder)
            if not folder.is_dir():
                folder = running.folder
            with record.log.open("ab") as out:
                record.process = await asyncio.create_subprocess_exec(
                    *argv,
                    env=env,
                    cwd=folder,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
            record.started_at = now()
        except (OSError, ValueError, httpx.HTTPError) as error:
            record.failure = str(error)
            record.exit_code = 128
            record.finished_at = record.started_at = now()
            record.log.write_text(f"gpupool's simulated kubelet could not start {name}: {error}\n")

    async def _environment(self, pod: Obj, container: Obj, running: RunningPod) -> dict[str, str]:
        env = {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(running.folder),
            "HOSTNAME": running.name,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
        }
        namespace = running.namespace
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            for kind, ref in (
                ("configmaps", source.get("configMapRef")),
                ("secrets", source.get("secretRef")),
            ):
                if ref:
                    data = await self._read_data(kind, namespace, ref["name"], bool(ref.get("optional")))
                    env.update({prefix + k: v for k, v in data.items()})
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = _expand(item["value"], env)
            elif "valueFrom" in item:
                found = await self._value_from(item["valueFrom"], pod, running)
                if found is not None:
                    env[item["name"]] = found
        visible = self._allocate(running.uid, container)
        if visible:
            env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        return {k: v.replace("0.0.0.0", running.ip) for k, v in env.items()}

    def _allocate(self, uid: str, container: Obj) -> list[str]:
        """Devices for the container's ``nvidia.com/…`` limits, as the device plugin would pick them."""
        limits = container.get("resources", {}).get("limits", {})
        taken: list[str] = []
        for resource, count in limits.items():
            free = self.free_devices.get(resource)
            if free is None:
                continue
            wanted = int(count)
            if len(free) < wanted:
                raise ValueError(f"{resource}: {wanted} asked for, {len(free)} free on {self.name}")
            for _ in range(wanted):
                device = free.pop(0)
                self.allocated.setdefault(uid, []).append((resource, device))
                taken.append(device)
        return taken

    def _release_devices(self, uid: str) -> None:
        for resource, device in self.allocated.pop(uid, []):
            self.free_devices[resource].append(device)

    async def _value_from(self, source: Obj, pod: Obj, running: RunningPod) -> str | None:
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            fields: dict[str, str] = {
                "metadata.name": running.name,
                "metadata.namespace": running.namespace,
                "metadata.uid": running.uid,
                "spec.nodeName": self.name,
                "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
                "status.podIP": running.ip,
                "status.hostIP": "127.0.0.1",
            }
            match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if match:
                return str(pod["metadata"].get(match.group(1), {}).get(match.group(2), ""))
            return fields.get(path, "")
        for kind, key in (("configmaps", "configMapKeyRef"), ("secrets", "secretKeyRef")):
            if key in source:
                ref = source[key]
                data = await self._read_data(kind, running.namespace, ref["name"], bool(ref.get("optional")))
                if ref["key"] not in data and not ref.get("optional"):
                    raise ValueError(f"{kind[:-1]} {ref['name']} has no key {ref['key']}")
                return str(data[ref["key"]]) if ref["key"] in data else None
        return None

    async def _read_data(self, kind: str, namespace: str, name: str, optional: bool) -> dict[str, str]:
        answer = await self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if answer.status_code == 404 and optional:
            return {}
        answer.raise_for_status()
        body = answer.json()
        if kind == "secrets":
            return {k: base64.b64decode(v).decode() for k, v in body.get("data", {}).items()}
        return {str(k): str(v) for k, v in body.get("data", {}).items()}

    async def _report(self, running: RunningPod, pod: Obj) -> None:
        """Send the pod's status: phase, conditions, container states, addresses."""
        records = list(running.containers.values())
        main = [
            running.containers[c["name"]]
            for c in pod["spec"]["containers"]
            if c["name"] in running.containers
        ]
        finished = (bool(main) and all(c.exit_code is not None for c in main)) or any(
            c.exit_code not in (None, 0) for c in records if c not in main
        )
        if finished:
            phase = "Succeeded" if main and all(c.exit_code == 0 for c in main) else "Failed"
        else:
            phase = "Running" if main else "Pending"
        ready = "True" if phase == "Running" else "False"
        stamp = now()
        images = {
            c["name"]: c.get("image", "")
            for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
        }
        statuses = [_container_status(c, images.get(c.name, "")) for c in main]
        status = {
            "phase": phase,
            "podIP": running.ip,
            "podIPs": [{"ip": running.ip}],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": pod.get("status", {}).get("startTime") or stamp,
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": stamp},
                {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": stamp},
                {"type": "Ready", "status": ready, "lastTransitionTime": stamp},
            ],
            "containerStatuses": statuses,
        }
        inits = [c for c in records if c not in main]
        if inits:
            status["initContainerStatuses"] = [_container_status(c, images.get(c.name, "")) for c in inits]
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
        await self._kill(running, grace_s)
        pod = await self.api.get(f"/api/v1/namespaces/{running.namespace}/pods/{running.name}")
        if pod.status_code == 200:
            await self._report(running, pod.json())
        await self._remove(running.namespace, running.name, running.uid)
        self.pods.pop(running.uid, None)

    async def _kill(self, running: RunningPod, grace_s: int) -> None:
        processes = [
            c.process for c in running.containers.values() if c.process and c.process.returncode is None
        ]
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(running.done.wait(), timeout=max(grace_s, 0.5))
        except TimeoutError:
            for process in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(running.done.wait(), timeout=10)

    async def _remove(self, namespace: str, name: str, uid: str) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        answer = await self.api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", json=body)
        if answer.status_code not in (200, 404, 409):
            log.warning("pod %s/%s: could not be removed: %s", namespace, name, answer.text)


def _container_status(record: Container, image: str) -> Obj:
    if record.exit_code is None:
        state: Obj = {"running": {"startedAt": record.started_at}}
    else:
        reason = "Completed" if record.exit_code == 0 else ("StartError" if record.failure else "Error")
        state = {
            "terminated": {
                "exitCode": record.exit_code,
                "reason": reason,
                "message": record.failure or None,
                "startedAt": record.started_at,
                "finishedAt": record.finished_at,
            }
        }
        state["terminated"] = {k: v for k, v in state["terminated"].items() if v is not None}
    pid = record.process.pid if record.process else 0
    return {
        "name": record.name,
        "image": image,
        "imageID": SIMULATED_IMAGE_ID,
        "containerID": f"gpupool-process://{pid}",
        "ready": record.exit_code is None,
        "started": record.exit_code is None,
        "restartCount": 0,
        "state": state,
    }


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return 0
    return 128 - returncode if returncode < 0 else returncode


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, ``$$`` is a literal ``$``, anything
    else stays as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR.sub(replace, text)


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
