"""gpupool's ``cull_arbiter_hook`` for jupyterhub-idle-culler: profile limits, GPU activity, warnings first.

The culler calls :func:`gpupool_cull_arbiter` for every ready server on each pass and stops the server when it
returns True. The hook asks the gpupool service (which owns the profiles and the GPU telemetry) about the
server's lease, then applies, per profile:

- ``max_lifetime``: a server this old goes, busy or not;
- ``gpu_idle_timeout``: a server whose GPUs have all been at or below the service's threshold this long goes,
  even with its browser tab open (recent ``last_activity``);
- ``idle_timeout`` instead of the culler's global ``--timeout``; GPU use counts as activity, so a server whose
  GPUs are busy is never culled for inactivity. A GPU whose utilisation is unknown is never taken for idle.

No GPU server is stopped without a warning: the first pass that finds a reason records "will be culled at T
because …" in the service (``GpuMonitor`` shows it; ``GET api/v1/warnings`` lists it), at least ``GPUPOOL_CULL_WARNING_SECONDS``
ahead; the server is culled only on a pass after T that still finds a reason. A reason that went away
withdraws the warning. A server without a lease (not gpupool's) gets the culler's own rule; when the service
cannot be reached the hook culls nothing, because it could neither see the GPUs nor warn.

Settings, from the culler's environment: ``GPUPOOL_SERVICE_URL`` (the service with its prefix, e.g.
``http://127.0.0.1:10101/services/gpupool/``), ``JUPYTERHUB_API_TOKEN`` (the culler's token: it needs
``admin:server_state`` to read lease ids, ``access:services!service=gpupool`` and ``custom:gpupool:admin``),
and ``GPUPOOL_CULL_WARNING_SECONDS`` (default 600). ``hub_config/idle_culler_config.py`` loads them at start-up.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from ..client import Connection, GpupoolError
from ..names import SERVICE_PREFIX
from ..pool.profiles import format_duration

log = logging.getLogger("IdleCuller.gpupool")  # a child of the culler's own logger, so it shows in its log

WARNING_ENV = "GPUPOOL_CULL_WARNING_SECONDS"
DEFAULT_WARNING_SECONDS = 600.0


class CullConfigError(ValueError):
    """A culler setting that cannot work; the message names it."""


@dataclass(frozen=True)
class CullSettings:
    service_url: str  # ends with "/"
    token: str
    warning_seconds: float

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CullSettings:
        """The settings, or :class:`CullConfigError` naming the bad one (the config file calls this, so the
        culler stops at start-up rather than at its first pass)."""
        url = (env.get("GPUPOOL_SERVICE_URL") or "").strip()
        if not url.startswith(("http://", "https://")):
            raise CullConfigError(
                "GPUPOOL_SERVICE_URL must be the gpupool service's URL with its prefix, e.g. "
                f"http://127.0.0.1:10101{SERVICE_PREFIX}, got {url!r}"
            )
        token = env.get("JUPYTERHUB_API_TOKEN") or ""
        if not token:
            raise CullConfigError("JUPYTERHUB_API_TOKEN is not set: run the culler as a JupyterHub service")
        raw = env.get(WARNING_ENV) or str(DEFAULT_WARNING_SECONDS)
        try:
            warning = float(raw)
        except ValueError:
            raise CullConfigError(f"{WARNING_ENV} must be a number of seconds, got {raw!r}") from None
        if not (math.isfinite(warning) and warning >= 0):
            raise CullConfigError(f"{WARNING_ENV} must be 0 or more, got {raw!r}")
        return cls(url.rstrip("/") + "/", token, warning)


@dataclass(frozen=True)
class Verdict:
    """Why a server should go and when its limit is (or was) reached."""

    reason: str
    due_at: float
    limit: str = "idle_timeout"  # the profile limit reached: max_lifetime, gpu_idle_timeout or idle_timeout


def judge(
    activity: Mapping[str, Any],
    *,
    inactive: float,
    inactive_limit: float,
    age: float | None,
    now: float,
    warn_ahead: float,
) -> Verdict | None:
    """The earliest limit the server reaches within ``warn_ahead`` seconds, or None to keep it. Pure.

    ``activity`` is the service's answer for the server's lease (see :mod:`gpupool.spawner.service.api.idle_routes`);
    ``inactive`` and ``age`` are seconds from the hub's server model.
    """
    limits = activity.get("limits") or {}
    gpu = activity.get("gpu") or {}
    profile = activity.get("profile", "?")
    gpu_state = gpu.get("state")
    gpu_idle = gpu.get("idle_seconds")
    found: list[Verdict] = []

    def consider(limit: float, used: float, reason: str, name: str) -> None:
        remaining = limit - used
        if remaining <= warn_ahead:
            found.append(Verdict(reason, now + remaining, name))

    lifetime = limits.get("max_lifetime")
    if lifetime and age is not None:
        consider(
            lifetime,
            age,
            f"it reached the maximum lifetime of profile {profile} ({format_duration(lifetime)})",
            "max_lifetime",
        )
    gpu_limit = limits.get("gpu_idle_timeout")
    if gpu_limit and gpu_state == "idle" and gpu_idle is not None:
        threshold = gpu.get("threshold_percent", 10)
        consider(
            gpu_limit,
            gpu_idle,
            f"its GPUs have been idle (at most {threshold:g}% utilisation) for {format_duration(gpu_limit)}, the limit "
            f"of profile {profile}",
            "gpu_idle_timeout",
        )
    if gpu_state != "busy":
        idle_limit = limits.get("idle_timeout") or inactive_limit
        # GPU use is activity: a server is inactive only while both its browser and its GPUs are
        idle = min(inactive, gpu_idle) if gpu_state == "idle" and gpu_idle is not None else inactive
        consider(
            idle_limit,
            idle,
            f"it has been inactive for {format_duration(idle_limit)}, the limit of profile {profile}",
            "idle_timeout",
        )
    return min(found, key=lambda v: v.due_at) if found else None


class CullerService(Connection):
    """The calls the hook makes to the gpupool service, with the culler's token, through the one client: any
    failure is a :class:`GpupoolError`, and the hook then culls nothing this pass."""

    async def activity(self, user: str, server: str, lease_id: str | None) -> dict[str, Any] | None:
        """The server's lease activity; None when it holds no active lease."""
        if lease_id:
            found = await self._found(f"activity/leases/{quote(lease_id, safe='')}")
            if found is not None and found.get("state") != "released":
                return found
        return await self._found(f"activity/users/{quote(user, safe='')}", params={"server": server})

    async def _found(self, path: str, **kwargs: Any) -> dict[str, Any] | None:
        try:
            return dict(await self.acall("GET", path, **kwargs))
        except GpupoolError as error:
            if error.status == 404:
                return None
            raise

    async def warning(self, user: str, server: str) -> dict[str, Any] | None:
        found = await self.acall("GET", "warnings", params={"user": user})
        return next((dict(w) for w in found if w.get("server") == server), None)

    async def warn(self, user: str, server: str, lease_id: str, cull_at: float, reason: str) -> None:
        body = {"user": user, "server": server, "lease_id": lease_id, "cull_at": cull_at, "reason": reason}
        await self.acall("POST", "warnings", json=body)

    async def culled(self, user: str, server: str, lease_id: str, verdict: Verdict) -> None:
        body = {"user": user, "server": server, "lease_id": lease_id, "limit": verdict.limit}
        await self.acall("POST", "culls", json=body | {"reason": verdict.reason})

    async def withdraw(self, user: str, server: str) -> None:
        await self.acall("DELETE", f"warnings/{quote(user, safe='')}", params={"server": server})


_clients: dict[int, tuple[CullSettings, CullerService]] = {}


def _service() -> tuple[CullSettings, CullerService]:
    """The settings and the client, read from the environment once per event loop (the culler has one)."""
    key = id(asyncio.get_running_loop())
    if key not in _clients:
        settings = CullSettings.from_env(os.environ)
        _clients[key] = (settings, CullerService(settings.service_url, settings.token, timeout=10))
    return _clients[key]


async def gpupool_cull_arbiter(
    inactive: timedelta, inactive_limit: int | float, server: Mapping[str, Any], **_kw: Any
) -> bool:
    """The ``cull_arbiter_hook``: True to cull ``server`` (a hub server model) now. See the module's docstring."""
    user, _, name = str(server.get("full_name") or "/").partition("/")
    lease_id = (server.get("state") or {}).get("gpupool_lease_id") or None  # needs admin:server_state
    now = time.time()
    age = now - _epoch(server["started"]) if server.get("started") else None
    settings, service = _service()
    warn_ahead = settings.warning_seconds
    label = f"{user}/{name}" if name else user
    try:
        activity = await service.activity(user, name, lease_id)
        if activity is None:  # not a gpupool server: the culler's own rule
            return inactive.total_seconds() >= inactive_limit
        verdict = judge(
            activity,
            inactive=inactive.total_seconds(),
            inactive_limit=inactive_limit,
            age=age,
            now=now,
            warn_ahead=warn_ahead,
        )
        warning = await service.warning(user, name)
        if verdict is None:
            if warning is not None:
                log.info("withdrawing the cull warning of %s: it is active again", label)
                await service.withdraw(user, name)
            return False
        if warning is None:
            cull_at = max(verdict.due_at, time.time() + warn_ahead)  # the full period from the warning on
            log.info(
                "warning %s: culled at the earliest in %.0f s because %s",
                label,
                cull_at - now,
                verdict.reason,
            )
            await service.warn(user, name, str(activity["lease_id"]), cull_at, verdict.reason)
            return False
        if warning["reason"] != verdict.reason:  # another limit comes first now: say that one
            cull_at = max(float(warning["cull_at"]), verdict.due_at)
            await service.warn(user, name, str(activity["lease_id"]), cull_at, verdict.reason)
            return False
        if now >= float(warning["cull_at"]) and now >= verdict.due_at:
            log.info(
                "culling %s (warned %.0f s ago) because %s", label, now - warning["warned_at"], verdict.reason
            )
            # counted before the stop: a report that fails keeps the server (next pass), never loses a cull
            await service.culled(user, name, str(activity["lease_id"]), verdict)
            return True
        return False
    except GpupoolError as error:
        log.warning("not culling %s this pass: the gpupool service did not answer (%s)", label, error)
        return False
    except Exception:  # a surprise about one server must not end the culler's pass over the others
        log.exception("not culling %s this pass: judging it failed", label)
        return False


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
