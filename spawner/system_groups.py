"""A user's groups in this host's group database (``/etc/group``, or LDAP through NSS), by name.

On one lab server the groups an admin already keeps, such as ``gpu-users``, are the ones profiles and quotas
name. The hub's spawner and the service count them beside the user's JupyterHub groups when configured to
(``LocalGPUSpawner.system_groups``, the service's ``system_groups``).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
from collections.abc import Callable, Iterable

from .pool.group_names import named_groups
from .pool.profiles import Profile
from .pool.quotas import QuotaPolicy


def _is_group(name: str) -> bool:
    return _found(grp.getgrnam, name)


def _is_user(name: str) -> bool:
    return _found(pwd.getpwnam, name)


def _found(lookup: Callable[[str], object], name: str) -> bool:
    try:
        lookup(name)
    except KeyError:
        return False
    return True


def system_groups(user: str) -> frozenset[str]:
    """The names of the groups ``user``'s system account belongs to, primary group included; empty when the
    user has no system account here."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return frozenset()
    names = set()
    for gid in os.getgrouplist(user, entry.pw_gid):
        with contextlib.suppress(KeyError):  # a gid without a name in the group database
            names.add(grp.getgrgid(gid).gr_name)
    return frozenset(names)


def unknown_names(profiles: Iterable[Profile], quotas: QuotaPolicy | None) -> list[str]:
    """What the profiles and quotas files name that this host does not know, in words (``profile h100 is kept
    for group visoin, which is not a group on this host``): a typo there closes a profile or lifts a limit
    without a word. Only worth saying where the host's groups and accounts are the hub's (system_groups)."""
    not_here = "which is not a group on this host (nor a JupyterHub group yet?)"
    said = [
        f"{where}, {not_here}"
        for group, where in named_groups(profiles, quotas).items()
        if not _is_group(group)
    ]
    if quotas is not None:
        said += [
            f"the quotas file limits user {user}, who has no account on this host"
            for user in sorted(quotas.user_overrides)
            if not _is_user(user)
        ]
    return said
