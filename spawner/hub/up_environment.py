"""What ``gpupool up`` takes from its own environment for the processes it starts."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .up_checks import UpError

UP_SETTINGS_ENV = "GPUPOOL_UP"  # gpupool up's settings for the embedded config (up.ENV), never passed on


def passed_on() -> dict[str, str]:
    """The ``GPUPOOL_*`` settings in ``gpupool up``'s own environment (``GPUPOOL_SAMPLE_SECONDS=1 make run``):
    the service and the culler get them, under what ``gpupool up`` sets itself."""
    kept_back = (UP_SETTINGS_ENV, "GPUPOOL_API_TOKEN")
    return {k: v for k, v in os.environ.items() if k.startswith("GPUPOOL_") and k not in kept_back}


def cull_every_seconds(environ: Mapping[str, str] = os.environ) -> int:
    """Seconds between the culler's passes: ``GPUPOOL_CULL_EVERY_SECONDS``, else 60."""
    raw = environ.get("GPUPOOL_CULL_EVERY_SECONDS", "60").strip()
    if not raw.isdigit() or int(raw) < 1:
        raise UpError(f"GPUPOOL_CULL_EVERY_SECONDS: expected whole seconds, 1 or more, got {raw!r}")
    return int(raw)


def user_path(user_bin: str) -> str:
    """The PATH of servers and jobs that run as the unprivileged account: its environment's bin first."""
    return f"{user_bin}:/usr/local/bin:/usr/bin:/bin"
