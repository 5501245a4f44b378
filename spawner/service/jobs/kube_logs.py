"""The logs of Kubernetes jobs, as the job runner answers readers: from a small cache, refreshed in the background.

Readers poll (the CLI's ``--follow``, JobPanel), and the job manager asks synchronously, so a read never
waits on the API server: it answers what the last read through the API server brought, and starts another
once the cached one is ``refresh_s`` old. The log is the main container's, in the attempt's newest pod.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ...kube.api_errors import in_words
from ...kube.job_manifests import MAIN_CONTAINER
from ...kube.mirror import Obj

log = logging.getLogger(__name__)

ENTRIES = 128  # jobs whose log is held at once


class JobLogs:
    """Logs of ``namespace``'s job pods through ``core``; ``spawn`` runs a read on the runner's event loop
    and ``now`` is that loop's clock. Each read takes at most ``limit`` bytes."""

    def __init__(
        self,
        core: client.CoreV1Api,
        namespace: str,
        *,
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None],
        now: Callable[[], float],
        refresh_s: float,
        limit: int,
    ) -> None:
        self._core = core
        self._namespace = namespace
        self._spawn = spawn
        self._now = now
        self.refresh_s = refresh_s
        self.limit = limit
        self._held: OrderedDict[str, tuple[str, bytes, float]] = OrderedDict()  # job id -> (Job, log, when)
        self._reading: set[str] = set()

    def read(self, job_id: str, name: str, pods: Callable[[], list[Obj]], offset: int, limit: int) -> bytes:
        """Bytes ``offset`` to ``offset + limit`` of the log of Job ``name`` (the job's current attempt) as
        last read, starting a fresh read of ``pods()``' newest when that one is stale."""
        held = self._held.get(job_id)
        if held is not None and held[0] != name:
            held = None  # an earlier attempt's log
        stale = held is None or self._now() - held[2] >= self.refresh_s
        if stale and job_id not in self._reading:
            self._reading.add(job_id)
            self._spawn(lambda: self._refresh(job_id, name, pods))
        if held is None:
            return b""
        self._held.move_to_end(job_id)
        return held[1][offset : offset + limit]

    async def keep(self, job_id: str, name: str, pods: Callable[[], list[Obj]]) -> None:
        """Read the log now, before its pod goes: what a stopped run printed stays readable from here (as long
        as the service runs, and among the last :data:`ENTRIES` jobs read)."""
        await self._refresh(job_id, name, pods)

    async def _refresh(self, job_id: str, name: str, pods: Callable[[], list[Obj]]) -> None:
        try:
            newest = sorted(pods(), key=lambda p: str(p["metadata"].get("creationTimestamp")))
            if not newest:
                return
            core: Any = self._core  # with _preload_content=False the answer is the raw response
            response = await core.read_namespaced_pod_log(
                str(newest[-1]["metadata"]["name"]),
                self._namespace,
                container=MAIN_CONTAINER,
                limit_bytes=self.limit,
                _preload_content=False,
            )
            body = await response.read()
            if (
                not 200 <= response.status <= 299
            ):  # unread, the client does not raise: the body is the error's
                raise ApiException(status=response.status, reason=body.decode(errors="replace")[:300])
            self._held[job_id] = (name, body, self._now())
            self._held.move_to_end(job_id)
            while len(self._held) > ENTRIES:
                self._held.popitem(last=False)
        except ApiException as error:
            if error.status not in (400, 404):  # 400: the container has not started; 404: the pod is gone
                log.warning("reading the log of Job %s failed: %s", name, in_words(error))
        finally:
            self._reading.discard(job_id)
