"""The hub's log keeps a traceback for what went wrong in gpupool or the hub, and only a sentence for a spawn
refused for the user's own mistake (the end-to-end check is in ``test_local_spawner``)."""

from __future__ import annotations

import io
import logging

from gpupool.spawner.hub.compat import SpawnException
from gpupool.spawner.hub.refusal_log import log_refusals_in_one_line


def _logged(error: Exception) -> str:
    logger, out = logging.getLogger(f"hub-{id(error)}"), io.StringIO()
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(out))
    log_refusals_in_one_line(logger)
    log_refusals_in_one_line(logger)  # every spawner asks; one filter
    assert len(logger.filters) == 1
    try:
        raise error
    except Exception:
        logger.error("Failed to spawn %s's server", "dave", exc_info=True)
    return out.getvalue()


def test_a_refused_profile_is_one_line_naming_it() -> None:
    said = _logged(SpawnException("unknown profile 'nope'; choose one of cpu", reason="unknown_profile"))
    assert said.count("\n") == 1 and "Traceback" not in said
    assert "Failed to spawn dave's server: 400" in said and "unknown profile 'nope'" in said


def test_a_failure_that_is_not_the_users_keeps_its_traceback() -> None:
    for error in (SpawnException("the pool is gone", reason="gone", status_code=503), KeyError("lease")):
        said = _logged(error)
        assert "Traceback" in said and said.startswith("Failed to spawn dave's server\n"), said
