"""One kind of object in one namespace, kept current by a watch: the cache the Kubernetes job runner reads.

:meth:`Mirror.start` lists the objects that match a label selector, then watches them from the list's
``resourceVersion`` in the background, as :mod:`.inventory` watches nodes and pods: a watch that ends resumes
from the last version seen, a version the API server no longer keeps (410 Gone) makes it list afresh, and
other errors are retried after ``retry_s``. Readers on the event loop read :attr:`Mirror.objects` (name ->
the API's plain dict) without awaiting anything; :meth:`Mirror.remember` puts in an object this process just
wrote, so a reader sees its own create before the watch reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class Mirror:
    """The objects ``list_call`` lists in ``namespace`` with ``label_selector``; ``synced`` once listed."""

    def __init__(
        self,
        kind: str,
        list_call: Callable[..., Awaitable[Any]],
        *,
        namespace: str,
        label_selector: str,
        watch_timeout_s: int = 300,
        retry_s: float = 1.0,
    ) -> None:
        self.kind = kind
        self.objects: dict[str, Obj] = {}
        self.synced = False
        self.relists = 0
        self._list = list_call
        self._query = {"namespace": namespace, "label_selector": label_selector}
        self._watch_timeout_s = watch_timeout_s
        self._retry_s = retry_s
        self._version = ""
        self._task: asyncio.Task[None] | None = None

    def remember(self, obj: Obj) -> None:
        """Hold ``obj`` (a create's answer) until the watch reports it or something newer."""
        self.objects[_name(obj)] = obj

    async def start(self) -> None:
        """List (so :attr:`objects` is complete when this returns), then watch in the background."""
        await self._relist()
        self.synced = True
        self._task = asyncio.create_task(self._watch(), name=f"gpupool-mirror-{self.kind}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _relist(self) -> None:
        response = await self._list(**self._query, _preload_content=False)
        body = json.loads(await response.read())
        self.objects = {_name(item): item for item in body.get("items") or []}
        self._version = str(body["metadata"]["resourceVersion"])

    async def _watch(self) -> None:
        while True:
            try:
                async with watch.Watch(return_type="object") as stream:
                    async for event in stream.stream(
                        self._list,
                        **self._query,
                        resource_version=self._version,
                        timeout_seconds=self._watch_timeout_s,
                        allow_watch_bookmarks=True,
                    ):
                        self._apply(event["type"], event["raw_object"])
                        if stream.resource_version:
                            self._version = str(stream.resource_version)
            except ApiException as error:
                if error.status == 410:
                    self.relists += 1
                    log.info("watch of %s: version %s is gone; listing afresh", self.kind, self._version)
                    await self._relisted()
                else:
                    log.warning("watch of %s failed (%s %s); retrying", self.kind, error.status, error.reason)
                    await asyncio.sleep(self._retry_s)
            except (TimeoutError, aiohttp.ClientError, ConnectionError) as error:
                log.warning("watch of %s lost (%s); resuming from %s", self.kind, error, self._version)
                await asyncio.sleep(self._retry_s)

    async def _relisted(self) -> None:
        while True:
            try:
                await self._relist()
                return
            except (TimeoutError, ApiException, aiohttp.ClientError, ConnectionError) as error:
                log.warning("listing %s failed (%s); retrying", self.kind, error)
                await asyncio.sleep(self._retry_s)

    def _apply(self, event: str, obj: Obj) -> None:
        if event == "DELETED":
            self.objects.pop(_name(obj), None)
        elif event in ("ADDED", "MODIFIED"):
            self.objects[_name(obj)] = obj
        # BOOKMARK: only its version matters, and the watch took it


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name"))
