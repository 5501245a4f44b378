"""The one API client (:mod:`gpupool.spawner.client`) as the notebook side imports it.

At run time it is ``gpupool.spawner.client``; mypy checks this tree as the packages ``spawner`` and
``widgets`` (the editable install's import hook is invisible to it), so it reads the same module by that name.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spawner.client import EXAMPLE_URL, Connection, GpupoolError
    from spawner.names import UP_STATE
    from spawner.pool.environments import ENV_VAR
    from spawner.pool.expected_start import NO_EXPECTED_START, time_and_span, time_of_day
    from spawner.pool.gpu_equivalents import shares_worth
    from spawner.pool.job_states import MAX_RETRIES
    from spawner.printable import printable
else:
    from gpupool.spawner.client import EXAMPLE_URL, Connection, GpupoolError
    from gpupool.spawner.names import UP_STATE
    from gpupool.spawner.pool.environments import ENV_VAR
    from gpupool.spawner.pool.expected_start import NO_EXPECTED_START, time_and_span, time_of_day
    from gpupool.spawner.pool.gpu_equivalents import shares_worth
    from gpupool.spawner.pool.job_states import MAX_RETRIES
    from gpupool.spawner.printable import printable

__all__ = [
    "ENV_VAR",
    "EXAMPLE_URL",
    "MAX_RETRIES",
    "NO_EXPECTED_START",
    "UP_STATE",
    "Connection",
    "GpupoolError",
    "printable",
    "shares_worth",
    "time_and_span",
    "time_of_day",
]
