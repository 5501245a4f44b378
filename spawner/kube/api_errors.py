"""An error from the Kubernetes API client, as one line a person reads: the status and the cluster's own
sentence (who may not do what) for an answer, the error's type and text for no answer at all."""

from __future__ import annotations

import json

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

# What the client raises when the API server gives no answer at all (down, hung, the network gone), as
# against an ApiException, which is an answer.
NO_ANSWER: tuple[type[Exception], ...] = (TimeoutError, aiohttp.ClientError, ConnectionError)


def in_words(error: Exception) -> str:
    """``403 Forbidden: pods is forbidden: User "nobody" cannot list …``, or ``ClientConnectorError: …``."""
    if not isinstance(error, ApiException):
        return f"{type(error).__name__}: {error}"
    try:
        message = json.loads(error.body or "{}").get("message") or ""
    except (ValueError, AttributeError):
        message = ""
    return f"{error.status} {error.reason}" + (f": {message}" if message else "")
