"""The service's HTTP app: every route module's router under the service prefix, and errors mapped once.

JupyterHub's proxy forwards ``/services/gpupool/…`` with the prefix intact, so every route lives under
``{prefix}api/v1/``, the OpenAPI document included. Each route module (``lease_routes``, ``job_routes``,
``health_routes``, ``mig_routes``, ``idle_routes``, ``usage_routes``, ``telemetry_routes``, ``user_routes``,
``pages``) has a
module-level router; the parts they work on are on ``app.state`` (:mod:`.context`).

Status codes, mapped once in :func:`_problem_handlers`:

- 400 — a body or field the API cannot use (``fields`` names it), or an unknown profile (the detail lists the
  valid slugs);
- 401 — no token; 403 — a token the hub refuses, a missing scope (``error: "admin_required"`` for a call only
  administrators make), a profile the user's groups may not use, or a quota (``error: "quota_exceeded"``, the
  detail names the limit: releasing a lease, not waiting, is what helps, so it is not a 429);
- 403 also for a lease of another user (whose it is is not said), 404 — no such lease;
- 409 — a profile this pool can never serve (queueing it would wait forever), or an environment of it that no
  GPU of the pool can run (``fields``: ``environment``; the detail names those it can);
- 415 — a body sent as anything but JSON (``curl -d`` without ``-H 'Content-Type: application/json'``).
"""

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...names import ADMIN_REQUIRED
from ...pool.environments import FIELD as ENVIRONMENT
from ...pool.environments import UnrunnableEnvironment
from ...pool.profiles import UnknownProfile
from ...pool.quotas import QuotaExceeded
from ..leasing.lease_manager import NeverFits
from ..store.lease_store import LeaseNotFound
from . import (
    health_routes,
    idle_routes,
    job_routes,
    lease_routes,
    mig_routes,
    pages,
    telemetry_routes,
    usage_routes,
    user_routes,
)
from .auth import AdminRequired
from .context import ServiceParts
from .models import Problem

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": Problem} for code in (400, 401, 403, 404, 409)}


# The API's routes, under api/v1: what its OpenAPI document describes.
API_ROUTERS = tuple(
    module.router
    for module in (
        lease_routes,
        job_routes,
        health_routes,
        mig_routes,
        idle_routes,
        usage_routes,
        telemetry_routes,
        user_routes,
    )
)


def create_app(parts: ServiceParts) -> FastAPI:
    """The service's app over ``parts``: every route under ``parts.prefix``, the API under ``api/v1``."""
    base = parts.api_base
    app = FastAPI(
        title="gpupool",
        version="1",
        description="Leases of GPUs, MIG slices and GPU shares for JupyterHub servers and jobs.",
        openapi_url=f"{base}/openapi.json",
        docs_url=f"{base}/docs",
        redoc_url=None,
    )
    app.state.parts = parts
    app.add_middleware(_BodyLimit)
    _problem_handlers(app)
    job_routes.add_job_error_handlers(app)
    for router in API_ROUTERS:
        app.include_router(router, prefix=base, responses=_ERRORS)
    app.include_router(telemetry_routes.metrics_router, prefix=parts.prefix.rstrip("/"))
    app.include_router(pages.router, prefix=parts.prefix.rstrip("/"))
    if parts.login is not None:
        app.include_router(parts.login.router())
    app.openapi = _without_422(app.openapi)  # type: ignore[method-assign]
    return app


MAX_BODY_BYTES = 2 * 1024 * 1024  # a job's command and env are at most 1 MiB; the rest is JSON's overhead
# An oversized body up to this size is read and dropped before the 413, so the connection (the proxy's, and
# through it the client's) stays usable; past it the service stops reading and the connection is closed.
DISCARD_BYTES = 64 * 1024 * 1024


class _BodyLimit:
    """ASGI middleware: a 413 ``Problem`` for a body over :data:`MAX_BODY_BYTES`, before the app reads any of
    it; no request of this API needs more, and a larger one would be parsed whole before any check.

    A declared ``Content-Length`` is judged at once. A body sent without one (``Transfer-Encoding: chunked``)
    is read here up to the limit and handed on only if it ends within it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            length = headers.get(b"content-length")
            if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
                await _discard(receive, 0)
                await _too_large(f"got {int(length)} bytes", scope, receive, send)
                return
            if length is None and b"transfer-encoding" in headers:
                body, more = await _read_within_limit(receive)
                if body is None:
                    if more:
                        await _discard(receive, MAX_BODY_BYTES)
                    await _too_large("got more", scope, receive, send)
                    return
                receive = _replay(body, receive)
        await self.app(scope, receive, send)


async def _too_large(got: str, scope: Scope, receive: Receive, send: Send) -> None:
    detail = f"body: at most {MAX_BODY_BYTES // 1024} KiB, {got}"
    problem = Problem(error="too_large", detail=detail, fields=["body"])
    await JSONResponse(problem.model_dump(), status_code=413)(scope, receive, send)


async def _read_within_limit(receive: Receive) -> tuple[bytes | None, bool]:
    """The whole body, or None as soon as it passes :data:`MAX_BODY_BYTES`; and whether more of it follows."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: the app sees an empty body
            return b"".join(chunks), False
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None, more
        chunks.append(chunk)
        if not more:
            return b"".join(chunks), False


async def _discard(receive: Receive, size: int) -> None:
    """Read and drop the rest of a body ``size`` bytes of which are read, up to :data:`DISCARD_BYTES` in all."""
    while size <= DISCARD_BYTES:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        size += len(message.get("body", b""))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app ``body`` in one message, then whatever the client sends next."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


def _without_422(build: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """FastAPI's OpenAPI document as the service answers: a body or field it cannot use is a 400 ``Problem``
    (listed on every route), never FastAPI's default 422."""
    done: list[dict[str, Any]] = []

    def document() -> dict[str, Any]:
        if not done:
            built = build()  # FastAPI keeps it, so this edits the one it serves
            for operations in built.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for unused in ("HTTPValidationError", "ValidationError"):
                built.get("components", {}).get("schemas", {}).pop(unused, None)
            done.append(built)
        return done[0]

    return document


def _allowed_methods(app: FastAPI, request: Request) -> str:
    """Every method some route of the request's path answers, for a 405's ``Allow`` (Starlette names only
    the methods of the first route that matched the path)."""
    allowed = []
    for method in ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT"):
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in app.router.routes):
            allowed.append(method)
    return ", ".join(allowed)


_ERROR_NAMES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    415: "unsupported_media_type",
    502: "hub_unreachable",
}
# FastAPI's words for a body that is not UTF-8 text, as the API says it
_READABLE = {"There was an error parsing the body": "body: not valid JSON (it must be UTF-8 text)"}


WHEN = "a date such as 2026-12-01, a time such as 2026-12-01T09:30 (UTC unless it says), or Unix seconds"


def _plain(message: str) -> str:
    """Pydantic's message without the prefix it puts before a validator's own sentence."""
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


def _problem_handlers(app: FastAPI) -> None:
    """Typed errors to status codes, once; every error body is a :class:`Problem`."""

    def problem(code: int, error: str, detail: str, fields: list[str] | None = None) -> JSONResponse:
        body = Problem(error=error, detail=detail, fields=fields or [])
        return JSONResponse(body.model_dump(), status_code=code)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        sent = request.headers.get("content-type", "")
        if sent and "json" not in sent and any(tuple(e["loc"]) == ("body",) for e in exc.errors()):
            # FastAPI reads a body as JSON only when it says so; curl -d says it is a form
            detail = f"body: send JSON with Content-Type: application/json, not {sent.split(';')[0]}"
            return problem(415, "unsupported_media_type", detail, ["body"])
        fields, sentences = [], []
        for error in exc.errors():
            if error["type"] == "json_invalid":  # its location is a byte offset, not a field
                fields.append("body")
                sentences.append(f"body: not valid JSON ({error['ctx'].get('error', 'unreadable')})")
                continue
            where = ".".join(str(part) for part in error["loc"] if part not in ("body", "query", "path"))
            where = where or "body"
            fields.append(where)
            if error["type"].startswith(("datetime_", "date_")):  # a first-day trial's `--since yesterday`
                sent_value = str(error["input"])[:40]
                sentences.append(f"{where}: expected {WHEN}, got {sent_value!r}")
                continue
            sentences.append(f"{where}: {_plain(error['msg'])}")
        return problem(400, "invalid_request", "; ".join(sentences), fields)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 405:
            exc.headers = {**(exc.headers or {}), "Allow": _allowed_methods(app, request)}
        detail = _READABLE.get(str(exc.detail), str(exc.detail))
        # a refusal about one field starts with its name: "user: ...", "owner_kind: ..."
        field = detail.split(":", 1)[0] if exc.status_code in (400, 403, 404) else ""
        response = problem(
            exc.status_code,
            _ERROR_NAMES.get(exc.status_code, "error"),
            detail,
            [field] if field.isidentifier() else [],
        )
        response.headers.update(exc.headers or {})
        return response

    async def unknown_profile(_request: Request, exc: Exception) -> JSONResponse:
        return problem(400, "unknown_profile", str(exc), ["profile"])

    async def quota(_request: Request, exc: Exception) -> JSONResponse:
        return problem(403, "quota_exceeded", str(exc))

    async def never(_request: Request, exc: Exception) -> JSONResponse:
        return problem(409, "never_fits", str(exc), ["profile"])

    async def never_runs(_request: Request, exc: Exception) -> JSONResponse:
        return problem(409, "never_fits", str(exc), [ENVIRONMENT])

    async def not_found(_request: Request, exc: Exception) -> JSONResponse:
        return problem(404, "not_found", str(exc))

    async def admin_required(_request: Request, exc: Exception) -> JSONResponse:
        return problem(403, ADMIN_REQUIRED, str(exc))

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(UnknownProfile, unknown_profile)
    app.add_exception_handler(QuotaExceeded, quota)
    app.add_exception_handler(NeverFits, never)
    app.add_exception_handler(UnrunnableEnvironment, never_runs)
    app.add_exception_handler(LeaseNotFound, not_found)
    app.add_exception_handler(AdminRequired, admin_required)
