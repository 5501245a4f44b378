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
every request (method, path, query) for tests that check how a client resumed. :func:`write_kubeconfig`
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
                deleted = self._delete(plural, namespace, name)
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
