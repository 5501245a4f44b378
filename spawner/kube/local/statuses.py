"""The status objects the kubelet sends: a node's (capacity, conditions, addresses, node info) and a pod's
(phase, conditions, container states), saying where they show that the node is simulated."""

from __future__ import annotations

import os
from typing import Any

from .pod_processes import Container, RunningPod, now

Obj = dict[str, Any]
SIMULATED_IMAGE_ID = "gpupool-simulated://not-pulled"


def node_status(name: str, resources: dict[str, str], kubelet_port: int) -> Obj:
    """A Ready node with no pressure, whose kubelet (logs) listens on ``kubelet_port``."""
    stamp = now()

    def condition(kind: str, status: str, reason: str, message: str) -> Obj:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }

    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "simulated"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "simulated"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "simulated"),
            condition("Ready", "True", "KubeletReady", "gpupool's simulated kubelet is posting ready status"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "machineID": name,
            "systemUUID": name,
            "bootID": name,
            "kernelVersion": os.uname().release,
            "osImage": "gpupool simulated node (processes, no images)",
            "containerRuntimeVersion": "gpupool-processes://1",
            "kubeletVersion": "v0.0.0-gpupool-simulated",
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def pod_status(running: RunningPod, pod: Obj) -> Obj:
    """The pod's phase from its containers: Pending until a main container started, Running while any main
    container runs, Succeeded or Failed once all have ended (or an init container failed)."""
    records = list(running.containers.values())
    main = [
        running.containers[c["name"]] for c in pod["spec"]["containers"] if c["name"] in running.containers
    ]
    finished = (bool(main) and all(c.exit_code is not None for c in main)) or any(
        c.exit_code not in (None, 0) for c in records if c not in main
    )
    if finished:
        phase = "Succeeded" if main and all(c.exit_code == 0 for c in main) else "Failed"
    else:
        phase = "Running" if main and not any(c.waiting for c in main) else "Pending"
    ready = "True" if phase == "Running" else "False"
    stamp = now()
    images = {
        c["name"]: c.get("image", "")
        for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
    }
    statuses = [_container_status(c, images.get(c.name, "")) for c in main]
    status = {
        "phase": phase,
        "podIP": running.ip,
        "podIPs": [{"ip": running.ip}],
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "startTime": pod.get("status", {}).get("startTime") or stamp,
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": stamp},
            {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": stamp},
            {"type": "Ready", "status": ready, "lastTransitionTime": stamp},
        ],
        "containerStatuses": statuses,
    }
    inits = [c for c in records if c not in main]
    if inits:
        status["initContainerStatuses"] = [_container_status(c, images.get(c.name, "")) for c in inits]
    return status


def _container_status(record: Container, image: str) -> Obj:
    if record.waiting:
        state: Obj = {"waiting": {"reason": "CreateContainerConfigError", "message": record.waiting}}
    elif record.exit_code is None:
        state = {"running": {"startedAt": record.started_at}}
    else:
        reason = "Completed" if record.exit_code == 0 else ("StartError" if record.failure else "Error")
        state = {
            "terminated": {
                "exitCode": record.exit_code,
                "reason": reason,
                "message": record.failure or None,
                "startedAt": record.started_at,
                "finishedAt": record.finished_at,
            }
        }
        state["terminated"] = {k: v for k, v in state["terminated"].items() if v is not None}
    pid = record.process.pid if record.process else 0
    return {
        "name": record.name,
        "image": image,
        "imageID": SIMULATED_IMAGE_ID,
        "containerID": f"gpupool-process://{pid}",
        "ready": record.exit_code is None and not record.waiting,
        "started": record.exit_code is None and not record.waiting,
        "restartCount": 0,
        "state": state,
    }
