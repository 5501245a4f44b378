"""``KubeGPUSpawner``: KubeSpawner with gpupool's profiles, queue and leases.

The lease lifecycle is :class:`.leasing.GpuLeasing`'s (ask, queue with progress, release exactly once); what
Kubernetes adds:

- ``profile_list`` comes from gpupool's profiles file, each with live availability in its description,
  showing only the profiles the user's groups may use. KubeSpawner renders it and sends
  ``{"profile": slug}``, the same body a REST spawn sends.
- A granted lease names a node and extended resources (``kubernetes`` in the service's lease: the service
  runs its Kubernetes backend). :meth:`KubeGPUSpawner.apply_lease` turns them into the pod's resource limits
  and requests, a required node affinity to that node, the GPU toleration (added to the configured ones), the
  ``gpupool.io/lease`` and ``gpupool.io/user`` labels and the ``GPUPOOL_*`` environment
  (:func:`gpupool.spawner.kube.pods.server_pod_overrides`). The device plugin picks the device on the node.
- ``progress()``: gpupool's own events while the lease is asked for and queued, then the pod's Kubernetes
  events said as plain sentences (:func:`gpupool.spawner.kube.events.plain_event`).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from kubespawner import KubeSpawner
from traitlets import default, validate

from ..kube.api_errors import in_words
from ..kube.events import plain_event
from ..kube.grant import KubeGrant
from ..kube.manifests import ManifestError
from ..kube.pods import server_pod_overrides
from ..pool.environments import ENV_VAR
from . import form
from .compat import SpawnException
from .environment_choice import environment_of
from .lab_args import LabArgs
from .leasing import GpuLeasing
from .user_options import check_user_options

# the KubeSpawner traits a lease sets; what the admin configured is kept and the lease's part added to it
_MERGED = ("node_affinity_required", "tolerations", "extra_labels", "extra_annotations", "environment")
_REPLACED = (
    "extra_resource_limits",
    "extra_resource_guarantees",
    "cpu_limit",
    "cpu_guarantee",
    "mem_limit",
    "mem_guarantee",
)


async def _profile_list(spawner: KubeGPUSpawner) -> list[dict[str, object]]:
    """``profile_list`` as a callable: KubeSpawner awaits it each time the form is shown and at start."""
    return await spawner.gpupool_profile_list()


class KubeGPUSpawner(GpuLeasing, LabArgs, KubeSpawner):  # type: ignore[misc]  # KubeSpawner is untyped
    """A KubeSpawner whose pods run on the node and devices of a gpupool lease; see the module docstring.

    Configure the service with ``service_url`` (the gpupool Service's in-cluster address, e.g.
    ``http://gpupool:10101/services/gpupool/``) and ``service_api_token``, and the profiles with
    ``profiles_file``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._configured: dict[str, Any] | None = None

    @default("profile_list")
    def _default_profile_list(self) -> Any:
        return _profile_list

    @validate("profile_list")
    def _gpupool_profiles_unless_some_are_given(self, proposal: Any) -> Any:
        """Zero to JupyterHub sets ``profile_list`` from ``singleuser.profileList``, ``[]`` by default: that
        says none were configured, so gpupool's stay rather than leave the form empty."""
        value = proposal["value"]
        return _profile_list if isinstance(value, list) and not value else value

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Any:
        return check_user_options

    async def start(self) -> Any:
        """Start as :class:`GpuLeasing` does (the lease is given back on any failure); a pod the cluster refuses
        to create (a ResourceQuota, a LimitRange, an admission webhook) is said in the cluster's words, where
        the client's exception reached the user as a bare 500 and its headers in the progress stream."""
        try:
            return await super().start()
        except ApiException as error:
            raise SpawnException(
                f"Kubernetes refused to create your server's pod: {in_words(error)}. Ask the cluster's admin, "
                "or try again once other pods in the namespace have ended",
                reason="kubernetes_refused",
                status_code=503 if error.status == 403 else 500,
            ) from None

    async def gpupool_profile_list(self) -> list[dict[str, object]]:
        """The profiles this user may start, with what could start now; without the service, still listed."""
        choices, _simulated = await self.profile_choices()  # each choice says "(simulated pool)" itself
        return form.profile_list(choices)

    def apply_lease(self, lease: Mapping[str, Any]) -> None:
        """Set the pod's resources, node, toleration, labels and environment from the granted ``lease``."""
        placed = lease.get("kubernetes")
        if not isinstance(placed, Mapping) or not placed.get("node"):
            raise SpawnException(
                "gpupool's lease names no Kubernetes node: the gpupool service must run its Kubernetes backend "
                "(GPUPOOL_BACKEND=kubernetes) for KubeGPUSpawner",
                reason="gpupool_config",
                status_code=500,
            )
        profile = self.resolve_profile()
        try:
            overrides = server_pod_overrides(
                KubeGrant(
                    str(placed["node"]),
                    {str(k): int(v) for k, v in (placed.get("limits") or {}).items()},
                    {str(k): str(v) for k, v in (placed.get("environment") or {}).items()},
                ),
                lease_id=str(lease["id"]),
                user=self.user.name,
                profile=profile.slug,
                cpu_milli=profile.cpu_milli,
                memory_mib=profile.memory_mib,
                service_url=self.service_url,
            )
        except ManifestError as error:
            raise SpawnException(f"gpupool: {error}", reason="gpupool_manifest", status_code=500) from error
        if self._configured is None:  # the admin's settings, before any lease touched them
            self._configured = {
                name: copy.deepcopy(getattr(self, name)) for name in (*_MERGED, *_REPLACED, "image")
            }
        configured = self._configured
        values: dict[str, Any] = dict(overrides)
        for name in _REPLACED:
            setattr(self, name, values[name])
        for name in ("node_affinity_required", "tolerations"):
            setattr(self, name, [*configured[name], *values[name]])
        chosen = environment_of(self.user_options or {}, profile)
        if chosen is not None:  # the profile's choice of software: its image, and its name for jobs to name
            values["environment"] = {**values["environment"], ENV_VAR: chosen.slug}
        self.image = chosen.image if chosen is not None and chosen.image else configured["image"]
        for name in ("extra_labels", "extra_annotations", "environment"):
            setattr(self, name, {**configured[name], **values[name]})
        self._lease_env = {}  # the pod's environment carries it, and never device UUIDs (the plugin's part)

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """gpupool's events until the lease is granted, then the pod's events in plain words. KubeSpawner counts
        its progress from 0 again, so its share is scaled into what is left after gpupool's: the bar only ever
        moves forward."""
        reached = 0.0
        async for event in GpuLeasing.progress(self):
            reached = max(reached, float(event.get("progress", reached)))
            yield event
        if not self._granted:
            return
        base = reached
        async for event in KubeSpawner.progress(self):
            event = dict(event)  # KubeSpawner's own stays as it was
            raw = event.pop("raw_event", None)
            if raw:
                event["message"] = plain_event(str(raw.get("reason") or ""), str(raw["message"]))
            if "progress" in event:
                reached = max(reached, base + (100 - base) * float(event["progress"]) / 100)
                event["progress"] = int(reached)
            yield event


__all__: Sequence[str] = ("KubeGPUSpawner",)
