"""Who is calling: JupyterHub API tokens checked with the hub, and the gpupool scopes they carry.

The service keeps no users of its own. A request's token (``Authorization: token …`` or ``Bearer …``, or for
reads the cookie of a browser logged in through the hub, see :mod:`.browser_login`) is shown
to the hub at ``GET {JUPYTERHUB_API_URL}/user``, which answers with the token's owner and its scopes; the
answer is cached for ``cache_seconds`` under a hash of the token, so a busy spawner costs the hub one call a
minute, and the token itself is never kept.

Scopes, as JupyterHub grants them through roles (declare the custom ones in ``c.JupyterHub.custom_scopes``):

- ``access:services!service=<name>`` (or ``access:services``): may use the API at all; users read the pool
  and profiles and create, read and release their own leases. JupyterHub gives users this scope only when
  a role says so, e.g. ``{"name": "user", "scopes": ["self", "access:services!service=gpupool"]}``.
- ``custom:gpupool:leases``: the hub's spawners; create, read and release leases for any user.
- ``custom:gpupool:admin``: administrators; read and release every lease, use every profile.

Only unfiltered custom scopes count: ``custom:gpupool:admin!user=x`` grants nothing here.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
from fastapi import Header, HTTPException, Request, status

TOKEN_COOKIE = "gpupool-token"  # set by the browser login (browser_login.py), for the service's prefix only
LEASES_SCOPE = "custom:gpupool:leases"
ADMIN_SCOPE = "custom:gpupool:admin"


@dataclass(frozen=True)
class Caller:
    """The owner of the request's token, as the hub described it."""

    name: str
    kind: str  # "user" or "service"
    groups: frozenset[str]
    scopes: frozenset[str]

    @property
    def is_admin(self) -> bool:
        return ADMIN_SCOPE in self.scopes

    @property
    def acts_for_others(self) -> bool:
        """The hub's scope: may create and release leases for any user."""
        return LEASES_SCOPE in self.scopes

    def may_see(self, lease_user: str) -> bool:
        """Whether this caller may read or release a lease of ``lease_user``."""
        return self.is_admin or self.acts_for_others or (self.kind == "user" and lease_user == self.name)

    def check_may_see(self, owner: str, what: str) -> None:
        """403 unless :meth:`may_see` allows ``what`` (``lease X``, ``job Y``); whose it is is not said."""
        if not self.may_see(owner):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"{what} belongs to another user; only they and admins see it"
            )


class Authenticator:
    """Asks the hub who owns a token and what it may do; one instance per service process."""

    def __init__(
        self,
        api_url: str,
        service_name: str,
        *,
        cache_seconds: float = 60.0,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.service_name = service_name
        self.cache_seconds = cache_seconds
        self._clock = clock
        self._cache: dict[str, tuple[float, Caller]] = {}
        self._client = httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __call__(
        self, request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> Caller:
        """The FastAPI dependency: the caller of this request, or 401/403 saying what is wrong."""
        return await self.check(token_of(request, authorization))

    async def check(self, token: str) -> Caller:
        """The token's owner, who must be allowed to use this service (403 otherwise)."""
        caller = await self.identify(token)
        access = {"access:services", f"access:services!service={self.service_name}"}
        if caller.scopes.isdisjoint(access | {LEASES_SCOPE, ADMIN_SCOPE}):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"{caller.kind} {caller.name} may not use the {self.service_name} service: the token lacks "
                f"access:services!service={self.service_name}; ask an administrator to grant it in a role",
            )
        return caller

    async def identify(self, token: str) -> Caller:
        """The token's owner, from the cache when the hub answered for it in the last ``cache_seconds``."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        caller = await self._ask_hub(token)
        if len(self._cache) > 10_000:  # drop expired entries now and then, so the cache cannot grow forever
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        self._cache[key] = (now + self.cache_seconds, caller)
        return caller

    async def _ask_hub(self, token: str) -> Caller:
        try:
            response = await self._client.get(
                f"{self.api_url}/user", headers={"Authorization": f"token {token}"}
            )
        except httpx.HTTPError as error:
            raise HTTPException(
                status.HTTP_502_BAD_GATEWAY, f"cannot reach JupyterHub to check the token: {error}"
            ) from error
        if response.status_code in (401, 403, 404):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, "JupyterHub does not accept this token (unknown or expired)"
            )
        if response.status_code != 200:
            raise HTTPException(
                status.HTTP_502_BAD_GATEWAY, f"JupyterHub answered {response.status_code} checking the token"
            )
        return caller_from_model(response.json())


def caller_from_model(model: dict[str, Any]) -> Caller:
    """A :class:`Caller` from the hub's ``GET /user`` answer (a user model or a service model)."""
    return Caller(
        name=str(model["name"]),
        kind="service" if model.get("kind") == "service" else "user",
        groups=frozenset(model.get("groups") or ()),
        scopes=frozenset(model.get("scopes") or ()),
    )


def token_of(request: Request, authorization: str | None) -> str:
    """The request's token: from the ``Authorization`` header, or for reads (GET, HEAD) from the cookie a
    browser got by logging in (:mod:`.browser_login`); a cookie never authorises a change, so another site
    cannot make a logged-in browser release a lease."""
    if authorization is None and request.method in ("GET", "HEAD"):
        cookie = request.cookies.get(TOKEN_COOKIE)
        if cookie:
            return cookie
    return _token_from_header(authorization)


def _token_from_header(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() not in ("token", "bearer") or not token.strip():
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "send a JupyterHub API token as 'Authorization: token <token>' (or 'Bearer <token>')",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return token.strip()
