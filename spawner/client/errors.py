"""The one error of the gpupool API client, and the one place a response becomes JSON or that error.

The service answers a refusal with a Problem body (``{"error": "quota_exceeded", "detail": "…"}``); the
``detail`` is the sentence a user reads, so it is the error's message. A service that cannot be reached is
status 0, as is a client that is not configured: both are the user's to fix, never a crash of ours. Where the
remedy is the caller's, the message says it: a URL without the service's prefix, a call that needs an admin.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..names import ADMIN_REQUIRED, API_PATH, EXAMPLE_URL, SERVICE_PREFIX, TOKEN_ENV


class GpupoolError(RuntimeError):
    """The service refused a call (``status`` its HTTP status) or could not be reached (``status`` 0);
    ``error`` is the machine-readable code, ``detail`` (the message) the sentence for the user."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


def unreachable(api_url: str, error: Exception) -> GpupoolError:
    """The error for a service that did not answer at all (refused, timed out, the connection lost)."""
    return GpupoolError(0, "unreachable", f"cannot reach the gpupool service at {api_url}: {error}")


def raise_for_problem(response: httpx.Response) -> None:
    """Nothing for a success; else :class:`GpupoolError` with the service's sentence, or, for an answer that
    is not the service's (the proxy's error page while the service is down), the status and the URL."""
    if response.is_success:
        return
    try:
        body = response.json()
        error, detail = str(body.get("error", "error")), str(body.get("detail", response.text))
    except (ValueError, AttributeError):  # not JSON, or JSON that is not a Problem object
        error, detail = "error", f"{response.status_code} {response.reason_phrase} from {response.url}"
    raise GpupoolError(response.status_code, error, detail + _hint(response, error))


def _hint(response: httpx.Response, error: str) -> str:
    """What the user can do about a refusal whose remedy is theirs, not the service's: a URL without the
    service's prefix (the proxy's redirect to the hub, a 404 of the service's root), or a call only
    administrators make."""
    if error == ADMIN_REQUIRED:
        return (
            f"; pass an admin's JupyterHub API token as --token or in {TOKEN_ENV} (token=… in Python): an "
            "admin makes one on the hub's token page, /hub/token"
        )
    try:
        url = str(response.request.url)
    except RuntimeError:  # a response made without its request says nothing of where it went
        return ""
    base = url[: url.find(f"/{API_PATH}/") + 1] if f"/{API_PATH}/" in url else url
    if base.endswith(SERVICE_PREFIX):
        return ""
    return f"; is {base} the gpupool service? Its URL ends in {SERVICE_PREFIX}, e.g. {EXAMPLE_URL}"


def answer(response: httpx.Response) -> Any:
    """The JSON body of a successful response (None for one without a body, such as a 204), or the
    :class:`GpupoolError` it stands for."""
    raise_for_problem(response)
    return response.json() if response.content else None


def text(response: httpx.Response) -> str:
    """A text body (a log) of a successful response, decoded as UTF-8 with replacement for bytes a program
    wrote badly; or the :class:`GpupoolError` it stands for."""
    raise_for_problem(response)
    return response.content.decode("utf-8", errors="replace")
