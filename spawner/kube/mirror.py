"""One kind of object, kept current by a watch: what the job runner and the inventory read.

:meth:`Mirror.start` lists the objects (of one namespace or all, by label or field selectors or not), then
watches them from the list's ``resourceVersion`` in the background: a watch that ends resumes from the last
version seen, a version the API server no longer keeps (410 Gone) makes it list afresh, and other errors are
retried after ``retry_s``. It is the job runner's cache (:mod:`...service.kube_runner`) and the inventory's
nodes and pods (:mod:`.node_watch`). Readers on the event loop read :attr:`Mirror.objects` (key -> the API's
plain dict) without awaiting anything; :meth:`Mirror.remember` puts in an object this process just wrote, so a
reader sees its own create before the watch reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

from .api_errors import NO_ANSWER

log = logging.getLogger(__name__)

Obj = dict[str, Any]
MAX_RETRY_S = 15.0  # the longest wait between tries at a watch the API server does not answer


class Mirror:
    """The objects ``list_call`` lists (with ``namespace`` and the selectors when given), by ``key``
    (default: the name); ``synced`` once listed. ``on_change`` hears the objects a watch event or a relist
    touched, old and new versions both, so a listener can work out what it has to judge again;
    ``on_reach`` hears that :attr:`lost_since` changed (the API server fell silent, or answered again).
    ``relists`` and ``resumes`` count how the watch recovered (for logs and tests)."""

    def __init__(
        self,
        kind: str,
        list_call: Callable[..., Awaitable[Any]],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        key: Callable[[Obj], str] | None = None,
        on_change: Callable[[list[Obj]], None] | None = None,
        on_reach: Callable[[], None] | None = None,
        watch_timeout_s: int = 300,
        retry_s: float = 1.0,
    ) -> None:
        self.kind = kind
        self.objects: dict[str, Obj] = {}
        self.synced = False
        self.relists = 0
        self.resumes = 0
        self._list = list_call
        self._query = {
            name: value
            for name, value in (
                ("namespace", namespace),
                ("label_selector", label_selector),
                ("field_selector", field_selector),
            )
            if value is not None
        }
        self._key = key or _name
        self._on_change = on_change
        self._on_reach = on_reach
        self._watch_timeout_s = watch_timeout_s
        self._retry_s = retry_s
        self._version = ""
        self._task: asyncio.Task[None] | None = None
        # When the API server stopped answering this watch (wall clock); None while it answers.
        self.lost_since: float | None = None
        self._failures = 0

    def remember(self, obj: Obj) -> None:
        """Hold ``obj`` (a create's answer) until the watch reports it or something newer."""
        self.objects[self._key(obj)] = obj

    async def relist(self) -> None:
        """Replace everything held with a fresh list; ``on_change`` hears every object before and after."""
        response = await self._list(**self._query, _preload_content=False)
        body = json.loads(await response.read())
        if response.status >= 400:  # unparsed, an error is no exception: say the cluster's own sentence
            raise ApiException(
                status=response.status, reason=f"cannot list {self.kind}: {body.get('message') or body}"
            )
        before = self.objects
        self.objects = {self._key(item): item for item in body.get("items") or []}
        self._version = str(body["metadata"]["resourceVersion"])
        self.synced = True
        self._changed([*before.values(), *self.objects.values()])

    async def start(self) -> None:
        """List (so :attr:`objects` is complete when this returns), then watch in the background."""
        await self.relist()
        self._task = asyncio.create_task(self._watch(), name=f"gpupool-mirror-{self.kind}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        """Watch forever: resume where a watch ended, relist on 410 Gone, wait a moment on other errors."""
        while True:
            if self.lost_since is not None:  # after an outage, list afresh: a quiet watch would say nothing
                self.relists += 1  # for minutes, and what changed meanwhile is in the list
                await self._relisted()
            try:
                async with watch.Watch(return_type="object") as stream:
                    async for event in stream.stream(
                        self._list,
                        **self._query,
                        resource_version=self._version,
                        timeout_seconds=self._watch_timeout_s,
                        allow_watch_bookmarks=True,
                    ):
                        self._answered()
                        self._apply(event["type"], event["raw_object"])
                        if stream.resource_version:
                            self._version = str(stream.resource_version)
                self._answered()
                self.resumes += 1
                log.debug("watch of %s ended; resuming from %s", self.kind, self._version)
            except ApiException as error:
                if error.status == 410:
                    self._answered()
                    self.relists += 1
                    log.info("watch of %s: version %s is gone; listing afresh", self.kind, self._version)
                    await self._relisted()
                else:
                    await self._failed(f"{error.status} {error.reason}")
            except NO_ANSWER as error:
                self.resumes += 1
                await self._failed(str(error) or type(error).__name__)

    async def _failed(self, why: str) -> None:
        """Note a failed watch: said once per outage (the next ones at debug level), retried ever less often
        up to :data:`MAX_RETRY_S` (a stopped API server drew 200 warnings in 85 s)."""
        if self.lost_since is None:
            self.lost_since = time.time()
            log.warning("watch of %s lost (%s); retrying until the API server answers", self.kind, why)
            self._reach_changed()
        else:
            log.debug("watch of %s still lost (%s)", self.kind, why)
        self._failures += 1
        await asyncio.sleep(min(self._retry_s * 2 ** min(self._failures - 1, 10), MAX_RETRY_S))

    def _answered(self) -> None:
        self._failures = 0
        if self.lost_since is not None:
            log.warning("watch of %s is back after %.0f s", self.kind, time.time() - self.lost_since)
            self.lost_since = None
            self._reach_changed()

    def _reach_changed(self) -> None:
        if self._on_reach is not None:
            try:
                self._on_reach()
            except Exception:  # a failing listener must not end the watch
                log.exception("listener of the %s watch's reach failed", self.kind)

    async def _relisted(self) -> None:
        while True:
            try:
                await self.relist()
                self._answered()
                return
            except ApiException as error:
                await self._failed(f"listing: {error}")
            except NO_ANSWER as error:
                await self._failed(f"listing: {error}")

    def _apply(self, event: str, obj: Obj) -> None:
        if event not in ("ADDED", "MODIFIED", "DELETED"):
            return  # BOOKMARK: only its version matters, and the watch took it
        key = self._key(obj)
        old = self.objects.pop(key, None)
        if event != "DELETED":
            self.objects[key] = obj
        self._changed([obj] if old is None else [old, obj])

    def _changed(self, touched: list[Obj]) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(touched)
        except Exception:  # a failing listener must not stop the watch
            log.exception("listener of the %s watch failed", self.kind)


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name"))
