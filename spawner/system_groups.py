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
