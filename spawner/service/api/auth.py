"""Who is calling: JupyterHub API tokens checked by JupyterHub's own :class:`~jupyterhub.services.auth.HubAuth`,
and the gpupool scopes they carry.

The service keeps no users of its own. A request's token (``Authorization: token …`` or ``Bearer …``, or the
cookie of a browser logged in through the hub, see :mod:`.browser_login`: for reads, and for a change only with
the page's XSRF token, see :meth:`Authenticator.token_of`) goes to
``HubAuth.user_for_token``, which asks ``GET {JUPYTERHUB_API_URL}/user`` and caches the answer for
``cache_max_age`` seconds under a hash of the token, so reading costs the hub one call a minute per token; a
change (a lease, a job, a warning) is checked afresh, so a token the hub has revoked can change nothing, and
reads with it for at most that minute (a followed log asks afresh every 10 s and then ends).

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
import hmac
import secrets
from dataclasses import dataclass, replace
from typing import Any

from fastapi import HTTPException, Request, status
from jupyterhub.services.auth import HubAuth
from tornado.web import HTTPError as TornadoHTTPError

from ...system_groups import system_groups

TOKEN_COOKIE = "gpupool-token"  # set by the browser login (browser_login.py), for the service's prefix only
LEASES_SCOPE = "custom:gpupool:leases"
ADMIN_SCOPE = "custom:gpupool:admin"
XSRF_HEADER = "X-XSRFToken"  # JupyterHub's own name for it


class AdminRequired(Exception):
    """A call only administrators may make, by a caller whose token lacks ``custom:gpupool:admin``: a 403
    whose error is :data:`...names.ADMIN_REQUIRED`."""


@dataclass(frozen=True)
class Caller:
    """The owner of the request's token, as the hub described it."""

    name: str
    kind: str  # "user" or "service"
    groups: frozenset[str]
    scopes: frozenset[str]
    hub_admin: bool = False  # the hub's own admin flag: its admin page is theirs, and every profile

    @property
    def is_admin(self) -> bool:
        return ADMIN_SCOPE in self.scopes

    @property
    def uses_every_profile(self) -> bool:
        """Whether profiles kept for groups are open to this caller, as the hub's spawn form offers them to the
        hub's admins (whatever scopes the token carries) and to gpupool's."""
        return self.is_admin or self.hub_admin

    @property
    def acts_for_others(self) -> bool:
        """The hub's scope: may create and release leases for any user."""
        return LEASES_SCOPE in self.scopes

    @property
    def sees_everyone(self) -> bool:
        """An administrator or the hub: reads every user's leases, jobs, activity and warnings."""
        return self.is_admin or self.acts_for_others

    def may_see(self, owner: str) -> bool:
        """Whether this caller may read or act on what belongs to ``owner`` (a lease, a job, a warning)."""
        return self.sees_everyone or (self.kind == "user" and owner == self.name)

    def check_admin(self, what: str) -> None:
        """:class:`AdminRequired` unless this caller is an administrator; ``what`` ends "may not …"."""
        if not self.is_admin:
            raise AdminRequired(f"{self.kind} {self.name} may not {what}: it needs {ADMIN_SCOPE}")

    def check_may_see(self, owner: str, what: str) -> None:
        """403 unless :meth:`may_see` allows ``what`` (``lease X``, ``job Y``); whose it is is not said."""
        if not self.may_see(owner):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"{what} belongs to another user; only they and admins see it"
            )


class Authenticator:
    """JupyterHub's :class:`HubAuth` for this service, turning its answers into :class:`Caller` or an HTTP
    error that says what is wrong."""

    def __init__(self, hub_auth: HubAuth, service_name: str, *, with_system_groups: bool = False) -> None:
        self.hub_auth = hub_auth
        self.service_name = service_name
        self.with_system_groups = with_system_groups  # a user's system groups count as their groups too
        # per process and never stored: a restarted service's pages get the new XSRF tokens at their next refresh
        self._xsrf_key = secrets.token_bytes(32)

    async def caller(self, request: Request, authorization: str | None) -> Caller:
        """The caller of ``request``: its token must be one the hub knows, allowed to use this service. A
        change (anything but GET and HEAD) asks the hub afresh, so a revoked token changes nothing."""
        fresh = request.method not in ("GET", "HEAD")
        return await self.check(self.token_of(request, authorization), fresh=fresh)

    def token_of(self, request: Request, authorization: str | None) -> str:
        """The request's token: from the ``Authorization`` header, else from the cookie a browser got by logging
        in (:mod:`.browser_login`). The cookie authorises reads (GET, HEAD); a change only with the XSRF token
        of a page the service served to that browser (``X-XSRFToken``, see :meth:`xsrf_token`), from the same
        origin. Another site can read neither the page nor the HttpOnly cookie, and gets no SameSite=Lax
        cookie sent with its requests, so it cannot make a logged-in browser release a lease."""
        cookie = request.cookies.get(TOKEN_COOKIE)
        if authorization is None and cookie:
            if request.method in ("GET", "HEAD"):
                return cookie
            if XSRF_HEADER in request.headers:
                self._check_xsrf(request, cookie)
                return cookie
        return _token_from_header(authorization)

    def xsrf_token(self, cookie: str) -> str:
        """The XSRF token for the browser holding the login cookie ``cookie``: its pages send it back to make a
        change with that cookie. Derived from the cookie, so it ends with the login, and keyed, so it tells
        nothing about the token."""
        return hmac.new(self._xsrf_key, cookie.encode(), hashlib.sha256).hexdigest()

    def _check_xsrf(self, request: Request, cookie: str) -> None:
        sent = request.headers.get(XSRF_HEADER, "").encode("utf-8", "replace")
        site = request.headers.get("sec-fetch-site", "same-origin")  # old browsers send none
        if site != "same-origin" or not hmac.compare_digest(sent, self.xsrf_token(cookie).encode()):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                "the page's XSRF token does not match this browser's login (or the request came from "
                "another site); reload the page",
            )

    async def check(self, token: str, *, fresh: bool = False) -> Caller:
        """The token's owner, who must be allowed to use this service (403 otherwise)."""
        caller = await self.identify(token, fresh=fresh)
        access = {"access:services", f"access:services!service={self.service_name}"}
        if caller.scopes.isdisjoint(access | {LEASES_SCOPE, ADMIN_SCOPE}):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"{caller.kind} {caller.name} may not use the {self.service_name} service: the token lacks "
                f"access:services!service={self.service_name} (a token made with only some of your scopes may "
                "lack it: make one with all of them; else ask an administrator to grant it in a role)",
            )
        if caller.kind == "service" and not caller.sees_everyone:
            # a service acts for no user of its own: without the hub's scope it could only make orphan leases
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"service {caller.name} may not use the {self.service_name} service: a service needs "
                f"{LEASES_SCOPE} (the hub's spawners, the culler) or {ADMIN_SCOPE}",
            )
        return caller

    async def identify(self, token: str, *, fresh: bool = False) -> Caller:
        """The token's owner as the hub (or, unless ``fresh``, HubAuth's cache) describes it."""
        try:
            model = await self.hub_auth.user_for_token(token, use_cache=not fresh, sync=False)
        except TornadoHTTPError as error:
            raise HTTPException(
                status.HTTP_502_BAD_GATEWAY, f"cannot check the token with JupyterHub: {error.log_message}"
            ) from error
        if model is None:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, "JupyterHub does not accept this token (unknown or expired)"
            )
        caller = caller_from_model(model)
        if self.with_system_groups and caller.kind == "user":
            caller = replace(caller, groups=caller.groups | system_groups(caller.name))
        return caller


def caller_from_model(model: dict[str, Any]) -> Caller:
    """A :class:`Caller` from the hub's ``GET /user`` answer (a user model or a service model)."""
    return Caller(
        name=str(model["name"]),
        kind="service" if model.get("kind") == "service" else "user",
        groups=frozenset(model.get("groups") or ()),
        scopes=frozenset(model.get("scopes") or ()),
        hub_admin=model.get("admin") is True,
    )


def _token_from_header(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() not in ("token", "bearer") or not token.strip():
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "send a JupyterHub API token as 'Authorization: token <token>' (or 'Bearer <token>')",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return token.strip()
