"""The API's request and response bodies, as pydantic models: they are the OpenAPI document's schemas.

Models here only describe JSON; turning domain records into them is ``from_lease``/``from_profile``, so the
wire format changes in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...pool.environments import Environment
from ...pool.leases import Lease
from ...pool.profiles import Profile
from ...pool.state import Grant
from ..store.lease_store import request_to_json


class LeaseRequest(BaseModel):
    """``POST leases``, the hub's spawners only: a profile for a user's server."""

    model_config = ConfigDict(extra="forbid")

    profile: str = Field(min_length=1, max_length=63, description="the profile's slug, e.g. mig-3g")
    owner_kind: Literal["server", "job"] = Field(description="what holds the lease")
    owner_name: str = Field(
        max_length=255, description="the server's name ('' is the default server) or the job's"
    )
    user: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="whose server the lease is for (required)",
    )
    groups: list[str] | None = Field(
        default=None,
        description="the user's groups, for profile rules and group quotas",
    )
    admin: bool = Field(
        default=False,
        strict=True,
        description="the user is a hub admin, who may use every profile (as the spawn form offers them)",
    )
    environment: str | None = Field(
        default=None, max_length=63, description="one of the profile's environments; default: its default one"
    )
    walltime: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="seconds the user expects to need the server, within the profile's max_lifetime; the "
        "queue's expected starts go by it (default: the profile's max_lifetime)",
    )


class Device(BaseModel):
    kind: str = Field(description='"gpu", "mig" or "share"')
    uuid: str = Field(description="what CUDA_VISIBLE_DEVICES takes: GPU-… or MIG-…")
    gpu_uuid: str
    label: str
    milli: int
    memory_mib: int

    @classmethod
    def from_grant(cls, grant: Grant) -> Device:
        return cls(**asdict(grant))  # the same fields, as the store also writes them


class KubePlacement(BaseModel):
    """Where a granted lease runs on Kubernetes: the node and the extended resources its pod asks for."""

    node: str
    limits: dict[str, int] = Field(description="e.g. {'nvidia.com/mig-3g.40gb': 1}; the device plugin picks")
    environment: dict[str, str] = Field(
        default_factory=dict,
        description="what the pod's container is given besides: an MPS share's memory cap",
    )
    note: str = Field("", description="what the user should know of the grant, in words; empty when nothing")


class ResourcesOut(BaseModel):
    """``GET leases/{id}/resources``: the CPU and memory a lease's server or job uses against its limits."""

    limits_by: Literal["cgroup", "kubernetes", "none"] = Field(
        description="what holds the server or job to its limits: this host's control groups, Kubernetes, or "
        "nothing (the service cannot make control groups here)"
    )
    cpu_limit: float = Field(description="cores the profile gives")
    memory_limit_mib: int = Field(description="memory the profile gives, MiB")
    cpu_used: float | None = Field(
        description="cores used since the previous reading of this lease; null on the first, or when unknown"
    )
    memory_used_mib: float | None = Field(description="memory in use now, MiB; null when unknown")


class LeaseOut(BaseModel):
    id: str
    state: Literal["queued", "granted", "released"]
    user: str
    owner_kind: str
    owner_name: str
    profile: str
    priority: int
    request: dict[str, Any]
    node: str | None
    devices: list[Device]
    visible_devices: str = Field(description="the value for CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES")
    position: int | None = Field(description="place in the queue (0 is next) while queued")
    waiting_message: str | None = Field(description="what a waiting user reads, while queued")
    expected_start: float | None = Field(
        default=None,
        description="while queued, when it can expect to start (epoch seconds), from the time limits of what "
        "holds the devices ahead of it; null when unknown",
    )
    created_at: float
    granted_at: float | None
    released_at: float | None
    release_reason: str | None
    kubernetes: KubePlacement | None = Field(
        None, description="with the Kubernetes backend, a granted lease's node and pod resource limits"
    )

    @classmethod
    def from_lease(
        cls,
        lease: Lease,
        waiting_message: str | None = None,
        kubernetes: KubePlacement | None = None,
        expected_start: float | None = None,
    ) -> LeaseOut:
        return cls(
            id=lease.id,
            state=lease.state.value,
            user=lease.user,
            owner_kind=lease.owner_kind,
            owner_name=lease.owner_name,
            profile=lease.profile,
            priority=lease.priority,
            request=request_to_json(lease.request),
            node=lease.node,
            devices=[Device.from_grant(g) for g in lease.devices],
            visible_devices=lease.visible_devices,
            position=lease.position,
            waiting_message=waiting_message,
            expected_start=expected_start,
            created_at=lease.created_at,
            granted_at=lease.granted_at,
            released_at=lease.released_at,
            release_reason=lease.release_reason,
            kubernetes=kubernetes,
        )


class EnvironmentOut(BaseModel):
    slug: str
    display_name: str = Field(description="the name and what it needs, e.g. 'PyTorch 2.5 (needs CUDA 12.4)'")
    default: bool
    image: str = Field(description="the container image on Kubernetes; '' on one host")
    never_fits: str | None = Field(
        default=None,
        description="why no GPU of the pool can ever run it (the spawn form shows it disabled, saying so, and a "
        "lease asking for it is refused), or null",
    )

    @classmethod
    def from_environment(cls, environment: Environment, never_fits: str | None = None) -> EnvironmentOut:
        return cls(
            slug=environment.slug,
            display_name=environment.describe(),
            default=environment.default,
            image=environment.image,
            never_fits=never_fits,
        )


class ProfileOut(BaseModel):
    slug: str
    display_name: str
    description: str
    gpu: str = Field(description="the GPU ask in words: '1 × H100-80GB', 'MIG 3g.40gb', 'CPU only'")
    cpu_milli: int
    memory_mib: int
    default: bool
    available_now: int = Field(description="how many could start right now (counted up to 64)")
    queued: int = Field(description="how many leases of this profile wait in the queue")
    never_fits: str | None = Field(description="why the pool can never serve it, or null")
    over_quota: str | None = Field(
        default=None,
        description="why the quota of the user asked about (the caller by default) refuses it now, until they "
        "hold less, or null",
    )
    quota_forbids: str | None = Field(
        default=None,
        description="why that user's quota refuses it even while they hold nothing (a limit of 0, or below "
        "what it asks), or null",
    )
    simulated: bool = Field(
        default=False,
        description="the pool's GPUs are simulated (a pool file's, or the nodes of gpupool kube up): what is "
        "free is a stand-in, no real GPU",
    )
    expected_start: float | None = Field(
        default=None,
        description="when none could start now: when one asked now could expect to start (epoch seconds), "
        "from the time limits of what holds the devices; null when unknown or when one could start now",
    )
    idle_timeout: int | None = Field(
        default=None, description="seconds idle before the culler stops a server"
    )
    max_lifetime: int | None = Field(default=None, description="the longest a server of it lives, in seconds")
    queue_wait: int | None = Field(
        default=None, description="the longest a spawn waits in the queue, in seconds"
    )
    environments: list[EnvironmentOut] = Field(
        default_factory=list, description="the software choices it offers"
    )

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        available_now: int,
        queued: int,
        never_fits: str | None,
        expected_start: float | None = None,
        *,
        environments_never_fit: Mapping[str, str] | None = None,
        simulated: bool = False,
    ) -> ProfileOut:
        closed = environments_never_fit or {}
        return cls(
            slug=profile.slug,
            display_name=profile.display_name,
            description=profile.description,
            gpu=profile.gpu_description(),
            cpu_milli=profile.cpu_milli,
            memory_mib=profile.memory_mib,
            default=profile.default,
            available_now=available_now,
            queued=queued,
            never_fits=never_fits,
            simulated=simulated,
            expected_start=expected_start,
            idle_timeout=profile.idle_timeout,
            max_lifetime=profile.max_lifetime,
            queue_wait=profile.queue_wait,
            environments=[
                EnvironmentOut.from_environment(e, closed.get(e.slug)) for e in profile.environments
            ],
        )


class QuotaLimitOut(BaseModel):
    resource: str = Field(
        description="whole_gpus, mig_slices, gpu_shares, gpu_milli, cpu_milli or memory_mib"
    )
    scope: str = Field(description='"user" (their own or the default quota) or "group" (per member)')
    subject: str = Field(description="the user's or the group's name")
    limit: int = Field(description="what may be held at once, in the resource's unit")
    held: int = Field(description="what the user holds now (servers and jobs, queued leases too)")
    words: str = Field(description="the same in words, e.g. '4 whole GPUs, 1 held'")


class QuotaOut(BaseModel):
    user: str
    limits: list[QuotaLimitOut]
    summary: str = Field(description="what the spawn form shows, e.g. 'Your quota: 4 whole GPUs, 1 held'")


class Problem(BaseModel):
    """Every error: a machine-readable ``error`` and the sentence a user reads in ``detail``."""

    error: str
    detail: str
    fields: list[str] = Field(default_factory=list, description="the request fields at fault, if any")
