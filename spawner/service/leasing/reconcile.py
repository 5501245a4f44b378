"""Reconciliation: the leases kept in step with the servers the hub really runs, at start-up and every minute.

A lease outlives its server when the hub or the service died at the wrong moment (a ``kill -9`` mid-spawn,
a stop whose release never arrived). A server outlives its lease when the lease was released by hand, or
the store was replaced. Each pass compares the two pictures:

- a lease held for a server (``owner_kind`` "server", queued or granted) whose user's named server is neither
  ready nor pending in the hub, in this pass and the one before, is released with reason ``"server gone"``.
  Two consecutive passes, so that a spawn or a stop that was under way between two reads never loses its
  lease; the spawner's own release of a stopping server makes a second release a no-op anyway;
- a ready server that chose a gpupool profile (``user_options.profile`` in the hub's server model) and holds
  no active lease is *unleased*: it is reported and logged as a warning. Stopping it is a decision for an
  operator: only with ``stop_unleased=True`` (``GPUPOOL_STOP_UNLEASED=1``), and only once it has been
  unleased for two consecutive passes, is it stopped with ``DELETE /hub/api/users/{user}/servers/{name}``;
- leases held for jobs (``owner_kind`` "job") are not the hub's and are left alone, but a user who holds any
  lease and whom the hub no longer has (``GET users/{name}`` answers 404), in this pass and the one before, is
  handed to ``retire_missing`` (the service's :func:`~..retirement.retire`): their jobs go on otherwise, for
  whoever is given the name next, where the hub never asked the service to retire them (a deletion whose
  asking ended with a hub restart; ``delete_invalid_users``, which deletes without the spawners).

A pass that cannot read the hub changes nothing (:class:`HubError`): an unanswered hub never looks like a hub
with no servers.

Scopes, granted to the service in a JupyterHub role (``gpupool.spawner.hub.up.roles`` does it for the
embedded hub)::

    {"name": "gpupool-service", "services": ["gpupool"],
     "scopes": ["list:users", "read:servers"]}          # + "delete:servers" for stop_unleased,
                                                         # + "list:groups" for .group_names' check

The service calls the hub with its own ``JUPYTERHUB_API_TOKEN``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from ...pool.leases import Lease
from .lease_manager import LeaseManager

log = logging.getLogger(__name__)

SERVER_GONE = "server gone"
PAGINATION = "application/jupyterhub-pagination+json"


class HubError(RuntimeError):
    """The hub could not be asked (unreachable, or refused the token or a scope); the pass changes nothing.
    ``status`` is the hub's answer, None when it did not answer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class HubServer:
    """One of a user's active servers as the hub describes it."""

    user: str
    name: str  # "" is the default server
    ready: bool
    pending: str | None  # "spawn", "stop", … while a start or stop is under way
    profile: str | None  # ``user_options.profile``: a gpupool profile was chosen

    @property
    def key(self) -> tuple[str, str]:
        return (self.user, self.name)

    @property
    def label(self) -> str:
        return f"{self.user}/{self.name}" if self.name else f"{self.user}'s default server"


class HubClient:
    """What reconciliation asks the hub: the active servers, and (on request) to stop one."""

    def __init__(self, api_url: str, token: str, *, timeout: float = 10.0, page_size: int = 200) -> None:
        self.api_url = api_url.rstrip("/")
        self.page_size = page_size
        self._sees_every_user_now: bool | None = None
        self._client = httpx.AsyncClient(timeout=timeout, headers={"Authorization": f"token {token}"})

    async def aclose(self) -> None:
        await self._client.aclose()

    async def active_servers(self) -> list[HubServer]:
        """Every ready or pending server of every user (``GET users?state=active``)."""
        return [server for user in await self._every("/users", state="active") for server in _servers(user)]

    async def user_exists(self, name: str) -> bool:
        """Whether the hub has user ``name`` (``GET users/{name}``, which ``read:servers`` may ask). HubError
        unless this token sees every user: JupyterHub answers 404 for a user outside a filtered scope
        (``read:servers!group=…``) too, which must not read as a user gone."""
        if not await self.sees_every_user():
            raise HubError("the service's token may not read every user (an unfiltered read:servers)")
        response = await self._request("GET", f"/users/{quote(name, safe='')}")
        if response.status_code in (200, 404):
            return response.status_code == 200
        raise HubError(f"the hub answered {response.status_code} to GET users/{name}", response.status_code)

    async def sees_every_user(self) -> bool:
        """Whether this token holds one of the scopes ``GET users/{name}`` takes, unfiltered (``GET user``
        lists the token's scopes; asked once: a token's roles change only with a hub restart)."""
        if self._sees_every_user_now is None:
            scopes = set((await self._get_json("/user")).get("scopes") or ())
            self._sees_every_user_now = bool(scopes & {"read:users", "read:users:name", "read:servers"})
            if not self._sees_every_user_now:
                log.warning(
                    "the service's token may not read every hub user (it needs read:servers, unfiltered): users "
                    "the hub deletes without asking the service are not retired, and an admin's misspelt user "
                    "name gets an empty answer"
                )
        return self._sees_every_user_now

    async def group_names(self) -> set[str]:
        """Every JupyterHub group's name (``GET groups``; the scope ``list:groups``)."""
        return {str(group["name"]) for group in await self._every("/groups")}

    async def _every(self, path: str, **params: str) -> list[dict[str, Any]]:
        """Every item of a paginated list, page by page."""
        found: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = await self._get_json(
                path,
                params={**params, "offset": offset, "limit": self.page_size},
                headers={"Accept": PAGINATION},
            )
            items, following = _page(page)
            found.extend(items)
            if following is None or not items:
                return found
            offset = following

    async def stop_server(self, user: str, name: str) -> None:
        """``DELETE users/{user}/servers/{name}``: asks the hub to stop it (the scope ``delete:servers``)."""
        path = f"/users/{quote(user, safe='')}/server"
        if name:
            path = f"/users/{quote(user, safe='')}/servers/{quote(name, safe='')}"
        response = await self._request("DELETE", path)
        if response.status_code not in (202, 204, 404):
            raise HubError(f"the hub answered {response.status_code} stopping {user}/{name}: {response.text}")

    async def _get_json(self, path: str, **options: Any) -> Any:
        response = await self._request("GET", path, **options)
        if response.status_code != 200:
            raise HubError(
                f"the hub answered {response.status_code} to GET {path}: {response.text[:300]}",
                response.status_code,
            )
        return response.json()

    async def _request(self, method: str, path: str, **options: Any) -> httpx.Response:
        try:
            return await self._client.request(method, f"{self.api_url}{path}", **options)
        except httpx.HTTPError as error:
            raise HubError(f"cannot reach the hub at {self.api_url}: {error!r}") from error


def _page(answer: Any) -> tuple[list[dict[str, Any]], int | None]:
    """The items of one page and the offset of the next (None at the end); a plain list is one last page."""
    if isinstance(answer, list):
        return answer, None
    following = (answer.get("_pagination") or {}).get("next")
    return list(answer.get("items") or ()), (int(following["offset"]) if following else None)


def _servers(user: dict[str, Any]) -> Iterable[HubServer]:
    for name, model in (user.get("servers") or {}).items():
        options = model.get("user_options") or {}
        profile = options.get("profile") if isinstance(options, dict) else None
        yield HubServer(
            user=str(user["name"]),
            name=str(name),
            ready=bool(model.get("ready")),
            pending=model.get("pending") or None,
            profile=str(profile) if profile else None,
        )


@dataclass(frozen=True)
class ReconcileReport:
    """What one pass found and did; pass it back as ``previous`` to the next pass."""

    released: tuple[Lease, ...] = ()  # released now: their server was gone in this pass and the one before
    suspects: frozenset[str] = frozenset()  # ids of leases whose server is gone in this pass only
    unleased: tuple[HubServer, ...] = ()  # ready servers with a gpupool profile and no active lease
    stopped: tuple[HubServer, ...] = ()  # unleased servers stopped now (only with stop_unleased)
    servers: tuple[HubServer, ...] = field(default=(), repr=False)  # what the hub listed
    missing: frozenset[str] = frozenset()  # users holding leases whom the hub does not have, in this pass
    retired: tuple[str, ...] = ()  # of those, the ones missing in the pass before too: retired now

    @property
    def unleased_keys(self) -> frozenset[tuple[str, str]]:
        return frozenset(server.key for server in self.unleased)


RetireMissing = Callable[[str, float], Awaitable[object]]
"""Retire a user the hub no longer has, with what they had before the given time (epoch s)."""


async def reconcile_once(
    manager: LeaseManager,
    hub: HubClient,
    *,
    previous: ReconcileReport | None = None,
    stop_unleased: bool = False,
    retire_missing: RetireMissing | None = None,
) -> ReconcileReport:
    """One pass (see the module's description); raises :class:`HubError`, having changed nothing, when the
    hub cannot be read. ``previous`` is the last pass's report: only what it already found is acted on."""
    previous = previous or ReconcileReport()
    # Leases first, then the hub: a lease read here was asked for before the listing, so the server that
    # asked for it (pending from before its lease existed) is in the listing unless it is really gone.
    before = await asyncio.to_thread(manager.all_leases, active_only=True)
    servers = await hub.active_servers()
    after = await asyncio.to_thread(manager.all_leases, active_only=True)
    missing, asked_at, checked = frozenset[str](), time.time(), set[str]()
    if retire_missing is not None:
        checked = {lease.user for lease in before} - {s.user for s in servers}
        missing = await _missing_users(hub, checked)

    present = {server.key for server in servers if server.ready or server.pending}
    suspects, released = await _release_gone(manager, before, present, previous)
    leased = {(lease.user, lease.owner_name) for lease in [*before, *after] if lease.owner_kind == "server"}
    unleased = tuple(
        server
        for server in servers
        if server.ready and not server.pending and server.profile and server.key not in leased
    )
    if unleased and not previous.unleased and not await asyncio.to_thread(manager.all_leases):
        log.warning(
            "the lease store has never held a lease, yet %d server(s) run gpupool profiles: was GPUPOOL_DB_URL "
            "changed without `gpupool store copy`? Stop the hub and copy the old store into this one before it "
            "records anything (README, the lease store on PostgreSQL)",
            len(unleased),
        )
    stopped = await _report_unleased(hub, unleased, previous, stop_unleased)
    retired = sorted(missing & previous.missing)  # empty without retire_missing
    if len(missing) > 1 and len(missing) == len(checked):
        # as with an empty store above: a hub whose database was replaced has none of them, and retiring
        # cannot be undone
        log.warning(
            "the hub has none of the %d users who hold leases (was its database replaced?): none is retired",
            len(missing),
        )
        retired = []
    for user in retired:
        log.warning("retiring %s: they hold leases, and the hub has not had them for two passes", user)
        if retire_missing is not None:
            try:  # only what they had before this pass asked: a newcomer given the name since is the hub's
                await retire_missing(user, asked_at)
            except Exception:  # one user's retirement failing must not stop the pass's report
                log.exception("retiring %s failed; the next pass tries again", user)
    return ReconcileReport(
        tuple(released),
        frozenset(suspects),
        unleased,
        tuple(stopped),
        tuple(servers),
        missing,
        tuple(retired),
    )


async def _missing_users(hub: HubClient, holders: set[str]) -> frozenset[str]:
    """The users among ``holders`` whom the hub does not have; one it cannot be asked about counts as had (a
    token without an unfiltered scope for it must not retire anyone, nor stop the pass's other work)."""
    missing: set[str] = set()
    try:
        if not holders or not await hub.sees_every_user():
            return frozenset()
    except HubError as error:
        log.warning("could not ask the hub what its token may read: %s", error)
        return frozenset()
    for user in sorted(holders):
        try:
            if not await hub.user_exists(user):
                missing.add(user)
        except HubError as error:
            log.warning("could not ask the hub whether it still has %s: %s", user, error)
    return frozenset(missing)


async def _release_gone(
    manager: LeaseManager, leases: list[Lease], present: set[tuple[str, str]], previous: ReconcileReport
) -> tuple[set[str], list[Lease]]:
    """Server leases whose server the hub does not list: suspects the first time, released the second."""
    suspects: set[str] = set()
    released: list[Lease] = []
    for lease in leases:
        if lease.owner_kind != "server" or (lease.user, lease.owner_name) in present:
            continue
        if lease.id not in previous.suspects:
            suspects.add(lease.id)
            continue
        done = await asyncio.to_thread(manager.release, lease.id, SERVER_GONE)
        if done.release_reason == SERVER_GONE:  # not released meanwhile by its own spawner
            log.warning(
                "released lease %s of %s: server %r is gone (%s)",
                lease.id,
                lease.user,
                lease.owner_name,
                lease.profile,
            )
            released.append(done)
    return suspects, released


async def _report_unleased(
    hub: HubClient, unleased: tuple[HubServer, ...], previous: ReconcileReport, stop_unleased: bool
) -> list[HubServer]:
    """Log servers running a GPU profile without a lease; with ``stop_unleased``, stop those seen twice."""
    stopped: list[HubServer] = []
    for server in unleased:
        confirmed = server.key in previous.unleased_keys
        if stop_unleased:
            then = " : stopping it" if confirmed else ""
        else:
            then = " (set GPUPOOL_STOP_UNLEASED=1 to stop such servers)"
        log.warning("%s runs profile %s without a gpupool lease%s", server.label, server.profile, then)
        if stop_unleased and confirmed:
            try:
                await hub.stop_server(server.user, server.name)
            except HubError as error:
                log.warning("could not stop %s: %s", server.label, error)
                continue
            stopped.append(server)
    return stopped


async def reconcile_forever(
    manager: LeaseManager,
    hub: HubClient,
    *,
    interval: float = 60.0,
    stop_unleased: bool = False,
    retire_missing: RetireMissing | None = None,
    retry: float = 5.0,
) -> None:
    """A pass now (start-up) and then every ``interval`` seconds, until cancelled; a failed pass is logged
    and tried again after ``min(retry, interval)`` seconds, comparing with the last pass that succeeded."""
    previous: ReconcileReport | None = None
    while True:
        wait = interval
        try:
            previous = await reconcile_once(
                manager, hub, previous=previous, stop_unleased=stop_unleased, retire_missing=retire_missing
            )
        except HubError as error:
            log.warning("reconciliation skipped: %s", error)
            wait = min(retry, interval)
        except Exception:
            log.exception("reconciliation failed")
            wait = min(retry, interval)
        await asyncio.sleep(wait)
