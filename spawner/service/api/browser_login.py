"""Logging a browser in to the service's pages with JupyterHub's OAuth, so a hub user needs no token.

A page request without credentials is sent to the hub's ``/hub/api/oauth2/authorize``; the hub, where the
user is logged in already, sends the browser back to ``{prefix}oauth_callback`` with a code, which the service
trades for an access token (``POST {JUPYTERHUB_API_URL}/oauth2/token``, the service's own API token as the
client secret). The token goes into an HttpOnly cookie scoped to the service's prefix, and every later
request is checked with the hub like any API token (:class:`.auth.Authenticator`), so the hub stays the one
judge of who the caller is and what they may do.

The login asks for no scopes by name, so the token carries the service's ``oauth_client_allowed_scopes`` as far
as the user holds them, plus ``access:services!service=<name>``. List ``custom:gpupool:admin`` there (the
shipped configurations do) for administrators to see the whole pool; JupyterHub drops it for other users. The cookie is honoured only for reads (GET and HEAD): a page elsewhere cannot
make a browser change anything through it.

Settings come from the environment JupyterHub gives a managed service (``JUPYTERHUB_API_TOKEN``,
``JUPYTERHUB_API_URL``, ``JUPYTERHUB_CLIENT_ID``, ``JUPYTERHUB_BASE_URL``, ``JUPYTERHUB_SERVICE_PREFIX``);
an external service sets the same variables.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the route signatures.
import hmac
import logging
import secrets
from typing import Annotated
from urllib.parse import urlencode

import httpx
from fastapi import APIRouter, Cookie, HTTPException, Query, Request, status
from fastapi.responses import RedirectResponse

from .auth import TOKEN_COOKIE

log = logging.getLogger(__name__)

STATE_COOKIE = "gpupool-oauth-state"


class BrowserLogin:
    """The OAuth client of one service process."""

    def __init__(
        self,
        *,
        client_id: str,
        client_secret: str,
        hub_api_url: str,
        hub_prefix: str,
        service_prefix: str,
        timeout: float = 10.0,
    ) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.token_url = hub_api_url.rstrip("/") + "/oauth2/token"
        self.authorize_url = hub_prefix.rstrip("/") + "/api/oauth2/authorize"
        self.prefix = "/" + service_prefix.strip("/") + "/"
        self.redirect_uri = self.prefix + "oauth_callback"  # JupyterHub's default for a service's client
        self._client = httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        await self._client.aclose()

    def start(self, request: Request) -> RedirectResponse:
        """Send the browser to the hub to log in, to come back to the page it asked for."""
        state = secrets.token_urlsafe(24)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        query = urlencode(
            {
                "client_id": self.client_id,
                "redirect_uri": self.redirect_uri,
                "response_type": "code",
                "state": state,
            }
        )
        response = RedirectResponse(f"{self.authorize_url}?{query}", status.HTTP_302_FOUND)
        # the state binds the callback to this browser; the page to return to rides along with it
        response.set_cookie(
            STATE_COOKIE,
            f"{state}|{target}",
            max_age=600,
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
        expected, _, target = (remembered or "").partition("|")
        if not expected or not hmac.compare_digest(expected, state):
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                "the login's state does not match this browser's (expired or started elsewhere); "
                "open the page again",
            )
        try:
            answer = await self._client.post(
                self.token_url,
                data={
                    "client_id": self.client_id,
                    "client_secret": self.client_secret,
                    "grant_type": "authorization_code",
                    "code": code,
                    "redirect_uri": self.redirect_uri,
                },
            )
        except httpx.HTTPError as error:
            raise HTTPException(
                status.HTTP_502_BAD_GATEWAY, f"cannot reach JupyterHub to finish the login: {error}"
            ) from error
        if answer.status_code != 200 or "access_token" not in answer.json():
            log.warning("the hub refused the login code: %s %s", answer.status_code, answer.text[:300])
            raise HTTPException(status.HTTP_403_FORBIDDEN, "JupyterHub did not accept the login; try again")
        if not target.startswith(self.prefix):  # never an open redirect
            target = self.prefix
        response = RedirectResponse(target, status.HTTP_302_FOUND)
        response.set_cookie(
            TOKEN_COOKIE,
            str(answer.json()["access_token"]),
            path=self.prefix,
            httponly=True,
            samesite="lax",
            secure=_secure(request),
        )
        response.delete_cookie(STATE_COOKIE, path=self.prefix)
        return response

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
