"""Kubernetes events about a server's pod, said as plain sentences for the spawn page.

The progress page shows what the kubelet and the scheduler report; their wording ("0/3 nodes are available:
1 Insufficient nvidia.com/mig-3g.40gb, 2 node(s) didn't match Pod's node affinity/selector") is written for
cluster operators. :func:`plain_event` keeps the facts and drops the jargon; an event it does not know is
passed on as Kubernetes wrote it. Pure: no I/O.
"""

from __future__ import annotations

import re

_ASSIGNED = re.compile(r"Successfully assigned (?P<pod>\S+) to (?P<node>\S+)")
_INSUFFICIENT = re.compile(r"Insufficient (?P<resource>[\w./-]+)")
_PULLING = re.compile(r'Pulling image "(?P<image>[^"]+)"')


def plain_event(reason: str, message: str) -> str:
    """One event (its ``reason`` and ``message``) as a sentence a researcher reads."""
    if reason == "Scheduled":
        found = _ASSIGNED.search(message)
        node = found.group("node") if found else "its node"
        return f"Your server's pod was placed on node {node}, the node of its gpupool lease"
    if reason == "FailedScheduling":
        short = sorted({m.group("resource") for m in _INSUFFICIENT.finditer(message)})
        if short:
            return (
                "Kubernetes cannot start the pod yet: the leased node has no free "
                + ", ".join(short)
                + " at the moment (another workload may still hold it); waiting"
            )
        if "taint" in message:
            return "Kubernetes cannot start the pod yet: the leased node is tainted (cordoned or failing); waiting"
        if "affinity" in message or "selector" in message:
            return "Kubernetes cannot start the pod yet: the leased node is not ready; waiting"
        return f"Kubernetes cannot start the pod yet: {message}"
    if reason == "Pulling":
        found = _PULLING.search(message)
        image = found.group("image") if found else "the server image"
        return f"Downloading {image} to the node (the first start on a node can take minutes)"
    if reason == "Pulled":
        return "The server image is on the node"
    if reason == "Created":
        return "The server's container is created"
    if reason == "Started":
        return "The server's container started; JupyterLab is coming up"
    if reason in ("BackOff", "Failed", "FailedMount", "FailedCreatePodSandBox"):
        return f"Starting the pod failed ({reason}): {message}"
    return message
