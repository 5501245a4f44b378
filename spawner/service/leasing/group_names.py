"""Group names the profiles and quotas files use that the hub does not know: said when the hub first answers,
and again for the quotas file each time it is read again.

A misspelt group in the quotas file (``studnets``) leaves that group's members without its limits, and in the
profiles file closes the profile to everyone, both without a word (``pool.group_names``). Where the groups are
the hub's (JupyterHub groups, not the host's: see ``system_groups``, checked at start), only the hub knows
them, and only once it is up, so the service asks it (``GET groups``, the scope ``list:groups``). Groups made
later through the hub's API are fine: the warning says "yet?".
"""

from __future__ import annotations

import asyncio
import logging

from .reconcile import HubClient, HubError

log = logging.getLogger(__name__)


def unknown_to_hub(named: dict[str, str], hub_groups: set[str]) -> list[str]:
    """The lines to warn with: each named group the hub does not have."""
    return [f"{where}, which is not a JupyterHub group (yet?): a misspelling?" for g, where in named.items()
            if g not in hub_groups]  # fmt: skip


async def warn_of_unknown_groups(hub: HubClient, named: dict[str, str], retry_s: float = 10.0) -> None:
    """Ask the hub for its groups until it answers, then warn once for each name it lacks."""
    if not named:
        return
    while True:
        try:
            groups = await hub.group_names()
            break
        except HubError as error:
            if error.status == 403:  # a hub whose role for the service lacks list:groups: nothing to check
                log.info("group names not checked: the service's token may not list the hub's groups")
                return
            await asyncio.sleep(retry_s)
    for line in unknown_to_hub(named, groups):
        log.warning("%s", line)
