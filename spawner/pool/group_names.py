"""Where the profiles and quotas files name each group: the one list both typo checks start from.

A misspelt group closes a profile to its members, or leaves them without their group's limits, and neither
file can tell. Which groups exist is known elsewhere: the host's group database where the hub's groups are the
host's (:mod:`..system_groups`), else the hub itself (the service's ``leasing.group_names``).
"""

from __future__ import annotations

from collections.abc import Iterable

from .profiles import Profile
from .quotas import QuotaPolicy


def named_groups(profiles: Iterable[Profile], quotas: QuotaPolicy | None) -> dict[str, str]:
    """Each group the files name, with where (the first place, profiles first):
    ``{"visoin": "profile vision is kept for group visoin"}``."""
    named = {
        group: f"profile {p.slug} is kept for group {group}" for p in profiles for group in sorted(p.groups)
    }
    for group in sorted(quotas.per_group if quotas is not None else ()):
        named.setdefault(group, f"the quotas file limits group {group}")
    return named
