"""The kubelet's log endpoint: serves each container's log file to the API server for ``kubectl logs``."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .pki import KeyPair


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

    def finish_pod(self, namespace: str, name: str) -> None:
        """Tell followers of the pod's logs that nothing more will come."""
        for key, (_, finished) in self.logs.items():
            if key[:2] == (namespace, name):
                finished.set()

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
        return StreamingResponse(_follow(path, finished, text, limit), media_type="text/plain")


async def _follow(
    path: Path, finished: asyncio.Event, text: bytes, limit: int | None
) -> AsyncIterator[bytes]:
    """``text``, then what the log file gains until the container ends or ``limit`` bytes are sent."""
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
