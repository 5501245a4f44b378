"""Where the service is, who calls it, and the calls themselves: synchronous for scripts and the CLI,
asynchronous for the hub's spawners and the notebook widgets (which must never block the kernel).

Inside a notebook server that gpupool spawned, the service and the caller come from the environment:
``GPUPOOL_SERVICE_URL`` (the service's prefix, e.g. ``http://127.0.0.1:8000/services/gpupool/``) and
``JUPYTERHUB_API_TOKEN`` (the server's token, acting as the user). Elsewhere pass ``url`` and ``token``.

Asynchronous calls on one event loop share one :class:`httpx.AsyncClient` for the loop's life: making one
costs 30–100 ms (it loads the CA bundle), which every spawn would otherwise pay two or three times, and a kept
connection skips the TCP handshake. The token goes with each request, so connections of different tokens
share it. The synchronous client is made on first use, so the widgets never pay for it.
"""

from __future__ import annotations

import asyncio
import json
import os
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from ..names import API_PATH, EXAMPLE_URL, SERVICE_FILE, TOKEN_ENV, UP_STATE, URL_ENV
from . import errors
from .errors import GpupoolError

__all__ = ["EXAMPLE_URL", "TOKEN_ENV", "URL_ENV", "Connection", "local_service", "locate", "loopback"]

# One client per event loop: a client's connections belong to the loop that opened them.
_ASYNC_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


def _loop_client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    client = _ASYNC_CLIENTS.get(loop)
    if client is None or client.is_closed:
        client = _ASYNC_CLIENTS[loop] = httpx.AsyncClient()
    return client


def locate(
    url: str | None = None,
    token: str | None = None,
    environ: Mapping[str, str] | None = None,
    state_dir: str | Path = UP_STATE,
) -> tuple[str, str]:
    """The service's URL and the token: from the arguments, else the environment, else the state folder of a
    ``gpupool up`` started here (:func:`local_service`); a missing one is a :class:`GpupoolError` (status 0)
    that says what to set."""
    env = os.environ if environ is None else environ
    url = url or env.get(URL_ENV)
    token = token or env.get(TOKEN_ENV)
    if not (url and token):
        found = local_service(state_dir)
        url, token = url or (found and found[0]), token or (found and found[1])
    if not url:
        raise GpupoolError(
            0,
            "not_configured",
            f"no gpupool service: set {URL_ENV} or pass --url (url=… in Python), e.g. {EXAMPLE_URL}; or run "
            f"this where gpupool up keeps its state ({state_dir}/)",
        )
    if not token:
        raise GpupoolError(
            0, "not_configured", f"no token: set {TOKEN_ENV} or pass --token (token=… in Python)"
        )
    return url, token


def local_service(state_dir: str | Path = UP_STATE) -> tuple[str, str] | None:
    """The service a ``gpupool up`` in ``state_dir`` runs, and its spawners' token (which sees the whole
    pool): None when there is none, or the folder is not this account's to read."""
    folder = Path(state_dir)
    try:
        url = str(json.loads((folder / SERVICE_FILE).read_text())["url"])
        token = (folder / "gpupool-hub-token").read_text().strip()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (url, token) if url and token else None


class Connection:
    """The service's API at ``url`` (its prefix) for the caller whose ``token`` it is.

    ``call``/``text``/``stream`` block (scripts, the CLI, ``submit()``); ``acall``/``atext`` are their
    asynchronous twins, for code on an event loop (the hub, the widgets on the kernel's loop). Every failure
    is a :class:`GpupoolError` carrying the service's sentence.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        state_dir: str | Path = UP_STATE,
    ) -> None:
        url, self._token = locate(url, token, environ, state_dir)
        self.base_url = url.rstrip("/") + "/"
        self.api_url = self.base_url + API_PATH
        self.timeout = timeout
        self._headers = {"Authorization": f"token {self._token}"}
        self._client: httpx.Client | None = None

    def __repr__(self) -> str:
        return f"<gpupool Connection {self.api_url}>"

    def _url(self, path: str) -> str:
        return f"{self.api_url}/{path}"

    @property
    def _sync(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(headers=self._headers, timeout=self.timeout)
        return self._client

    def close(self) -> None:
        """Close the synchronous client's connections (the asynchronous one belongs to its loop)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._sync.request(method, self._url(path), **kwargs)
        except httpx.HTTPError as error:
            raise errors.unreachable(self.api_url, error) from error

    async def _asend(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await _loop_client().request(
                method, self._url(path), headers=self._headers, timeout=self.timeout, **kwargs
            )
        except httpx.HTTPError as error:
            raise errors.unreachable(self.api_url, error) from error

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of ``method path`` (``path`` relative to the API, e.g. ``"jobs"``)."""
        return errors.answer(self._send(method, path, **kwargs))

    async def acall(self, method: str, path: str, **kwargs: Any) -> Any:
        """:meth:`call` without blocking the event loop it runs on."""
        return errors.answer(await self._asend(method, path, **kwargs))

    def text(self, path: str, **params: Any) -> str:
        """A text answer (a log) of ``GET path``."""
        return errors.text(self._send("GET", path, params=params))

    async def atext(self, path: str, **params: Any) -> str:
        """:meth:`text` without blocking the event loop it runs on."""
        return errors.text(await self._asend("GET", path, params=params))

    def stream(self, path: str, **params: Any) -> Iterator[bytes]:
        """A streamed answer's chunks as they arrive (``follow=true`` logs); no read timeout."""
        timeout = httpx.Timeout(self.timeout, read=None)
        try:
            with self._sync.stream("GET", self._url(path), params=params, timeout=timeout) as response:
                if response.is_error:
                    response.read()
                    errors.raise_for_problem(response)
                yield from response.iter_bytes()
        except httpx.HTTPError as error:
            raise errors.unreachable(self.api_url, error) from error


def loopback(url: str) -> str:
    """``url`` with an empty or wildcard host replaced by 127.0.0.1, so the hub can call itself through it."""
    parts = urlsplit(url)
    if (parts.hostname or "") in ("", "0.0.0.0", "::"):
        parts = parts._replace(netloc="127.0.0.1" + (f":{parts.port}" if parts.port else ""))
    return urlunsplit(parts)
