"""A small async client of the gpupool service API, as the hub's spawners use it.

The spawner calls it with a token of the hub's own (a JupyterHub service token whose role grants
``custom:gpupool:leases``), so it may create, read and release leases on behalf of any user. All calls on one
event loop share one :class:`httpx.AsyncClient`, kept for the life of the loop: making one costs 30–100 ms
(it loads the CA bundle), which every spawn would otherwise pay two or three times, and a kept connection
skips the TCP handshake too. The token goes with each request, so clients of different tokens share it.

Errors the service answers with a :class:`~..service.models.Problem` body become :class:`ServiceError`,
carrying the status, the machine-readable ``error`` and the ``detail`` sentence a user reads; a service that
cannot be reached is a :class:`ServiceError` with status 0.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import httpx

API = "api/v1"

# One client per event loop: a client's connections belong to the loop that opened them.
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


def _shared_client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    client = _CLIENTS.get(loop)
    if client is None or client.is_closed:
        client = _CLIENTS[loop] = httpx.AsyncClient()
    return client


class ServiceError(RuntimeError):
    """The service refused a call, or could not be reached (``status`` 0); ``detail`` is for the user."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail


@dataclass(frozen=True)
class Availability:
    """What the form needs from the service, per profile slug: ``(available_now, queued)`` and why a
    profile can never fit the pool; plus the backend ("simulated" or "nvml")."""

    counts: dict[str, tuple[int, int]]
    never_fits: dict[str, str]
    backend: str


class ServiceClient:
    """The gpupool service at ``base_url`` (ending in the service prefix, e.g.
    ``http://127.0.0.1:8000/services/gpupool/``), called with ``token``."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/") + "/"
        self.api_url = f"{self.base_url}{API}"
        self._token = token
        self._timeout = timeout

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"token {self._token}"}
        try:
            response = await _shared_client().request(
                method, f"{self.api_url}/{path}", headers=headers, timeout=self._timeout, **kwargs
            )
        except httpx.HTTPError as error:
            detail = f"cannot reach the gpupool service at {self.api_url}: {error}"
            raise ServiceError(0, "unreachable", detail) from error
        if response.is_success:
            return response.json()
        try:
            body = response.json()
            code, detail = str(body.get("error", "error")), str(body.get("detail", response.text))
        except ValueError:  # not the service's answer: the proxy's error page while the service is down
            code, detail = "error", f"{response.status_code} {response.reason_phrase} from {response.url}"
        raise ServiceError(response.status_code, code, detail)

    async def profiles(self, user: str | None = None) -> list[dict[str, Any]]:
        """``GET profiles``: the profiles the token may use, each with ``available_now``, ``queued`` and
        ``never_fits``. ``user`` is sent as a query parameter for a service that answers per user; today the
        service answers for the token's owner (the hub: every profile open to all, none restricted to
        groups)."""
        params = {"user": user} if user else None
        return cast(list[dict[str, Any]], await self._call("GET", "profiles", params=params))

    async def pool(self) -> dict[str, Any]:
        """``GET pool``: nodes, devices, what is free, health and ``backend``."""
        return cast(dict[str, Any], await self._call("GET", "pool"))

    async def availability(self, user: str | None = None) -> Availability:
        """Per-profile counts and never-fits reasons from ``GET profiles``, and the backend from
        ``GET pool``."""
        profiles = await self.profiles(user)
        pool = await self.pool()
        return Availability(
            counts={p["slug"]: (int(p["available_now"]), int(p["queued"])) for p in profiles},
            never_fits={p["slug"]: str(p["never_fits"]) for p in profiles if p.get("never_fits")},
            backend=str(pool.get("backend", "")),
        )

    async def create_lease(
        self,
        user: str,
        groups: Iterable[str],
        profile: str,
        *,
        owner_kind: str = "server",
        owner_name: str = "",
    ) -> dict[str, Any]:
        """``POST leases`` for ``user``: the lease, ``granted`` (with devices) or ``queued`` (with
        ``position`` and ``waiting_message``)."""
        body = {
            "profile": profile,
            "owner_kind": owner_kind,
            "owner_name": owner_name,
            "user": user,
            "groups": sorted(groups),
        }
        return cast(dict[str, Any], await self._call("POST", "leases", json=body))

    async def active_leases(self, user: str) -> list[dict[str, Any]]:
        """``GET leases?active_only=true&user=…``: ``user``'s queued and granted leases."""
        leases = await self._call("GET", "leases", params={"active_only": "true", "user": user})
        return cast(list[dict[str, Any]], leases)

    async def get_lease(self, lease_id: str) -> dict[str, Any]:
        """``GET leases/{id}``: the lease as it stands now."""
        return cast(dict[str, Any], await self._call("GET", f"leases/{lease_id}"))

    async def release_lease(self, lease_id: str) -> dict[str, Any]:
        """``DELETE leases/{id}``; the service makes a second release change nothing."""
        return cast(dict[str, Any], await self._call("DELETE", f"leases/{lease_id}"))
