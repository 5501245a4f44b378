"""jupyterhub-idle-culler configuration: gpupool's cull arbiter (per-profile limits, GPU activity, warnings).

Used by ``gpupool up`` and ``hub_config/jupyterhub_config.py`` as ``python -m jupyterhub_idle_culler
--config=<this file>``. The culler's environment must give ``GPUPOOL_SERVICE_URL``; see
:mod:`gpupool.spawner.hub.cull` for the rest. The settings are read here, so a bad one stops the culler at
start-up, not at its first pass.
"""

import os

# The culler logs and ignores a config file that raises an ordinary error, then culls with its default rule
# (no GPU check, no warning): every failure here must stop it instead, hence SystemExit.
try:
    from gpupool.spawner.hub.cull import CullConfigError, CullSettings, gpupool_cull_arbiter
except ImportError as error:
    raise SystemExit(f"jupyterhub-idle-culler: gpupool is not importable here ({error})") from None

c = get_config()  # type: ignore[name-defined]  # noqa: F821  (the culler provides it)

try:
    CullSettings.from_env(os.environ)
except CullConfigError as error:
    raise SystemExit(f"jupyterhub-idle-culler: {error}") from None

c.IdleCuller.cull_arbiter_hook = gpupool_cull_arbiter
