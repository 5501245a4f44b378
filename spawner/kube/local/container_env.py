"""A container's environment as the kubelet builds it: ``value``, ``fieldRef``, ``configMapKeyRef``,
``secretKeyRef`` and ``envFrom``, read through the node's own API client, and Kubernetes' ``$(VAR)``
expansion."""

from __future__ import annotations

import base64
import os
import re
import sys
from pathlib import Path
from typing import Any

import httpx

from .pod_processes import RunningPod

Obj = dict[str, Any]


class MissingReference(LookupError):
    """A Secret or ConfigMap (or a key of one) the container needs is not there yet: a kubelet keeps the
    container waiting (``CreateContainerConfigError``) and tries again, never failing the pod."""


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


async def container_environment(
    api: httpx.AsyncClient, node: str, pod: Obj, container: Obj, running: RunningPod
) -> dict[str, str]:
    """The container's variables over a base of ``PATH`` (this Python's ``bin`` first), ``HOME`` (the pod's
    folder), ``HOSTNAME`` and ``LANG``."""
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(running.folder),
        "HOSTNAME": running.name,
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    namespace = running.namespace
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        for kind, ref in (
            ("configmaps", source.get("configMapRef")),
            ("secrets", source.get("secretRef")),
        ):
            if ref:
                data = await _read_data(api, kind, namespace, ref["name"], bool(ref.get("optional")))
                env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(item["value"], env)
        elif "valueFrom" in item:
            found = await _value_from(api, node, item["valueFrom"], pod, running)
            if found is not None:
                env[item["name"]] = found
    return env


async def _value_from(
    api: httpx.AsyncClient, node: str, source: Obj, pod: Obj, running: RunningPod
) -> str | None:
    if "fieldRef" in source:
        return _field(source["fieldRef"]["fieldPath"], node, pod, running)
    for kind, key in (("configmaps", "configMapKeyRef"), ("secrets", "secretKeyRef")):
        if key in source:
            ref = source[key]
            data = await _read_data(api, kind, running.namespace, ref["name"], bool(ref.get("optional")))
            if ref["key"] not in data and not ref.get("optional"):
                raise MissingReference(f"couldn't find key {ref['key']} in {kind[:-1]} {ref['name']}")
            return str(data[ref["key"]]) if ref["key"] in data else None
    return None


def _field(path: str, node: str, pod: Obj, running: RunningPod) -> str:
    """The pod field a ``fieldRef`` names (empty when the field is not one a kubelet offers)."""
    fields: dict[str, str] = {
        "metadata.name": running.name,
        "metadata.namespace": running.namespace,
        "metadata.uid": running.uid,
        "spec.nodeName": node,
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": running.ip,
        "status.hostIP": "127.0.0.1",
    }
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str(pod["metadata"].get(match.group(1), {}).get(match.group(2), ""))
    return fields.get(path, "")


async def _read_data(
    api: httpx.AsyncClient, kind: str, namespace: str, name: str, optional: bool
) -> dict[str, str]:
    answer = await api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
    if answer.status_code == 404 and optional:
        return {}
    if answer.status_code == 404:
        raise MissingReference(f'{kind[:-1]} "{name}" not found')
    if (
        answer.status_code == 403
    ):  # the Node authorizer's graph has not seen the pod yet: wait, as a kubelet does
        raise MissingReference(str(answer.json().get("message") or f'{kind[:-1]} "{name}" is forbidden'))
    answer.raise_for_status()
    body = answer.json()
    if kind == "secrets":
        return {k: base64.b64decode(v).decode() for k, v in body.get("data", {}).items()}
    return {str(k): str(v) for k, v in body.get("data", {}).items()}


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, ``$$`` is a literal ``$``, anything
    else stays as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR.sub(replace, text)
