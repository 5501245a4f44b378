"""Leases: who holds (or waits for) which devices, for a server or a job. The service's lease manager decides
and its store records; these are the values they pass around."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from .requests import Request
from .state import Grant, visible_devices

OwnerKind = Literal["server", "job"]
OWNER_KINDS: tuple[OwnerKind, ...] = ("server", "job")


class LeaseState(StrEnum):
    QUEUED = "queued"
    GRANTED = "granted"
    RELEASED = "released"


def new_lease_id() -> str:
    """12 URL-safe characters (72 random bits): short enough to read in a URL, never guessed or reused.

    Never one that starts with ``-``: ``gpupool logs -UYYiuLkR0bw`` would read it as an option (one id in 64).
    """
    while (lease_id := secrets.token_urlsafe(9)).startswith("-"):
        pass
    return lease_id


def check_owner_kind(owner_kind: str) -> None:
    if owner_kind not in OWNER_KINDS:
        raise ValueError(f"owner_kind must be one of {', '.join(OWNER_KINDS)}, got {owner_kind!r}")


@dataclass(frozen=True)
class Lease:
    """One lease as recorded: its owner (a server or a job), what it asked for and what it holds."""

    id: str
    owner_kind: OwnerKind
    user: str
    owner_name: str  # the server's or the job's name
    profile: str  # the profile's slug
    request: Request
    priority: int
    state: LeaseState
    created_at: float
    node: str | None = None
    devices: tuple[Grant, ...] = ()
    granted_at: float | None = None
    released_at: float | None = None
    release_reason: str | None = None
    position: int | None = None  # place in the queue (0 is next) when read through the manager; not stored

    @property
    def visible_devices(self) -> str:
        """The value for ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES``."""
        return visible_devices(self.devices)


@dataclass(frozen=True)
class NewLease:
    """A lease before it is stored: who asks, for what, and when; the id is chosen here, before placement."""

    owner_kind: OwnerKind
    user: str
    owner_name: str
    profile: str
    request: Request
    priority: int
    created_at: float
    id: str = field(default_factory=new_lease_id)

    def __post_init__(self) -> None:
        check_owner_kind(self.owner_kind)
