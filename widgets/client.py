"""Finding and calling the gpupool service from inside a notebook server, with the user's own token.

A server that ``LocalGPUSpawner`` started knows the service from its environment: ``GPUPOOL_SERVICE_URL``
(the service's prefix through the hub's proxy) and ``JUPYTERHUB_API_TOKEN`` (the server's token, which acts as
the user; the hub's ``server`` role must include ``access:services!service=gpupool``, as ``gpupool up`` and
``hub_config/jupyterhub_config.py`` configure it). Outside such a server, pass ``url`` and ``token``.

Errors the service answers with a Problem body become :class:`GpupoolError`, whose message is the service's
sentence (``profile: unknown profile 'h200'; choose one of …``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

API = "api/v1"


class GpupoolError(RuntimeError):
    """The service refused a call, or could not be reached (``status`` 0)."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


class Connection:
    """The service's API for one user: its base URL and the token it is called with."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        env = os.environ if environ is None else environ
        url = url or env.get("GPUPOOL_SERVICE_URL")
        token = token or env.get("JUPYTERHUB_API_TOKEN")
        if not url:
            raise GpupoolError(
                0, "not_configured", "no gpupool service: GPUPOOL_SERVICE_URL is not set; pass url=… "
                "(e.g. http://127.0.0.1:8000/services/gpupool/)"
            )  # fmt: skip
        if not token:
            raise GpupoolError(0, "not_configured", "no token: JUPYTERHUB_API_TOKEN is not set; pass token=…")
        self.api_url = url.rstrip("/") + "/" + API
        self._client = httpx.Client(headers={"Authorization": f"token {token}"}, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer of ``method path``, or :class:`GpupoolError` with the service's sentence."""
        try:
            response = self._client.request(method, f"{self.api_url}/{path}", **kwargs)
        except httpx.HTTPError as error:
            raise GpupoolError(
                0, "unreachable", f"cannot reach gpupool at {self.api_url}: {error}"
            ) from error
        _raise_for_problem(response)
        return response.json()

    def text(self, path: str, **params: Any) -> str:
        """A text answer (a log), decoded as UTF-8 with replacement for bytes a program wrote badly."""
        try:
            response = self._client.get(f"{self.api_url}/{path}", params=params)
        except httpx.HTTPError as error:
            raise GpupoolError(
                0, "unreachable", f"cannot reach gpupool at {self.api_url}: {error}"
            ) from error
        _raise_for_problem(response)
        return response.content.decode("utf-8", errors="replace")

    def stream(self, path: str, **params: Any) -> Iterator[bytes]:
        """A streamed answer's chunks as they arrive (``follow=true`` logs); no read timeout."""
        try:
            with self._client.stream(
                "GET", f"{self.api_url}/{path}", params=params, timeout=httpx.Timeout(30.0, read=None)
            ) as response:
                if response.is_error:
                    response.read()
                    _raise_for_problem(response)
                yield from response.iter_bytes()
        except httpx.HTTPError as error:
            raise GpupoolError(0, "unreachable", f"lost gpupool at {self.api_url}: {error}") from error


def _raise_for_problem(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        body = response.json()
        error, detail = str(body.get("error", "error")), str(body.get("detail", response.text))
    except ValueError:
        error, detail = "error", f"{response.status_code} {response.reason_phrase} from {response.url}"
    raise GpupoolError(response.status_code, error, detail)
