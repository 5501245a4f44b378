"""JupyterHub's ``apply_user_options`` hook for gpupool's spawners: a spawn's options are checked before
anything starts, so a bad one is a 400 naming it rather than a failed spawn."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import form
from .compat import SpawnException
from .queue_wait import fit_start_timeout

if TYPE_CHECKING:
    from .leasing import GpuLeasing


def check_user_options(spawner: GpuLeasing, user_options: Mapping[str, Any]) -> None:
    """``apply_user_options``: refuse an unknown or forbidden profile, an environment it does not offer or a
    wall-time past its lifetime, before anything starts; give the spawn its profile's queue wait."""
    profile = spawner.resolve_profile(user_options)
    try:
        form.lease_options(user_options, profile)
    except (ValueError, LookupError) as error:  # a bad walltime, an unknown environment
        raise SpawnException(str(error), reason="bad_user_options", status_code=400) from error
    fit_start_timeout(spawner, profile)
