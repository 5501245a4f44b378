"""A local cluster: the control plane, and simulated GPU nodes from a pool file kept Ready by our kubelet.

:func:`main` is ``gpupool kube up``: it builds the programs if needed, starts everything, prints
``KUBECONFIG=<path>`` on a line of its own once every node is Ready, and stops everything on Ctrl-C or SIGTERM.
:class:`Kubelet` (with volumes for users' home claims, :mod:`.volumes`) is also what tests use to run nodes
of their own beside the pool file's (one that goes silent, one with a device-plugin variant).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

from ...backends.simulated import DEMO_POOL, PoolFileError, load_pool_file
from ...pool.devices import Node
from .build import BuildError, ensure_built
from .control_plane import ControlPlane, ControlPlaneError, free_port
from .kubelet import NodeAgent, Obj, PodAddresses, run_forever
from .log_server import LogServer
from .nodes import node_devices, node_object, node_resources
from .pki import Authority, client_tls
from .volumes import Provisioner


class Kubelet:
    """Kubelets for any number of nodes of one control plane (in ``folder``: its PKI and admin kubeconfig)."""

    def __init__(self, folder: Path, api_url: str) -> None:
        self.folder = folder
        self.api_url = api_url
        self.pki = Authority(folder / "pki")
        serving = self.pki.issue(
            "kubelet-serving", "gpupool-kubelet", server_names=("127.0.0.1", "localhost")
        )
        self.logs = LogServer(serving, self.pki.ca.cert)
        self.addresses = PodAddresses()
        self.agents: dict[str, NodeAgent] = {}
        provisioner = self.pki.issue("local-volumes", "gpupool-local-volumes", ("system:masters",))
        self.volumes = Provisioner(api_url, self.pki.ca.cert, provisioner, folder / "volumes")

    async def start(self) -> None:
        await self.logs.start(free_port())
        await self.volumes.start()

    async def add(self, node: Node | Obj, resources: dict[str, str] | None = None) -> NodeAgent:
        """Register ``node`` (a pool node, or a Node object with ``resources``) and keep it Ready."""
        if isinstance(node, Node):
            obj, resources, devices = node_object(node), node_resources(node), node_devices(node)
        else:
            obj, resources, devices = node, resources or {}, {}
        name = str(obj["metadata"]["name"])
        identity = self.pki.issue(f"node-{name}", f"system:node:{name}", ("system:nodes",))
        agent = NodeAgent(
            obj,
            resources,
            api_url=self.api_url,
            ca=self.pki.ca.cert,
            identity=identity,
            logs=self.logs,
            folder=self.folder / "nodes" / name,
            addresses=self.addresses,
            devices=devices,
        )
        await agent.start()
        self.agents[name] = agent
        return agent

    async def stop(self) -> None:
        await asyncio.gather(*(agent.stop() for agent in self.agents.values()))
        await self.volumes.stop()
        await self.logs.stop()


async def wait_ready(plane: ControlPlane, names: list[str], timeout_s: float = 60) -> None:
    """Until the node-lifecycle controller has taken every named node as Ready (its not-ready taint gone)."""
    deadline = time.monotonic() + timeout_s
    pending = set(names)
    async with httpx.AsyncClient(
        base_url=plane.url, verify=client_tls(plane.pki.ca.cert, plane.admin)
    ) as api:
        while pending:
            listed = (await api.get("/api/v1/nodes")).json()["items"]
            for node in listed:
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in node.get("status", {}).get("conditions", [])
                )
                tainted = any(
                    t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints", [])
                )
                if ready and not tainted:
                    pending.discard(node["metadata"]["name"])
            if pending and time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"nodes not Ready within {timeout_s:.0f} s: {', '.join(sorted(pending))}"
                )
            await asyncio.sleep(0.2)


def add_up_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``gpupool kube up`` under ``gpupool kube``."""
    command = commands.add_parser(
        "up",
        help="a real Kubernetes control plane on 127.0.0.1 with simulated GPU nodes from a pool file "
        "(built from Kubernetes' Go modules on first use); prints KUBECONFIG=<path> once the nodes are Ready",
    )
    command.add_argument(
        "--pool", metavar="FILE", help="pool file of the simulated nodes (default: the demo pool)"
    )
    command.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where the cluster keeps its data (default: a new temporary folder)",
    )
    command.set_defaults(handler=lambda args: up(args.pool, args.state_dir))


def up(pool: str | None, state_dir: str | None) -> int:
    pool_path = Path(pool) if pool else DEMO_POOL
    try:
        nodes = load_pool_file(pool_path)
        programs = ensure_built()
    except (PoolFileError, BuildError) as error:
        print(f"gpupool: {error}", file=sys.stderr)
        return 2
    folder = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="gpupool-kube-"))
    plane = ControlPlane(programs, folder)
    print(
        f"gpupool: starting etcd, kube-apiserver, kube-scheduler, kube-controller-manager in {folder}",
        file=sys.stderr,
    )

    async def start() -> None:
        await kubelet.start()
        for node in nodes:
            await kubelet.add(node)
        await wait_ready(plane, [n.name for n in nodes])
        names = ", ".join(n.name for n in nodes)
        print(
            f"gpupool: {len(nodes)} simulated nodes Ready ({names}); pods run as local processes, no image is "
            f"pulled. Ctrl-C stops the cluster.",
            file=sys.stderr,
        )
        print(f"KUBECONFIG={plane.admin_kubeconfig}", flush=True)

    try:
        plane.start()
        kubelet = Kubelet(folder, plane.url)
        asyncio.run(run_forever(start, kubelet.stop))
    except ControlPlaneError as error:
        print(f"gpupool: {error}", file=sys.stderr)
        return 1
    finally:
        plane.stop()
        if not state_dir:
            shutil.rmtree(folder, ignore_errors=True)
    return 0
