"""A stateful stand-in for the Kubernetes API server, at the HTTP level, so the real ``kubernetes_asyncio`` client
(and KubeSpawner on top of it) runs unchanged against it.

It serves, on 127.0.0.1 and a random port, from a thread:

- ``/version``, ``/api``, ``/apis``, ``/api/v1``, ``/apis/batch/v1`` discovery;
- core v1 ``nodes`` (cluster-wide), and namespaced ``pods``, ``events``, ``services``, ``configmaps``,
  ``secrets``, ``persistentvolumeclaims`` (also listed across all namespaces), batch/v1 ``jobs``: create, get,
  list, watch, replace, patch (merge, strategic merge treated as merge, JSON patch), delete, and the
  ``status`` subresource;
- ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``) and ``fieldSelector``
  (``=``, ``==``, ``!=`` on any dotted field, such as ``spec.nodeName`` or ``involvedObject.name``);
- a ``resourceVersion`` on every object and list from one counter; ``?watch=1`` streams JSON lines
  (``ADDED``/``MODIFIED``/``DELETED``) from the given ``resourceVersion`` (none or ``0``: the current objects
  first, as ADDED), ends after ``timeoutSeconds``, and sends a 410 Gone ``ERROR`` event for a version older
  than the history kept.

Test hooks (thread-safe, called from the test's thread): :meth:`KubeApiServer.drop_watches` ends every open
watch, :meth:`compact` forgets the history (the next resume gets 410), :meth:`set_node_ready`,
:meth:`add_pod`, :meth:`put` and :meth:`remove` change objects as the cluster would, and ``requests`` records
every request (method, path, query) for tests that check how a client resumed.

It plays the kubelet and the Job controller for ``batch/v1`` Jobs when a test says so: :meth:`run_job` starts
a created Job's pod on the node its required node affinity names (Running), :meth:`finish_pod` ends a pod
with an exit code, :meth:`disrupt_pod` fails it with the ``DisruptionTarget`` condition (an eviction, a
drained or lost node), and each judges the Job by its ``podFailurePolicy`` and ``backoffLimit`` (conditions
``Complete`` or ``Failed`` with reason ``PodFailurePolicy`` or ``BackoffLimitExceeded``; a disruption the
policy ignores leaves the Job running); :meth:`expire_job` fails it with ``DeadlineExceeded``. Deleting a Job
deletes its pods (any ``propagationPolicy`` but ``Orphan``), as the garbage collector would. A pod's log
(``GET .../pods/<name>/log``, with ``limitBytes``) is the text :meth:`set_pod_log` put there. :func:`write_kubeconfig`
writes a kubeconfig for it (plain HTTP, a bearer token). Fixtures with real GPU Operator labels live in
``tests/fixtures/kube/``: an 8×H100 80GB node with MIG in the mixed strategy, a 4×A100 40GB node.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FIXTURES = Path(__file__).parent / "fixtures" / "kube"
TOKEN = "kube-test-token"
Obj = dict[str, Any]

# plural -> (group/version, kind, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "nodes": ("v1", "Node", False),
    "namespaces": ("v1", "Namespace", False),
    "pods": ("v1", "Pod", True),
    "events": ("v1", "Event", True),
    "services": ("v1", "Service", True),
    "configmaps": ("v1", "ConfigMap", True),
    "secrets": ("v1", "Secret", True),
    "persistentvolumeclaims": ("v1", "PersistentVolumeClaim", True),
    "jobs": ("batch/v1", "Job", True),
}
_WATCH_POLL_S = 0.02


def load_fixture(name: str) -> Obj:
    """A Node (or other object) from ``tests/fixtures/kube/<name>.yaml``."""
    data: Obj = yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())
    return data


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> JSONResponse:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason}
    return JSONResponse(body | {"code": code}, status_code=code)


class KubeApiServer:
    """The objects, their history and the HTTP app; :meth:`running` serves it from a thread."""

    def __init__(self, token: str = TOKEN, history: int = 10_000) -> None:
        self.token = token
        self.history_limit = history
        self._lock = threading.RLock()
        self._rv = 0
        self._objects: dict[tuple[str, str, str], Obj] = {}  # (plural, namespace, name) -> object
        self._history: list[tuple[int, str, str, Obj]] = []  # (rv, plural, event type, object)
        self._oldest = 1  # the oldest resourceVersion a watch may resume from (older: 410 Gone)
        self._generation = 0  # bumped by drop_watches: every open watch ends
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.pod_logs: dict[tuple[str, str], bytes] = {}  # (namespace, pod) -> its log
        self.url = ""
        self.app = Starlette(routes=self._routes())

    # ---- test hooks ------------------------------------------------------------------------------------------

    def put(self, plural: str, obj: Obj) -> Obj:
        """Create or replace an object as a controller would (no checks); the stored copy."""
        with self._lock:
            return self._store(plural, copy.deepcopy(obj))

    def get(self, plural: str, name: str, namespace: str = "") -> Obj | None:
        with self._lock:
            found = self._objects.get((plural, namespace, name))
            return copy.deepcopy(found) if found else None

    def objects(self, plural: str, namespace: str | None = None) -> list[Obj]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (p, ns, _), o in self._objects.items()
                if p == plural and namespace in (None, ns)
            ]

    def remove(self, plural: str, name: str, namespace: str = "") -> None:
        with self._lock:
            self._delete(plural, namespace, name)

    def add_node(self, fixture: str | Obj) -> Obj:
        return self.put("nodes", load_fixture(fixture) if isinstance(fixture, str) else fixture)

    def add_pod(
        self,
        name: str,
        node: str,
        limits: dict[str, int],
        *,
        namespace: str = "default",
        phase: str = "Running",
        labels: dict[str, str] | None = None,
    ) -> Obj:
        """A pod bound to ``node`` that holds ``limits`` (extended resources), as another workload's would."""
        resources = {
            "limits": {k: str(v) for k, v in limits.items()},
            "requests": {k: str(v) for k, v in limits.items()},
        }
        pod = {
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "busybox", "resources": resources}],
            },
            "status": {"phase": phase},
        }
        return self.put("pods", pod)

    def set_node_ready(self, name: str, ready: bool, reason: str = "KubeletNotReady") -> Obj:
        """Set the node's Ready condition (and the not-ready taint the node controller adds with it)."""
        with self._lock:
            node = copy.deepcopy(self._objects[("nodes", "", name)])
            conditions = [
                c for c in node.setdefault("status", {}).get("conditions", []) if c.get("type") != "Ready"
            ]
            conditions.append(
                {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady" if ready else reason,
                 "message": "kubelet is posting ready status" if ready else "container runtime is down",
                 "lastTransitionTime": _now()}
            )  # fmt: skip
            node["status"]["conditions"] = conditions
            taints = [
                t
                for t in node.setdefault("spec", {}).get("taints", [])
                if t.get("key") != "node.kubernetes.io/not-ready"
            ]
            if not ready:
                taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
            node["spec"]["taints"] = taints
            return self._store("nodes", node)

    def drop_watches(
        self, during: Callable[[KubeApiServer], object] | None = None, *, compact: bool = False
    ) -> None:
        """End every open watch (the connection closes cleanly), as an API server restart or a proxy would.
        ``during(self)`` changes objects while no watch can see them (they must come from the history on
        resume); with ``compact`` the history is then forgotten, so the resume gets 410 Gone and must relist."""
        with self._lock:
            self._generation += 1
            if during is not None:
                during(self)
            if compact:
                self.compact()

    def compact(self) -> None:
        """Forget all history: a watch resuming from any version seen so far gets 410 Gone."""
        with self._lock:
            self._history.clear()
            self._oldest = self._rv + 1

    def watches_from(self, plural_path: str) -> list[str]:
        """The ``resourceVersion`` of every watch request on ``plural_path`` (such as ``/api/v1/nodes``)."""
        return [
            q.get("resourceVersion", "") for m, p, q in self.requests if p == plural_path and _is_watch(q)
        ]

    def lists_of(self, plural_path: str) -> int:
        return sum(1 for m, p, q in self.requests if m == "GET" and p == plural_path and not _is_watch(q))

    # ---- playing kubelet and the Job controller ------------------------------------------------------------

    def run_job(self, name: str, namespace: str = "default") -> Obj:
        """Start the Job's next pod, Running on the node its required node affinity allows (its
        ``kubernetes.io/hostname`` or any other label terms), as the scheduler and kubelet would. A suspended
        Job (Kueue has not admitted it) or one with no such node raises ValueError: nothing would run."""
        with self._lock:
            job = self._objects.get(("jobs", namespace, name))
            if job is None:
                raise ValueError(f"no Job {namespace}/{name}")
            if job["spec"].get("suspend"):
                raise ValueError(f"Job {name} is suspended: no pod starts until it is admitted")
            template = copy.deepcopy(job["spec"]["template"])
            node = self._node_for(template["spec"])
            count = len(self._pods_of_job(job))
            labels = {
                **template.get("metadata", {}).get("labels", {}),
                "batch.kubernetes.io/job-name": name,
                "job-name": name,
                "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
            }
            owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"],
                     "controller": True, "blockOwnerDeletion": True}  # fmt: skip
            containers = [
                {"name": c["name"], "ready": True, "restartCount": 0, "image": c["image"],
                 "state": {"running": {"startedAt": _now()}}}
                for c in template["spec"]["containers"]
            ]  # fmt: skip
            pod = {
                "metadata": {
                    "name": f"{name}-{count}{uuid.uuid4().hex[:5]}",
                    "namespace": namespace,
                    "labels": labels,
                    "annotations": template.get("metadata", {}).get("annotations", {}),
                    "ownerReferences": [owner],
                },
                "spec": {**template["spec"], "nodeName": node},
                "status": {"phase": "Running", "startTime": _now(), "containerStatuses": containers,
                           "conditions": [{"type": "Ready", "status": "True"}]},
            }  # fmt: skip
            stored = self._store("pods", pod)
            job.setdefault("status", {}).update(active=1, startTime=job["status"].get("startTime", _now()))
            self._store("jobs", copy.deepcopy(job))
            return stored

    def finish_pod(self, name: str, exit_code: int, namespace: str = "default") -> Obj:
        """End the pod's containers with ``exit_code`` (Succeeded for 0, else Failed); its Job is judged."""
        with self._lock:
            pod = copy.deepcopy(self._objects[("pods", namespace, name)])
            self._terminate(pod, exit_code, "Completed" if exit_code == 0 else "Error")
            pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            stored = self._store("pods", pod)
            self._judge_job_of(stored)
            return stored

    def disrupt_pod(
        self,
        name: str,
        reason: str = "EvictionByEvictionAPI",
        message: str = "Eviction API: evicting",
        namespace: str = "default",
    ) -> Obj:
        """Fail the pod with the ``DisruptionTarget`` condition, as an eviction, preemption or a lost node
        does (its containers killed, exit 137); its Job is judged (a policy that ignores it leaves it running)."""
        with self._lock:
            pod = copy.deepcopy(self._objects[("pods", namespace, name)])
            self._terminate(pod, 137, "Error")
            pod["status"]["phase"] = "Failed"
            pod["status"].setdefault("conditions", []).append(
                {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
                 "lastTransitionTime": _now()}
            )  # fmt: skip
            stored = self._store("pods", pod)
            self._judge_job_of(stored)
            return stored

    def expire_job(self, name: str, namespace: str = "default") -> Obj:
        """The Job ran past ``activeDeadlineSeconds``: its running pods are deleted and it fails with
        ``DeadlineExceeded``, as the Job controller does."""
        with self._lock:
            job = copy.deepcopy(self._objects[("jobs", namespace, name)])
            for pod in self._pods_of_job(job):
                if pod["status"].get("phase") in ("Pending", "Running"):
                    self._delete("pods", namespace, pod["metadata"]["name"])
            return self._fail_job(job, "DeadlineExceeded", "Job was active longer than specified deadline")

    def set_pod_log(self, name: str, text: str, namespace: str = "default") -> None:
        """What ``GET .../pods/<name>/log`` answers from now on."""
        with self._lock:
            self.pod_logs[(namespace, name)] = text.encode()

    def _node_for(self, pod_spec: Obj) -> str:
        terms = (
            pod_spec.get("affinity", {})
            .get("nodeAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", {})
            .get("nodeSelectorTerms", [])
        )
        for (plural, _, name), node in sorted(self._objects.items()):
            if plural != "nodes":
                continue
            labels = node["metadata"].get("labels", {})
            if not terms or any(
                all(_expression(e, labels) for e in t.get("matchExpressions", [])) for t in terms
            ):
                return name
        raise ValueError(f"no node matches the pod's required node affinity {terms}")

    def _pods_of_job(self, job: Obj) -> list[Obj]:
        uid = job["metadata"]["uid"]
        return [
            o for (p, _, _), o in self._objects.items()
            if p == "pods" and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", []))
        ]  # fmt: skip

    @staticmethod
    def _terminate(pod: Obj, exit_code: int, reason: str) -> None:
        statuses = pod.setdefault("status", {}).get("containerStatuses") or [
            {"name": c["name"], "image": c.get("image", "")} for c in pod["spec"]["containers"]
        ]
        for status in statuses:
            status.update(ready=False, state={"terminated": {"exitCode": exit_code, "reason": reason,
                                                             "finishedAt": _now()}})  # fmt: skip
        pod["status"]["containerStatuses"] = statuses
        pod["status"]["conditions"] = [c for c in pod["status"].get("conditions", []) if c["type"] != "Ready"]

    def _judge_job_of(self, pod: Obj) -> None:
        """The Job controller's part once a pod ended: success completes the Job; a failure is matched
        against the pod failure policy's rules in order (FailJob, Ignore, Count), then ``backoffLimit``."""
        owner = next((r for r in pod["metadata"].get("ownerReferences", []) if r.get("kind") == "Job"), None)
        if owner is None:
            return
        job = self._objects.get(("jobs", pod["metadata"]["namespace"], owner["name"]))
        if job is None:
            return
        job = copy.deepcopy(job)
        status = job.setdefault("status", {})
        status["active"] = 0
        if pod["status"]["phase"] == "Succeeded":
            status["succeeded"] = status.get("succeeded", 0) + 1
            status["completionTime"] = _now()
            status["conditions"] = [{"type": "Complete", "status": "True", "lastTransitionTime": _now()}]
            self._store("jobs", job)
            return
        action, index = "Count", None
        for at, rule in enumerate(job["spec"].get("podFailurePolicy", {}).get("rules", [])):
            if _rule_matches(rule, pod):
                action, index = rule["action"], at
                break
        if action == "Ignore":
            self._store("jobs", job)
            return
        status["failed"] = status.get("failed", 0) + 1
        if action == "FailJob":
            container = next(
                (c for c in pod["status"]["containerStatuses"] if "terminated" in c.get("state", {})), {}
            )
            code = container.get("state", {}).get("terminated", {}).get("exitCode")
            message = (
                f"Container {container.get('name')} for pod {pod['metadata']['namespace']}/"
                f"{pod['metadata']['name']} failed with exit code {code} matching FailJob rule at index {index}"
            )
            self._fail_job(job, "PodFailurePolicy", message)
        elif status["failed"] > job["spec"].get("backoffLimit", 6):
            self._fail_job(job, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
        else:
            self._store("jobs", job)

    def _fail_job(self, job: Obj, reason: str, message: str) -> Obj:
        status = job.setdefault("status", {})
        status["active"] = 0
        status["conditions"] = [
            {"type": "Failed", "status": "True", "reason": reason, "message": message,
             "lastTransitionTime": _now()}
        ]  # fmt: skip
        return self._store("jobs", job)

    # ---- storage (under the lock) ----------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _store(self, plural: str, obj: Obj) -> Obj:
        group_version, kind, namespaced = RESOURCES[plural]
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "default") if namespaced else ""
        if namespaced:
            meta["namespace"] = namespace
        key = (plural, namespace, meta["name"])
        old = self._objects.get(key)
        meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"] if old else _now())
        meta["resourceVersion"] = self._next_rv()
        obj["apiVersion"], obj["kind"] = group_version, kind
        if plural == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        self._objects[key] = obj
        self._record(plural, "MODIFIED" if old else "ADDED", obj)
        return copy.deepcopy(obj)

    def _delete(self, plural: str, namespace: str, name: str) -> Obj | None:
        obj = self._objects.pop((plural, namespace, name), None)
        if obj is not None:
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._record(plural, "DELETED", obj)
        return obj

    def _record(self, plural: str, kind: str, obj: Obj) -> None:
        self._history.append((self._rv, plural, kind, copy.deepcopy(obj)))
        if len(self._history) > self.history_limit:
            dropped = self._history.pop(0)
            self._oldest = dropped[0] + 1

    # ---- HTTP ------------------------------------------------------------------------------------------------

    def _routes(self) -> list[Route]:
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        return [
            Route("/api/v1/namespaces/{ns}/pods/{name}/log", self._pod_log),
            Route("/version", self._version),
            Route("/api", self._api),
            Route("/apis", self._apis),
            Route("/api/v1", self._resource_list),
            Route("/apis/batch/v1", self._resource_list),
            # namespaced paths first: /api/v1/namespaces/jhub/pods is a list of pods, not a namespace's "pods"
            Route("/api/v1/namespaces/{ns}/{plural}", self._handle, methods=methods),
            Route("/api/v1/namespaces/{ns}/{plural}/{name}", self._handle, methods=methods),
            Route("/api/v1/namespaces/{ns}/{plural}/{name}/{sub}", self._handle, methods=methods),
            Route("/api/v1/{plural}", self._handle, methods=methods),
            Route("/api/v1/{plural}/{name}", self._handle, methods=methods),
            Route("/api/v1/{plural}/{name}/{sub}", self._handle, methods=methods),
            Route("/apis/batch/v1/{plural}", self._handle, methods=methods),
            Route("/apis/batch/v1/namespaces/{ns}/{plural}", self._handle, methods=methods),
            Route("/apis/batch/v1/namespaces/{ns}/{plural}/{name}", self._handle, methods=methods),
            Route("/apis/batch/v1/namespaces/{ns}/{plural}/{name}/{sub}", self._handle, methods=methods),
        ]

    async def _pod_log(self, request: Request) -> Response:
        query = dict(request.query_params)
        self.requests.append((request.method, request.url.path, query))
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "a bearer token is required")
        namespace, name = request.path_params["ns"], request.path_params["name"]
        with self._lock:
            if ("pods", namespace, name) not in self._objects:
                return _status(404, "NotFound", f'pods "{name}" not found')
            text = self.pod_logs.get((namespace, name), b"")
        if query.get("limitBytes"):
            text = text[: int(query["limitBytes"])]
        return Response(text, media_type="text/plain")

    async def _version(self, _request: Request) -> Response:
        return JSONResponse(
            {"major": "1", "minor": "30", "gitVersion": "v1.30.0-gpupool-standin", "platform": "linux/amd64"}
        )

    async def _api(self, _request: Request) -> Response:
        return JSONResponse({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})

    async def _apis(self, _request: Request) -> Response:
        batch = {"groupVersion": "batch/v1", "version": "v1"}
        group = {"name": "batch", "versions": [batch], "preferredVersion": batch}
        return JSONResponse({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]})

    async def _resource_list(self, request: Request) -> Response:
        group_version = "batch/v1" if request.url.path.startswith("/apis/batch") else "v1"
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        resources = [
            {
                "name": plural,
                "singularName": kind.lower(),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": verbs,
            }
            for plural, (gv, kind, namespaced) in RESOURCES.items()
            if gv == group_version
        ]
        return JSONResponse(
            {"kind": "APIResourceList", "groupVersion": group_version, "resources": resources}
        )

    async def _handle(self, request: Request) -> Response:
        query = dict(request.query_params)
        self.requests.append((request.method, request.url.path, query))
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "a bearer token is required")
        params = request.path_params
        plural, namespace, name, sub = (
            params["plural"],
            params.get("ns"),
            params.get("name"),
            params.get("sub"),
        )
        if plural not in RESOURCES or RESOURCES[plural][0] != (
            "batch/v1" if request.url.path.startswith("/apis/") else "v1"
        ):
            return _status(404, "NotFound", f"the server could not find the requested resource {plural}")
        if sub not in (None, "status"):
            return _status(404, "NotFound", f"subresource {sub} is not served by this stand-in")
        namespaced = RESOURCES[plural][2]
        namespace = namespace or ""
        if name is None:
            if request.method == "GET":
                selectors = _selectors(query)
                if _is_watch(query):
                    return self._watch(plural, namespace, selectors, query)
                return self._list(plural, namespace, selectors)
            if request.method == "POST":
                return self._create(plural, namespace, await request.json(), namespaced)
            return _status(405, "MethodNotAllowed", f"{request.method} on a collection is not served")
        key = (plural, namespace, name)
        body = await request.json() if request.method in ("PUT", "PATCH") else None
        with self._lock:
            current = copy.deepcopy(self._objects.get(key))
            if current is None:
                return _status(404, "NotFound", f'{plural} "{name}" not found')
            if request.method == "GET":
                return JSONResponse(current)
            if request.method == "DELETE":
                owned = self._pods_of_job(current) if plural == "jobs" else []
                deleted = self._delete(plural, namespace, name)
                if query.get("propagationPolicy") != "Orphan":  # the garbage collector's part
                    for pod in owned:
                        self._delete("pods", namespace, pod["metadata"]["name"])
                return JSONResponse(deleted)
            if request.method == "PUT":
                body.setdefault("metadata", {})["name"] = name
                changed = body
            else:
                changed = _patch(current, body, request.headers.get("content-type", ""))
            changed["metadata"].pop("resourceVersion", None)
            changed["metadata"]["uid"] = current["metadata"]["uid"]
            return JSONResponse(self._store(plural, changed))

    def _create(self, plural: str, namespace: str, body: Obj, namespaced: bool) -> Response:
        meta = body.setdefault("metadata", {})
        if namespaced:
            meta["namespace"] = namespace or meta.get("namespace", "default")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            return _status(422, "Invalid", "metadata.name: Required value")
        with self._lock:
            if (plural, meta.get("namespace", ""), meta["name"]) in self._objects:
                return _status(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
            for field in ("resourceVersion", "uid"):
                meta.pop(field, None)
            return JSONResponse(self._store(plural, body), status_code=201)

    def _list(self, plural: str, namespace: str, selectors: Callable[[Obj], bool]) -> Response:
        with self._lock:
            items = [
                copy.deepcopy(o)
                for (p, ns, _), o in self._objects.items()
                if p == plural and namespace in ("", ns) and selectors(o)
            ]
            rv = str(self._rv)
        group_version, kind, _ = RESOURCES[plural]
        return JSONResponse(
            {
                "kind": f"{kind}List",
                "apiVersion": group_version,
                "metadata": {"resourceVersion": rv},
                "items": items,
            }
        )

    def _watch(
        self, plural: str, namespace: str, selectors: Callable[[Obj], bool], query: dict[str, str]
    ) -> Response:
        since = query.get("resourceVersion") or "0"
        timeout = float(query.get("timeoutSeconds") or 1800)

        def matches(p: str, obj: Obj) -> bool:
            return p == plural and namespace in ("", obj["metadata"].get("namespace", "")) and selectors(obj)

        async def stream() -> AsyncIterator[bytes]:
            gone: Obj | None = None
            with self._lock:
                generation = self._generation
                last, initial = self._rv, []
                if since == "0":
                    initial = [copy.deepcopy(o) for (p, _, _), o in self._objects.items() if matches(p, o)]
                elif not since.isdigit() or int(since) + 1 < self._oldest:
                    gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
                            "message": f"too old resource version: {since} ({self._oldest - 1})"}  # fmt: skip
                else:
                    last = int(since)
            if gone is not None:
                yield _line({"type": "ERROR", "object": gone})
                return
            for obj in initial:
                yield _line({"type": "ADDED", "object": obj})
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                with self._lock:
                    if self._generation != generation:
                        return
                    events = [(rv, t, o) for rv, p, t, o in self._history if rv > last and matches(p, o)]
                    last = self._rv
                for _rv, kind, obj in events:
                    yield _line({"type": kind, "object": obj})
                await asyncio.sleep(_WATCH_POLL_S)

        return StreamingResponse(stream(), media_type="application/json")

    # ---- serving ---------------------------------------------------------------------------------------------

    @contextmanager
    def running(self) -> Iterator[KubeApiServer]:
        """Serve on 127.0.0.1 and a free port (``self.url``) from a thread until the block ends."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, timeout_graceful_shutdown=1)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[listener])), daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            yield self
        finally:
            self.drop_watches()
            server.should_exit = True
            thread.join(timeout=5)
            listener.close()


def _expression(expression: Obj, labels: dict[str, str]) -> bool:
    """One node selector requirement (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``) against node labels."""
    key, op, values = expression["key"], expression["operator"], expression.get("values", [])
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    return (key in labels) == (op == "Exists")


def _rule_matches(rule: Obj, pod: Obj) -> bool:
    """Whether a ``podFailurePolicy`` rule matches a failed pod (its conditions, or a container's exit code)."""
    for wanted in rule.get("onPodConditions", []):
        if any(
            c.get("type") == wanted["type"] and c.get("status") == wanted.get("status", "True")
            for c in pod["status"].get("conditions", [])
        ):
            return True
    codes = rule.get("onExitCodes")
    if not codes:
        return False
    for container in pod["status"].get("containerStatuses", []):
        if codes.get("containerName") not in (None, container["name"]):
            continue
        code = container.get("state", {}).get("terminated", {}).get("exitCode")
        if code is None or code == 0:
            continue
        if (code in codes["values"]) == (codes["operator"] == "In"):
            return True
    return False


def _is_watch(query: dict[str, str]) -> bool:
    return query.get("watch", "").lower() in ("1", "true")


def _line(event: Obj) -> bytes:
    return (json.dumps(event) + "\n").encode()


def _selectors(query: dict[str, str]) -> Callable[[Obj], bool]:
    """One predicate for ``labelSelector`` and ``fieldSelector``."""
    tests: list[Callable[[Obj], bool]] = []
    for term in _split(query.get("labelSelector", "")):
        tests.append(_label_test(term))
    for term in _split(query.get("fieldSelector", "")):
        op = "!=" if "!=" in term else "==" if "==" in term else "="
        path, value = (part.strip() for part in term.split(op, 1))
        negate = op == "!="
        tests.append(lambda o, path=path, value=value, negate=negate: (_field(o, path) == value) != negate)
    return lambda obj: all(test(obj) for test in tests)


def _split(selector: str) -> list[str]:
    """Terms at top-level commas (``in (a,b)`` keeps its commas)."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current.strip())
    return terms


def _label_test(term: str) -> Callable[[Obj], bool]:
    def labels(obj: Obj) -> dict[str, str]:
        found: dict[str, str] = obj.get("metadata", {}).get("labels") or {}
        return found

    words = term.split()
    if len(words) == 3 and words[1] in ("in", "notin"):
        key, op, rest = words[0], words[1], words[2]
        values = {v.strip() for v in rest.strip("()").split(",")}
        return lambda o: (labels(o).get(key) in values) == (op == "in")
    for op in ("!=", "==", "="):
        if op in term:
            key, value = (part.strip() for part in term.split(op, 1))
            return lambda o: (labels(o).get(key) == value) == (op != "!=")
    if term.startswith("!"):
        return lambda o: term[1:] not in labels(o)
    return lambda o: term in labels(o)


def _field(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _patch(current: Obj, body: Any, content_type: str) -> Obj:
    if "json-patch" in content_type:
        for op in body:
            parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
            parent: Any = current
            for part in parts[:-1]:
                parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
            last = parts[-1]
            if op["op"] == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"]) if op[
                    "op"
                ] == "add" else parent.__setitem__(int(last), op["value"])
            else:
                parent[last] = op["value"]
        return current
    return _merge(current, body)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch (strategic merge is treated the same: enough for labels, annotations, status)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def write_kubeconfig(path: Path, server: str, token: str = TOKEN, namespace: str = "default") -> Path:
    """A kubeconfig for ``server`` (plain HTTP, a bearer token) with one context, current."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "standin", "cluster": {"server": server}}],
        "users": [{"name": "gpupool", "user": {"token": token}}],
        "contexts": [
            {"name": "standin", "context": {"cluster": "standin", "user": "gpupool", "namespace": namespace}}
        ],
        "current-context": "standin",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextmanager
def kube_apiserver(*nodes: str | Obj) -> Iterator[KubeApiServer]:
    """A running stand-in with ``nodes`` (fixture names or Node objects) in it."""
    server = KubeApiServer()
    for node in nodes:
        server.add_node(node)
    with server.running():
        yield server
