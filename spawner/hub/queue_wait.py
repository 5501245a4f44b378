"""How long a spawn may wait in gpupool's queue: its profile's ``queue_wait``, on top of the server's own start.

JupyterHub gives a spawn ``start_timeout`` seconds from the moment it begins, and reads it then, after
``apply_user_options``: so that hook (:func:`gpupool.spawner.hub.user_options.check_user_options`) sets it, per
spawn, to the configured start timeout plus the chosen profile's ``queue_wait``. The lease wait itself ends
once ``queue_wait`` has passed (:meth:`GpuLeasing._lease`), leaving the configured time for the server to start.
"""

from __future__ import annotations

from typing import Any

from ..pool.profiles import Profile

_CONFIGURED = "_gpupool_configured_start_timeout"


def fit_start_timeout(spawner: Any, profile: Profile) -> None:
    """``spawner.start_timeout`` for a spawn of ``profile``: the configured one, plus its queue wait."""
    configured = getattr(spawner, _CONFIGURED, None)
    if configured is None:
        configured = spawner.start_timeout
        setattr(spawner, _CONFIGURED, configured)
    spawner.start_timeout = configured + (profile.queue_wait or 0)


def queue_deadline(spawner: Any, profile: Profile, margin: float) -> float:
    """Seconds the lease may wait queued: the profile's ``queue_wait``, else the start timeout less ``margin``."""
    if profile.queue_wait:
        return float(profile.queue_wait)
    return max(1.0, float(spawner.start_timeout) - margin)
