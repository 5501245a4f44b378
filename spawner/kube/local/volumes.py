"""Volumes for claims that no storage class serves: what a cluster's provisioner does, for the local cluster.

KubeSpawner (Zero to JupyterHub's dynamic storage) makes each user's home claim, ``claim-<user>``, at their
first server, and gpupool's training Jobs mount the same claim. On a real cluster a storage class's
provisioner makes a volume for it; the local cluster has none, so without this the claim, and every pod and Job
mounting it, would wait forever. :class:`Provisioner` makes a ``hostPath`` PersistentVolume (a folder below
the cluster's own) for each claim that waits without a volume and asks for no class or the empty one; the real
PersistentVolume controller binds the two. Claims that name a volume of their own are left alone. (The
simulated kubelet mounts nothing: see :mod:`.kubelet`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from pathlib import Path
from typing import Any

import httpx

from .pki import KeyPair, client_tls

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def volume_for(claim: Obj, folder: Path) -> Obj | None:
    """The PersistentVolume that would serve ``claim``, or None when it is not this provisioner's to serve
    (bound, naming a volume, or asking for a storage class)."""
    spec, meta = claim.get("spec") or {}, claim["metadata"]
    if (claim.get("status") or {}).get("phase") != "Pending" or spec.get("volumeName"):
        return None
    if spec.get("storageClassName") not in (None, ""):
        return None
    namespace, name = meta["namespace"], meta["name"]
    digest = hashlib.sha256(f"{namespace}/{name}/{meta.get('uid')}".encode()).hexdigest()[:10]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"local-{digest}", "labels": {"app.kubernetes.io/managed-by": "gpupool-local"}},
        "spec": {
            "capacity": {
                "storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
            },
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "hostPath": {"path": str(folder / namespace / name), "type": "DirectoryOrCreate"},
            "claimRef": {"namespace": namespace, "name": name, "uid": meta.get("uid")},
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
        },
    }


class Provisioner:
    """Every ``interval_s``, a volume for each claim :func:`volume_for` serves, as ``identity`` (a client
    certificate the API server's CA issued, with rights on claims and volumes)."""

    def __init__(
        self, api_url: str, ca: Path, identity: KeyPair, folder: Path, interval_s: float = 0.5
    ) -> None:
        self.api_url = api_url
        self.tls = client_tls(ca, identity)
        self.folder = folder
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name="gpupool-local-volumes")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _serve(self) -> None:
        async with httpx.AsyncClient(base_url=self.api_url, verify=self.tls, timeout=10) as api:
            while True:
                try:
                    await self.provide(api)
                except (httpx.HTTPError, KeyError, ValueError) as error:  # the API server restarting
                    log.debug("local volumes: %s", error)
                await asyncio.sleep(self.interval_s)

    async def provide(self, api: httpx.AsyncClient) -> None:
        claims = (await api.get("/api/v1/persistentvolumeclaims")).raise_for_status().json()["items"]
        for claim in claims:
            volume = volume_for(claim, self.folder)
            if volume is None:
                continue
            made = await api.post("/api/v1/persistentvolumes", json=volume)
            if made.status_code not in (201, 409):  # 409: made on an earlier pass, not bound yet
                made.raise_for_status()
