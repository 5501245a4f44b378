"""GPU spawners for local processes: each server starts on the devices of a gpupool lease.

:class:`LocalGPUSpawner` is a :class:`~jupyterhub.spawner.LocalProcessSpawner` (system users);
:class:`SimpleLocalGPUSpawner` is the same without system users, for the embedded default and tests (a home
directory per user under ``home_root``). The lease lifecycle is :class:`.leasing.GpuLeasing`'s; here are the
spawn form and what a lease means for a local process:

- ``options_form``: every profile of ``profiles_file`` with live availability from the service;
  ``options_from_form`` turns the choice into ``{"profile": slug}``. A REST spawn sends that body itself.
- a granted lease puts ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` (the lease's
  ``GPU-…``/``MIG-…`` UUIDs; ``""`` and ``void`` for CPU only), ``GPUPOOL_LEASE_ID``, ``GPUPOOL_SERVICE_URL``
  and ``GPUPOOL_PROFILE`` into the server's environment; ``get_state`` keeps the lease id beside the pid.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jupyterhub.spawner import (  # type: ignore[import-untyped]
    LocalProcessSpawner,
    SimpleLocalProcessSpawner,
    set_user_setuid,
)
from traitlets import Bool, Unicode, default

from ..client import GpupoolError
from ..device_env import lease_env
from ..files.profiles_file import read_profiles
from ..limits import Cgroup, HostCgroups, Limits, server_group, this_host
from ..pool.environments import ENV_VAR
from ..pool.environments import FIELD as ENVIRONMENT
from ..system_groups import system_groups as groups_on_host
from ..user_accounts import AccountError, UserAccount, ensure_user_account, retire_user_account
from . import form
from .compat import SpawnException
from .environment_choice import environment_field_name, environment_of
from .lab_args import LabArgs
from .leasing import GpuLeasing
from .user_options import check_user_options


async def _render_options_form(spawner: LocalGPUSpawner) -> str:
    """``options_form`` as a callable: JupyterHub awaits it with the spawner each time the form is shown."""
    return await spawner.render_options_form()


class LocalGPUSpawner(GpuLeasing, LabArgs, LocalProcessSpawner):  # type: ignore[misc]  # jupyterhub is untyped
    """A local-process spawner that starts each server on the devices of a gpupool lease, in a control group
    with its profile's CPU and memory (:mod:`..limits`, when the hub runs as root).

    See the module docstring; configure the service with ``service_url`` and ``service_api_token`` and the
    form with ``profiles_file``.
    """

    _cgroup: Cgroup | None = None

    system_groups = Bool(
        True,
        config=True,
        help="""Count the user's system groups (e.g. ``gpu-users`` in ``/etc/group``) with their JupyterHub
        groups for profiles and quotas restricted to groups; give the service ``GPUPOOL_SYSTEM_GROUPS=1``
        so jobs count them too. False: JupyterHub groups only.""",
    )

    def get_env(self) -> dict[str, str]:
        """The lease's environment, and the chosen environment's: its ``bin`` first on ``PATH`` (so the server's
        ``jupyterhub-singleuser`` and ``python`` are that environment's) and its slug in
        ``GPUPOOL_ENVIRONMENT``, which a job submitted from the notebook can name."""
        env: dict[str, str] = super().get_env()
        chosen = environment_of(self.user_options or {}, self.resolve_profile())
        if chosen is not None:
            env[ENV_VAR] = chosen.slug
            if chosen.bin:
                env["PATH"] = f"{chosen.bin}:{env.get('PATH') or os.environ.get('PATH', '')}"
        return env

    @property
    def user_groups(self) -> list[str]:
        """The user's JupyterHub groups, and with ``system_groups`` their system groups."""
        groups = set(super().user_groups)
        if self.system_groups:
            groups |= groups_on_host(self.user.name)
        return sorted(groups)

    @default("options_form")
    def _default_options_form(self) -> Any:
        return _render_options_form

    @default("options_from_form")
    def _default_options_from_form(self) -> Any:
        return _profile_from_formdata

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Any:
        return check_user_options

    # ---- the form ----------------------------------------------------------------------------------------

    async def render_options_form(self) -> str:
        """The form's HTML with live availability and the user's quota; without the service it still lists
        every profile."""
        choices, simulated = await self.profile_choices()
        cgroups = host_cgroups_once()
        try:
            standing = await self.service().quota_summary(self.user.name, self.user_groups)
        except (GpupoolError, SpawnException) as error:
            self.log.warning("gpupool: no quota for the spawn form: %s", error)
            standing = ""
        note = "" if cgroups.enforced else cgroups.reason
        return form.render_form(choices, simulated=simulated, limits_note=note, standing=standing)

    # ---- limits ------------------------------------------------------------------------------------------

    def apply_lease(self, lease: Mapping[str, Any]) -> None:
        """The lease's environment, and a control group with the profile's CPU and memory to start in."""
        super().apply_lease(lease)
        profile = self.resolve_profile()
        self._cgroup = host_cgroups_once().create(
            server_group(str(lease["id"])), Limits(profile.cpu_milli, profile.memory_mib)
        )

    def make_preexec_fn(self, name: str) -> Callable[[], None]:
        """Join the server's control group while still root (its kernels are born in it), then become the
        user as the base spawner does."""
        become = self.preexec_as(name)
        cgroup = self._cgroup

        def preexec() -> None:
            if cgroup is not None:
                cgroup.add()
            become()

        return preexec

    def preexec_as(self, name: str) -> Callable[[], None]:
        """The base spawner's ``preexec_fn``: become ``name``'s system account."""
        return super().make_preexec_fn(name)  # type: ignore[no-any-return]

    async def end_leftovers(self) -> None:
        """End what is left in the server's control group and remove it: kernels run in sessions of their
        own, so a server that crashed or was killed leaves them behind, holding its memory and devices."""
        for lease_id in self.unreleased_leases():
            group = host_cgroups_once().group(server_group(lease_id))
            if group is not None and not await asyncio.to_thread(group.end):
                self.log.warning(
                    "gpupool: %s's control group still holds processes %s", self._log_name, group.pids()
                )


@functools.cache
def host_cgroups_once() -> HostCgroups:
    """This host's control groups, looked at (and gpupool's folders made) once per hub, saying in the log
    whether limits hold."""
    cgroups = this_host()
    cgroups.log(logging.getLogger("JupyterHub"), "gpupool: ")
    return cgroups


def _profile_from_formdata(formdata: Mapping[str, list[str]]) -> dict[str, Any]:
    """``options_from_form``: the form's radio, wall-time and the chosen profile's environment as
    ``{"profile": slug, "walltime": "4h", "environment": "pytorch"}`` (checked later, in one place)."""
    options = {}
    for field in (form.FIELD, form.WALLTIME):
        values = [v.strip() for v in formdata.get(field, []) if v.strip()]
        if values:
            options[field] = values[0]
    chosen = formdata.get(environment_field_name(options.get(form.FIELD, "")), [])
    if chosen and chosen[0].strip():
        options[ENVIRONMENT] = chosen[0].strip()  # the chosen profile's environment, not another row's
    return options


class SimpleLocalGPUSpawner(LocalGPUSpawner, SimpleLocalProcessSpawner):  # type: ignore[misc]  # untyped base
    """:class:`LocalGPUSpawner` without system users: each server runs in a home directory
    ``home_root/<username>``, as the hub's account, as ``run_as``, or (as root) as an account gpupool makes for
    each user (``account_per_user``). For the embedded hub and tests; a host whose users have system accounts
    wants :class:`LocalGPUSpawner`."""

    @default("system_groups")
    def _default_system_groups(self) -> bool:
        return False  # its users have no system accounts

    run_as = Unicode(
        "",
        config=True,
        help="""The system account every server runs as, e.g. ``"jupyter"``, so that no server runs as root;
        ``home_root`` must be that account's to write in. Users who share one account can read each other's
        files, processes and tokens: on a shared host use ``account_per_user``. Empty: the hub's own account.""",
    )

    account_per_user = Bool(
        False,
        config=True,
        help="""As root: run each user's server as a system account of their own, ``gp-<name>``, made at their
        first start (no password, no login shell), in ``home_root/<name>``, which only that account may enter;
        ``home_root`` itself is made root's (``0711``). What ``gpupool up`` sets when started as root; give the
        service ``GPUPOOL_JOB_ACCOUNT_PER_USER=1`` so jobs run as the same accounts.""",
    )

    home_root = Unicode(
        "/tmp/gpupool-homes",
        config=True,
        help="""The folder holding one home directory per user (made at spawn), e.g.
        ``c.SimpleLocalGPUSpawner.home_root = "/srv/gpupool/homes"``.""",
    )

    @default("home_dir_template")
    def _default_home_dir_template(self) -> str:
        return os.path.join(self.home_root, "{username}")

    _account: UserAccount | None = None

    async def start(self) -> Any:
        """With ``account_per_user``, make the user's account and home first (as the service does for jobs)."""
        if self.account_per_user:
            if self.run_as:
                raise SpawnException(
                    "SimpleLocalGPUSpawner: set run_as or account_per_user, not both",
                    reason="gpupool_config",
                    status_code=500,
                )
            try:
                self._account = await asyncio.to_thread(ensure_user_account, self.user.name, self.home_root)
            except AccountError as error:
                raise SpawnException(
                    f"cannot start {self.user.name}'s server: {error}",
                    reason="gpupool_account",
                    status_code=500,
                ) from None
        return await super().start()

    async def retire_account(self) -> None:
        """With ``account_per_user``, a deleted user's home goes to ``home_root/.deleted/`` and their account
        is retired, or a new user given the same name would get the old one's files."""
        if self.account_per_user and os.geteuid() == 0:
            left = await asyncio.to_thread(retire_user_account, self.user.name, self.home_root)
            if left:
                self.log.warning("gpupool: deleting %s: %s", self.user.name, left)

    def preexec_as(self, name: str) -> Callable[[], None]:
        """Become the user's own account (``account_per_user``) or ``run_as`` when set, then make the home,
        private, and enter it."""
        account = self._account.name if self.account_per_user and self._account else self.run_as
        if not account:
            return super().preexec_as(name)
        become = set_user_setuid(account, chdir=False)
        home = self.home_dir

        def preexec() -> None:
            become()
            os.makedirs(home, 0o700, exist_ok=True)
            os.chdir(home)

        return preexec


__all__: Sequence[str] = ("LocalGPUSpawner", "SimpleLocalGPUSpawner", "lease_env", "read_profiles")
