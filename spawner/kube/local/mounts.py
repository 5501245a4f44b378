"""A pod's volumes as folders on this machine, for the simulated kubelet, which runs containers as processes.

Nothing is mounted: instead each volume is a folder here (a claim's, the ``hostPath`` of the volume bound to it;
an ``emptyDir``, a folder of the pod's own; a ``hostPath``, its path), and a container's working directory,
arguments and environment values that name a path under one of its ``volumeMounts`` are rewritten to that
folder. So a user's server and their training Job, which mount the same home claim at ``/home/jovyan``, see the
same files, as on a cluster, and nothing lands in this machine's own ``/home/jovyan``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

Obj = dict[str, Any]


class VolumeNotReady(LookupError):
    """The Node authorizer refused a claim or volume of a new pod (403): its graph has not linked them to the
    node yet. A kubelet waits for the volume, as for any mount not yet ready."""


async def volume_folders(api: httpx.AsyncClient, pod: Obj, pod_folder: Path) -> dict[str, Path]:
    """Volume name -> its folder here (:func:`mount_points` makes those a container mounts); a claim not yet
    bound to a ``hostPath`` volume is left out (its mounts then stay the paths they name); :class:`VolumeNotReady`
    while the API server may not show them to this node yet."""
    folders: dict[str, Path] = {}
    namespace = pod["metadata"]["namespace"]
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        if "emptyDir" in volume:
            folders[name] = pod_folder / "volumes" / name
        elif "hostPath" in volume:
            folders[name] = Path(volume["hostPath"]["path"])
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            found = await api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
            bound = found.json().get("spec", {}).get("volumeName") if found.status_code == 200 else None
            volume_answer = await api.get(f"/api/v1/persistentvolumes/{bound}") if bound else None
            if 403 in (found.status_code, volume_answer.status_code if volume_answer else None):
                raise VolumeNotReady(f"persistentvolumeclaim {claim}: not yet readable by this node")
            held = volume_answer.json() if volume_answer is not None else {}
            path = held.get("spec", {}).get("hostPath", {}).get("path")
            if path:
                folders[name] = Path(path)
    return folders


def mount_points(container: Obj, folders: dict[str, Path]) -> list[tuple[str, Path]]:
    """The container's mount paths with their folders here, deepest first (``subPath`` inside its volume)."""
    points = [
        (m["mountPath"].rstrip("/") or "/", folders[m["name"]] / m.get("subPath", ""))
        for m in container.get("volumeMounts") or []
        if m["name"] in folders
    ]
    for _, folder in points:
        folder.mkdir(parents=True, exist_ok=True)
    return sorted(points, key=lambda point: -len(point[0]))


def on_host(text: str, points: list[tuple[str, Path]]) -> str:
    """``text`` with each path under a mount point rewritten to the folder here (``/home/jovyan/train.py`` ->
    ``<claim's folder>/train.py``); a path that merely begins alike (``/home/jovyanx``) is left alone."""
    for mount, folder in points:
        here = str(folder).replace("\\", "\\\\")  # a replacement string, not a pattern
        text = re.sub(rf"(?<![\w./-]){re.escape(mount)}(?=/|$|[^\w.-])", here, text)
    return text
