"""Logging a browser in to the service's pages with JupyterHub's OAuth, so a hub user needs no token.

A page request without credentials is sent to the hub's ``/hub/api/oauth2/authorize`` with a PKCE challenge;
the hub, where the user is logged in already, sends the browser back to ``{prefix}oauth_callback`` with a
code, which the service trades for an access token. JupyterHub's :class:`~jupyterhub.services.auth.HubOAuth`
makes the PKCE challenge (JupyterHub 6+; 5.x, which Zero to JupyterHub's hub image ships, has none and asks for
none) and the token request with the service's API token as client secret; this module keeps each login's
state (the page to return to, the PKCE verifier) itself, the same on every JupyterHub version. The token goes into an HttpOnly cookie scoped to the service's prefix, and
every later request is checked with the hub like any API token (:class:`.auth.Authenticator`), so the hub
stays the one judge of who the caller is and what they may do.

The login asks for no scopes by name, so the token carries the service's ``oauth_client_allowed_scopes`` as far
as the user holds them, plus ``access:services!service=<name>``. List ``custom:gpupool:admin`` there (the
shipped configurations do) for administrators to see the whole pool; JupyterHub drops it for other users. The
cookie is honoured for reads (GET and HEAD), and for a change only with the XSRF token of a page the service
served (:meth:`.auth.Authenticator.token_of`): a page elsewhere cannot make a browser change anything through it.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Cookie, HTTPException, Query, Request, status
from fastapi.responses import RedirectResponse
from jupyterhub.services.auth import HubOAuth
from tornado.web import HTTPError as TornadoHTTPError

from .auth import TOKEN_COOKIE

log = logging.getLogger(__name__)

STATE_COOKIE = "gpupool-oauth-state"
MAX_PENDING = 10_000  # logins started and not finished: past this, the oldest are forgotten


@dataclass(frozen=True)
class _Pending:
    """A login under way: where to go back to, its PKCE verifier (None without PKCE), until when it may end."""

    target: str
    verifier: str | None
    expires: float


class BrowserLogin:
    """The pages' OAuth client: :class:`HubOAuth` for the protocol, cookies scoped to the service's prefix."""

    def __init__(self, hub_oauth: HubOAuth, service_prefix: str) -> None:
        self.hub_oauth = hub_oauth
        self.prefix = "/" + service_prefix.strip("/") + "/"
        self.redirect_uri = self.prefix + "oauth_callback"  # JupyterHub's default for a service's client
        self._pending: dict[str, _Pending] = {}

    def start(self, request: Request) -> RedirectResponse:
        """Send the browser to the hub to log in, to come back to the page it asked for."""
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        fields = {
            "client_id": self.hub_oauth.oauth_client_id,
            "redirect_uri": self.redirect_uri,
            "response_type": "code",
        }
        verifier = None
        pkce = getattr(self.hub_oauth, "generate_pkce_code_challenge", None)  # JupyterHub 6+
        if pkce is not None:
            verifier, challenge, method = pkce()
            fields |= {"code_challenge": challenge, "code_challenge_method": method}
        state = self._remember(
            _Pending(target, verifier, time.monotonic() + self.hub_oauth.oauth_state_max_age)
        )
        query = urlencode(fields | {"state": state})
        response = RedirectResponse(
            f"{self.hub_oauth.oauth_authorization_url}?{query}", status.HTTP_302_FOUND
        )
        # the state binds the callback to this browser; _pending keeps the page to return to and the verifier
        response.set_cookie(
            STATE_COOKIE,
            state,
            max_age=self.hub_oauth.oauth_state_max_age,
            path=self.prefix,
            httponly=True,
            samesite="lax",
            secure=_secure(request),
        )
        return response

    async def finish(
        self, request: Request, code: str, state: str, remembered: str | None
    ) -> RedirectResponse:
        """The callback: check the state, trade the code for a token, keep it in a cookie, go back."""
        pending = self._pending.pop(state, None)
        if (
            not remembered
            or not hmac.compare_digest(remembered, state)
            or pending is None
            or pending.expires < time.monotonic()
        ):
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                "the login's state does not match this browser's (expired or started elsewhere); "
                "open the page again",
            )
        target = pending.target
        pkce = {"code_verifier": pending.verifier} if pending.verifier is not None else {}
        try:
            token = await self.hub_oauth.token_for_code(code, sync=False, **pkce)
        except TornadoHTTPError as error:
            log.warning("the hub refused the login code: %s", error.log_message)
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, "JupyterHub did not accept the login; try again"
            ) from error
        if not target.startswith(self.prefix):  # never an open redirect
            target = self.prefix
        response = RedirectResponse(target, status.HTTP_302_FOUND)
        response.set_cookie(
            TOKEN_COOKIE, str(token), path=self.prefix, httponly=True, samesite="lax", secure=_secure(request)
        )
        response.delete_cookie(STATE_COOKIE, path=self.prefix)
        return response

    def _remember(self, pending: _Pending) -> str:
        """A new state for ``pending``; expired logins, and past :data:`MAX_PENDING` the oldest, are dropped."""
        now = time.monotonic()
        for old in [s for s, p in self._pending.items() if p.expires < now]:
            del self._pending[old]
        while len(self._pending) >= MAX_PENDING:
            del self._pending[next(iter(self._pending))]
        state = secrets.token_urlsafe(16)
        self._pending[state] = pending
        return state

    def router(self) -> APIRouter:
        router = APIRouter()

        @router.get(self.redirect_uri, include_in_schema=False)
        async def oauth_callback(
            request: Request,
            code: Annotated[str, Query(min_length=1)],
            state: Annotated[str, Query(min_length=1)],
            remembered: Annotated[str | None, Cookie(alias=STATE_COOKIE)] = None,
        ) -> RedirectResponse:
            return await self.finish(request, code, state, remembered)

        return router


def _secure(request: Request) -> bool:
    """Whether the browser reached us over HTTPS (directly or through a proxy that says so)."""
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"
