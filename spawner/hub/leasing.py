"""The lease half of gpupool's spawners: ask the service for devices, wait in its queue, give them back.

:class:`GpuLeasing` is mixed into a JupyterHub spawner class (``LocalProcessSpawner`` in :mod:`.spawner`,
``KubeSpawner`` in :mod:`.kube_spawner`); it never picks a device itself, the service's lease names them.

Lifecycle contract, on top of JupyterHub's:

- ``apply_user_options`` (:mod:`.user_options`; again in ``start``): resolve the ``profile`` slug (none: the
  default profile); an unknown one is a 400 listing the slugs the user may start, a forbidden one a 403.
- ``start()``: release any lease the service still holds for this server (a crash left it), then create a
  lease; while it is queued, poll it every ``lease_poll_interval`` seconds and report the queue position
  through ``progress()``. A service that does not answer (restarting: it restores the queue from its store)
  is waited for. Give up after the profile's ``queue_wait`` (:mod:`.queue_wait`), else shortly before
  ``start_timeout``, releasing the lease, saying what it waited for. Once granted,
  :meth:`GpuLeasing.apply_lease` pins the server to it and the base spawner starts it.
- ``get_state``/``load_state`` keep the lease id beside the base spawner's state: a restarted hub knows it.
- ``stop()``, or a ``poll()`` that finds the server gone: what the server left running on the lease's devices
  is ended (:meth:`GpuLeasing.end_leftovers`), then the lease is released, once per spawner (a repeated
  release changes nothing, so a hub restart between them is harmless). ``clear_state`` keeps an unreleased one.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from jupyterhub.spawner import Spawner  # type: ignore[import-untyped]
from traitlets import Float, Unicode, default, validate

from ..client import Availability, GpupoolError, ServiceClient
from ..client.connection import loopback
from ..device_env import lease_env
from ..files.profiles_file import EXAMPLE_PROFILES, read_profiles
from ..names import SERVICE_PREFIX
from ..pool.profiles import Profile, UnknownProfile
from . import form
from .compat import SpawnException
from .queue_wait import queue_deadline
from .refusal_log import log_refusals_in_one_line

TOKEN_ENV = "GPUPOOL_API_TOKEN"
_STATE_KEY = "gpupool_lease_id"
# retiring a deleted user waits for their jobs to stop: the service's grace period (30 s unless set) and more
RETIRE_TIMEOUT_S = 120.0
# a deletion the service missed (it was down) is asked again this often, for this long; kept in the hub's memory
RETIRE_RETRY_S = 10.0
RETIRE_RETRY_FOR_S = 24 * 3600.0
_SERVICE_DOWN = (0, 502, 503, 504)  # unreachable, or the proxy's answer while the service is down
# deleted users the service is asked about again, by name: when the latest of them was deleted, and the task
_RETIRING_LATER: dict[str, tuple[float, asyncio.Task[None]]] = {}


class GpuLeasing(Spawner):  # type: ignore[misc]  # jupyterhub is untyped: its classes are Any
    """The lease half of a GPU spawner, put before a concrete spawner class among the bases, e.g.
    ``class LocalGPUSpawner(GpuLeasing, LocalProcessSpawner)``. A subclass says what a granted lease means for
    its servers in :meth:`apply_lease`; the rest (asking, queueing with progress events, keeping the lease in
    the state, releasing it exactly once) is here."""

    service_url = Unicode(
        config=True,
        help=f"""The gpupool service's base URL (its prefix, with a trailing slash), as the hub reaches it.

        Default: the proxy's public URL (a wildcard host becomes 127.0.0.1) plus ``{SERVICE_PREFIX}``, which
        suits the embedded hub. Set it to the service's own address to skip the proxy::

            c.LocalGPUSpawner.service_url = "http://127.0.0.1:10101{SERVICE_PREFIX}"  # or c.KubeGPUSpawner

        It is also what the single-user server gets in ``GPUPOOL_SERVICE_URL``.""",
    )

    service_api_token = Unicode(
        config=True,
        help=f"""The hub's API token for the gpupool service: a JupyterHub service token whose role grants
        ``custom:gpupool:leases`` (create and release leases for any user). Default: ``${TOKEN_ENV}``.
        For example::

            c.JupyterHub.services.append({{"name": "gpupool-spawner", "api_token": token}})
            c.JupyterHub.load_roles.append({{"name": "gpupool-spawner", "services": ["gpupool-spawner"],
                "scopes": ["custom:gpupool:leases", "access:services!service=gpupool"]}})
            c.LocalGPUSpawner.service_api_token = token  # or c.KubeGPUSpawner""",
    )

    profiles_file = Unicode(
        str(EXAMPLE_PROFILES),
        config=True,
        help="""The profiles file (YAML) the spawn form offers; give the service the same file
        (``GPUPOOL_PROFILES``; ``gpupool up`` gives it this one, checked before the hub starts)::

            c.LocalGPUSpawner.profiles_file = "/etc/gpupool/profiles.yaml"

        Default: the shipped example, ``hub_config/profiles.yaml``.""",
    )

    lease_poll_interval = Float(
        1.0,
        config=True,
        help="""Seconds between looks at a queued lease while a spawn waits for free devices, e.g. ``2.5``.
        Each look is one cheap API call; the wait ends after the profile's ``queue_wait``, else shortly
        before ``start_timeout``.""",
    )

    lease_id = Unicode("", help="The gpupool lease this server holds ('' when none); kept in the state.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        log_refusals_in_one_line(self.log)  # the hub's logger: a refused spawn is a sentence, not a traceback
        self._lease_env: dict[str, str] = {}
        self._released: set[str] = set()
        self._unreleased: set[str] = set()  # leases clear_state took off lease_id before they were released
        self._events: list[dict[str, Any]] = []
        self._starting, self._granted = False, False  # granted: this start's lease is, the base's start runs

    # ---- configuration ---------------------------------------------------------------------------------

    @default("service_url")
    def _default_service_url(self) -> str:
        proxy = (self.user.settings or {}).get("proxy") if self.user is not None else None
        public = getattr(proxy, "public_url", "") or "http://127.0.0.1:8000/"
        return loopback(public.rstrip("/") + SERVICE_PREFIX)

    @validate("service_url")
    def _validate_service_url(self, proposal: dict[str, Any]) -> str:
        url = str(proposal["value"])
        if urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"service_url must be an http(s) URL, not {url!r}")
        return url.rstrip("/") + "/"

    @default("service_api_token")
    def _default_service_api_token(self) -> str:
        return os.environ.get(TOKEN_ENV, "")

    @validate("profiles_file")
    def _validate_profiles_file(self, proposal: dict[str, Any]) -> str:
        read_profiles(str(proposal["value"]))  # fail now, naming the file and the field
        return str(proposal["value"])

    @validate("lease_poll_interval")
    def _validate_poll_interval(self, proposal: dict[str, Any]) -> float:
        value = float(proposal["value"])
        if value <= 0:
            raise ValueError(f"lease_poll_interval must be more than 0 seconds, not {value}")
        return value

    # ---- profiles ----------------------------------------------------------------------------------------

    @property
    def profiles(self) -> tuple[Profile, ...]:
        return read_profiles(self.profiles_file)

    @property
    def user_groups(self) -> list[str]:
        return sorted(group.name for group in self.user.groups)

    async def profile_choices(self) -> tuple[list[form.ProfileChoice], bool]:
        """Every profile with this user's permission and the pool's live availability, and whether the pool is
        simulated; without the service, every profile with nothing known free."""
        try:
            live = await self.service().availability(self.user.name, self.user_groups)
        except (GpupoolError, SpawnException) as error:
            self.log.warning("gpupool: no availability for the spawn form: %s", error)
            live = Availability({}, {}, "")
        choices = form.from_service(self.profiles, self.user_groups, bool(self.user.admin), live, time.time())
        return choices, live.simulated

    def service(self) -> ServiceClient:
        """A client of the service with the hub's token; a missing token is a clear error."""
        if not self.service_api_token:
            raise SpawnException(
                f"gpupool is not configured: set c.{type(self).__name__}.service_api_token (or ${TOKEN_ENV}) "
                "to a hub service token with the custom:gpupool:leases scope",
                reason="gpupool_config",
                status_code=500,
            )
        return ServiceClient(self.service_url, self.service_api_token)

    def resolve_profile(self, user_options: Mapping[str, Any] | None = None) -> Profile:
        """The profile ``user_options`` names (the default profile when it names none); raises a
        :class:`SpawnException` (400 unknown slug, 403 not for this user's groups) the user can read."""
        options = dict(self.user_options if user_options is None else user_options)
        profiles = self.profiles
        groups, admin = self.user_groups, bool(self.user.admin)
        if form.FIELD not in options:
            usable = [p for p in profiles if p.visible_to(groups, admin)]
            chosen = next((p for p in usable if p.default), usable[0] if usable else None)
            options[form.FIELD] = chosen.slug if chosen else ""
        try:
            return form.profile_from_form(form.formdata_from_body(options), profiles, groups, admin)
        except UnknownProfile as error:
            raise SpawnException(str(error), reason="unknown_profile", status_code=400) from error
        except PermissionError as error:
            raise SpawnException(str(error), reason="profile_forbidden", status_code=403) from error

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore the base spawner's state and the lease after a hub restart."""
        super().load_state(state)
        self.lease_id = str(state.get(_STATE_KEY) or "")

    def get_state(self) -> dict[str, Any]:
        """The base spawner's state and the lease id, so a restarted hub can release the lease later."""
        state: dict[str, Any] = super().get_state()
        if self.lease_id:
            state[_STATE_KEY] = self.lease_id
        return state

    def clear_state(self) -> None:
        """Forget the state and the lease; a lease not yet released stays queued for :meth:`release_lease`."""
        super().clear_state()
        if self.lease_id and self.lease_id not in self._released:
            self._unreleased.add(self.lease_id)
        self.lease_id = ""
        self._lease_env = {}

    def get_env(self) -> dict[str, str]:
        """The base spawner's environment plus the lease's (set by :meth:`apply_lease`)."""
        env: dict[str, str] = super().get_env()
        env.update(self._lease_env)
        return env

    def _emit(self, message: str, progress: int | None = None) -> None:
        extra = {"progress": progress} if progress is not None else {}
        self._events.append({"message": message, **extra})

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """Events from :meth:`start` up to the grant: the lease request, each change of queue position, the
        grant itself. A subclass may follow them with its base spawner's own (see :mod:`.kube_spawner`)."""
        sent = 0
        while True:
            while sent < len(self._events):
                yield self._events[sent]
                sent += 1
            if not self._starting or self._granted:
                return
            await asyncio.sleep(min(0.25, self.lease_poll_interval))

    def apply_lease(self, lease: Mapping[str, Any]) -> None:
        """Make the server use ``lease`` (a granted service ``LeaseOut``); called by :meth:`start` before the
        base spawner starts. The default sets the lease's environment (:func:`lease_env`)."""
        self._lease_env = lease_env(lease, self.service_url)

    async def start(self) -> Any:
        """Lease devices (waiting in the queue if need be), apply the lease, start the server."""
        self._events = []
        self._starting = True
        self._granted = False
        try:
            await self.release_lease()  # anything a previous run left behind
            profile = self.resolve_profile()
            service = self.service()
            await self._release_leftovers(service)
            self._emit(f"Asking gpupool for {profile.title()}", 10)
            lease = await self._lease(service, profile)
            self.apply_lease(lease)
            devices = ", ".join(d["label"] for d in lease["devices"]) or "no GPU"
            note = str((lease.get("kubernetes") or {}).get("note") or "")  # e.g. a cap nothing enforces
            self._emit(f"Granted {devices}; starting the server" + (f" ({note})" if note else ""), 60)
            self._granted = True
            try:
                return await super().start()
            except BaseException:
                await self.release_lease()
                raise
        finally:
            self._starting = False

    async def _release_leftovers(self, service: ServiceClient) -> None:
        """Release every active lease the service holds for this server before asking for a new one: a killed
        hub forgets a queued lease's id, a killed service keeps a lease the spawner could not release, and
        reconciliation would not release it while this start is pending. The hub runs one start per server at
        a time, so none of them is a live start's. An unreachable service is left to the next request."""
        try:
            leases = await service.active_leases(self.user.name)
        except GpupoolError as error:
            self.log.warning("gpupool: could not list %s's leases before starting: %s", self._log_name, error)
            return
        mine = [
            str(lease["id"])
            for lease in leases
            if lease.get("user") == self.user.name
            and lease.get("owner_kind") == "server"
            and lease.get("owner_name") == self.name
        ]
        for lease_id in mine:
            self.log.warning("gpupool: %s left lease %s behind; releasing it", self._log_name, lease_id)
            self._unreleased.add(lease_id)
        await self.release_lease()

    async def _lease(self, service: ServiceClient, profile: Profile) -> dict[str, Any]:
        """A granted lease for ``profile``, or an error after releasing whatever was asked for."""
        loop = asyncio.get_running_loop()
        waited = queue_deadline(self, profile, margin=max(2.0, self.lease_poll_interval))
        deadline = loop.time() + waited
        lease = await self._create(service, profile, deadline)
        self.lease_id = str(lease["id"])
        said, down = "", False
        try:
            while lease["state"] == "queued":
                message = lease.get("waiting_message") or f"Waiting for {profile.gpu_description()}"
                if message != said:
                    self._emit(message)
                    said = message
                if loop.time() >= deadline:
                    raise SpawnException(
                        f"Gave up after {waited:g}s in the queue for {profile.display_name} "
                        f"({message}); try again later or choose another profile",
                        reason="gpupool_queue_timeout",
                        status_code=503,
                    )
                await asyncio.sleep(self.lease_poll_interval)
                try:
                    lease = await service.get_lease(self.lease_id)
                except GpupoolError as error:
                    down = self._waiting_for_service(error, down)  # any other answer ends the wait
                    continue
                down = False
            if lease["state"] != "granted":
                raise SpawnException(
                    f"The lease for {profile.display_name} ended before it was granted: "
                    f"{lease.get('release_reason') or lease['state']}",
                    reason="gpupool_lease_released",
                    status_code=503,
                )
        except BaseException:
            await self.release_lease()
            raise
        return lease

    async def _create(self, service: ServiceClient, profile: Profile, deadline: float) -> dict[str, Any]:
        """Ask for the lease; while the service is down (restarting), wait for it until ``deadline``."""
        down = False
        while True:
            try:
                asks = form.lease_options(self.user_options, profile) | {"admin": bool(self.user.admin)}
                return await service.create_lease(
                    *(self.user.name, self.user_groups, profile.slug), owner_name=self.name, **asks
                )
            except GpupoolError as error:
                if error.status not in _SERVICE_DOWN or asyncio.get_running_loop().time() >= deadline:
                    raise self._refused(error) from error
                down = self._waiting_for_service(error, down)
            await asyncio.sleep(self.lease_poll_interval)
            await self._release_leftovers(service)  # in case the lost answer's lease was made after all

    def _waiting_for_service(self, error: GpupoolError, said: bool) -> bool:
        """A service that does not answer is restarting (it restores its leases and queue): say so once and
        wait on. Any other error is raised."""
        if error.status not in _SERVICE_DOWN:
            raise error
        if not said:
            self.log.warning("gpupool: %s: %s; waiting for it", self._log_name, error)
            self._emit("The gpupool service is not answering; waiting for it")
        return True

    @staticmethod
    def _refused(error: GpupoolError) -> SpawnException:
        status = error.status if error.status in (400, 403, 409) else 503
        said = form.refusal_text(error.detail, error.error)
        return SpawnException(f"gpupool: {said}", reason=f"gpupool_{error.error}", status_code=status)

    def unreleased_leases(self) -> list[str]:
        """The current lease and any that :meth:`clear_state` set aside, not yet released."""
        return sorted((self._unreleased | {self.lease_id}) - self._released - {""})

    async def release_lease(self) -> None:
        """Release each of :meth:`unreleased_leases` once; an error is
        logged and the lease kept for the next attempt (the service's reconciliation is the last resort)."""
        for lease_id in self.unreleased_leases():
            try:
                await self.service().release_lease(lease_id)
            except (GpupoolError, SpawnException) as error:
                if not (isinstance(error, GpupoolError) and error.status == 404):  # a 404: released already
                    self.log.error("gpupool: could not release lease %s: %s", lease_id, error)
                    continue
            self.log.info("gpupool: released lease %s of %s", lease_id, self._log_name)
            self._released.add(lease_id)
            self._unreleased.discard(lease_id)

    async def poll(self) -> int | None:
        """JupyterHub's poll; a server found gone also releases its lease."""
        status: int | None = await super().poll()
        if status is not None and not self._starting:
            await self._hand_back()
        return status

    async def stop(self, now: bool = False) -> None:
        """Stop the server as the base spawner does, then release the lease, unless the base spawner stops
        within its own start (KubeSpawner so clears a leftover pod of the server's name): that keeps it."""
        try:
            await super().stop(now=now)
        finally:
            if not (self._starting and self._granted):
                await self._hand_back()

    async def delete_forever(self) -> None:
        """The hub deletes the user: the service cancels their jobs, releases what they held and files their
        records away, holding out new ones, while the base spawner and :meth:`retire_account` do their part;
        then it is asked again, for anything made meanwhile. Once per user (the default server's spawner).

        JupyterHub deletes the user whatever this does, so a service that does not answer is asked again
        every ``RETIRE_RETRY_S`` until it does: their jobs would otherwise run on, and be the next user given
        the name's."""
        if not self.name:
            await self._retire_in_service(hold=True)
        try:
            base = super().delete_forever()  # JupyterHub's is a plain function; a base spawner's may be async
            if inspect.isawaitable(base):
                await base
            if not self.name:
                await self.retire_account()
        finally:
            if not self.name and not await self._retire_in_service(hold=False):
                self._retire_when_the_service_answers(time.time())

    async def retire_account(self) -> None:
        """What else of a deleted user goes once the service has ended their jobs. Nothing here; a spawner
        that made them a system account overrides it."""

    async def _retire_in_service(self, *, hold: bool) -> bool:
        """Ask the service to retire the user; whether it answered (a refusal is logged as answered)."""
        try:
            retired = await self._retirement_client().retire_user(self.user.name, hold=hold)
        except GpupoolError as error:
            self.log.error("gpupool: deleting %s: the service did not retire them: %s", self.user.name, error)
            return not _worth_asking_again(error)
        self._log_retired(retired)
        return True

    def _retire_when_the_service_answers(self, deleted_at: float) -> None:
        """Ask again in the background; only for what was made before ``deleted_at``, since the name may be
        given to a newcomer meanwhile, whose servers and jobs are theirs. The name deleted again meanwhile
        moves that time on, for one task."""
        name = self.user.name
        if name in _RETIRING_LATER:
            _RETIRING_LATER[name] = (max(deleted_at, _RETIRING_LATER[name][0]), _RETIRING_LATER[name][1])
            return
        self.log.warning("gpupool: deleting %s: asking the service again every %g s", name, RETIRE_RETRY_S)
        task = asyncio.get_running_loop().create_task(self._retire_later(name))
        _RETIRING_LATER[name] = (deleted_at, task)
        task.add_done_callback(lambda _: _RETIRING_LATER.pop(name, None))

    async def _retire_later(self, name: str) -> None:
        service = self._retirement_client()
        give_up = time.monotonic() + RETIRE_RETRY_FOR_S
        while time.monotonic() < give_up:
            await asyncio.sleep(RETIRE_RETRY_S)
            try:
                retired = await service.retire_user(name, before=_RETIRING_LATER[name][0])
            except GpupoolError as error:
                if _worth_asking_again(error):
                    continue
                self.log.error("gpupool: deleting %s: the service refused to retire them: %s", name, error)
                return
            except Exception:  # a task's error is otherwise only "never retrieved", at the loop's end
                self.log.exception("gpupool: deleting %s: asking the service again failed", name)
                return
            self._log_retired(retired)
            return
        self.log.error(
            "gpupool: deleting %s: the service did not answer for %g hours; their jobs may still run",
            name,
            RETIRE_RETRY_FOR_S / 3600,
        )

    def _retirement_client(self) -> ServiceClient:
        return ServiceClient(self.service_url, self.service_api_token, timeout=RETIRE_TIMEOUT_S)

    def _log_retired(self, retired: Mapping[str, Any]) -> None:
        level = self.log.warning if retired["still_running"] else self.log.info
        level(
            "gpupool: deleting %s: %d jobs cancelled (%d still running), %d leases released, records kept as %r",
            retired["user"],
            retired["jobs_cancelled"],
            retired["still_running"],
            retired["leases_released"],
            retired["records_filed_as"],
        )

    async def end_leftovers(self) -> None:
        """End what the server left running on its lease's devices, before the lease goes to someone else.
        Nothing here; a spawner that can find such processes overrides it."""

    async def _hand_back(self) -> None:
        try:  # ended first: the lease's devices go to the next user only once nothing of this server holds them
            await self.end_leftovers()
        finally:
            await self.release_lease()


def _worth_asking_again(error: GpupoolError) -> bool:
    """Whether the service was down (ask again later), not refusing (a wrong token's 403 stays one)."""
    return error.status in _SERVICE_DOWN
