"""The calls the hub's spawners make: profiles with live availability, and leases asked for, read and
released on behalf of any user, and a user the hub deleted retired.

The spawner calls with a token of the hub's own (a JupyterHub service token whose role grants
``custom:gpupool:leases``), so it may act for every user; everything is asynchronous, on the hub's loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote

from .connection import Connection


@dataclass(frozen=True)
class Availability:
    """What the form needs from the service, per profile slug: ``(available_now, queued)`` and why a
    profile can never fit the pool; plus the backend ("simulated", "nvml" or "kubernetes"; empty: no answer)
    and whether the pool's GPUs are simulated."""

    counts: dict[str, tuple[int, int]]
    never_fits: dict[str, str]
    backend: str
    expected_starts: dict[str, float] = field(default_factory=dict)  # slug: when one asked now could start
    over_quota: dict[str, str] = field(default_factory=dict)  # slug: why the user's quota refuses it now
    quota_forbids: dict[str, str] = field(default_factory=dict)  # slug: why it does even if they held nothing
    simulated: bool = False  # GET pool's "simulated": the form says so on its banner and every choice
    # slug: {environment: why no GPU of the pool can run it}; the form offers it disabled, saying why
    environments_never_fit: dict[str, dict[str, str]] = field(default_factory=dict)


class ServiceClient(Connection):
    """The service at ``base_url`` (its prefix, e.g. ``http://127.0.0.1:8000/services/gpupool/``), called
    with the hub's ``token``; a shorter timeout than a notebook's, since a spawn waits on it."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0) -> None:
        super().__init__(base_url, token, environ={}, timeout=timeout)  # the hub says both, never its env

    async def profiles(self, user: str | None = None, groups: Iterable[str] = ()) -> list[dict[str, Any]]:
        """``GET profiles``: the profiles the token may use (the hub's: all), each with ``available_now``,
        ``queued``, ``never_fits``, and ``over_quota`` and ``quota_forbids`` judged for ``user`` with
        ``groups``."""
        params = {"user": user, "groups": sorted(groups)} if user else None
        return cast(list[dict[str, Any]], await self.acall("GET", "profiles", params=params))

    async def pool(self) -> dict[str, Any]:
        """``GET pool``: nodes, devices, what is free, health and ``backend``."""
        return cast(dict[str, Any], await self.acall("GET", "pool"))

    async def availability(self, user: str | None = None, groups: Iterable[str] = ()) -> Availability:
        """Per-profile counts, never-fits reasons (of environments too) and ``user``'s quota refusals from
        ``GET profiles``, and the backend and whether it is simulated from ``GET pool``."""
        profiles = await self.profiles(user, groups)
        pool = await self.pool()
        return Availability(
            counts={p["slug"]: (int(p["available_now"]), int(p["queued"])) for p in profiles},
            never_fits={p["slug"]: str(p["never_fits"]) for p in profiles if p.get("never_fits")},
            backend=str(pool.get("backend", "")),
            expected_starts={
                p["slug"]: float(p["expected_start"]) for p in profiles if p.get("expected_start")
            },
            over_quota={p["slug"]: str(p["over_quota"]) for p in profiles if p.get("over_quota")},
            quota_forbids={p["slug"]: str(p["quota_forbids"]) for p in profiles if p.get("quota_forbids")},
            simulated=bool(pool.get("simulated")),
            environments_never_fit={
                p["slug"]: {str(e["slug"]): str(e["never_fits"]) for e in closed}
                for p in profiles
                if (closed := [e for e in p.get("environments") or () if e.get("never_fits")])
            },
        )

    async def quota_summary(self, user: str, groups: Iterable[str]) -> str:
        """``GET quota`` for ``user`` with their ``groups``: ``Your quota: 4 whole GPUs, 1 held · …``."""
        params = {"user": user, "groups": sorted(groups)}
        return str((await self.acall("GET", "quota", params=params))["summary"])

    async def create_lease(
        self,
        user: str,
        groups: Iterable[str],
        profile: str,
        *,
        owner_kind: str = "server",
        owner_name: str = "",
        walltime: float | None = None,
        environment: str | None = None,
        admin: bool = False,
    ) -> dict[str, Any]:
        """``POST leases`` for ``user`` (``admin``: a hub admin, who may use every profile): the lease,
        ``granted`` (with devices) or ``queued`` (with ``position`` and ``waiting_message``)."""
        body = {
            "profile": profile,
            "owner_kind": owner_kind,
            "owner_name": owner_name,
            "user": user,
            "groups": sorted(groups),
            **({"walltime": walltime} if walltime is not None else {}),
            **({"environment": environment} if environment else {}),
            **({"admin": True} if admin else {}),
        }
        return cast(dict[str, Any], await self.acall("POST", "leases", json=body))

    async def active_leases(self, user: str) -> list[dict[str, Any]]:
        """``GET leases?active_only=true&user=…``: ``user``'s queued and granted leases."""
        leases = await self.acall("GET", "leases", params={"active_only": "true", "user": user})
        return cast(list[dict[str, Any]], leases)

    async def get_lease(self, lease_id: str) -> dict[str, Any]:
        """``GET leases/{id}``: the lease as it stands now."""
        return cast(dict[str, Any], await self.acall("GET", f"leases/{lease_id}"))

    async def release_lease(self, lease_id: str) -> dict[str, Any]:
        """``DELETE leases/{id}``; the service makes a second release change nothing."""
        return cast(dict[str, Any], await self.acall("DELETE", f"leases/{lease_id}"))

    async def retire_user(
        self, user: str, *, hold: bool = False, before: float | None = None
    ) -> dict[str, Any]:
        """``DELETE users/{user}``: the hub deletes ``user``; their jobs are cancelled (waited for), their
        leases released and their records filed away. ``hold``: nothing new starts for them until a call
        without it; ``before``: only what was made before then (asking again later)."""
        params: dict[str, str] = {"hold": "true"} if hold else {}
        if before is not None:
            params["before"] = repr(before)
        return cast(
            dict[str, Any],
            await self.acall("DELETE", f"users/{quote(user, safe='')}", params=params or None),
        )
