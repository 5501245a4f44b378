"""Start and stop etcd, kube-apiserver, kube-scheduler and kube-controller-manager on 127.0.0.1.

The API server runs as a cluster's does: TLS with client certificates, Node and RBAC authorization, the default
admission plugins plus NodeRestriction, service-account tokens signed by a key of ours. The controller manager
runs every default controller with a service account each (so RBAC applies to them too); the scheduler is the
default one. Only timings are shortened so a test sees a silent node go NotReady within seconds.

Every component logs to ``<folder>/logs/<name>.log``; ``<folder>/admin.kubeconfig`` is an admin's kubeconfig.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from .build import Programs
from .pki import Authority, KeyPair, client_tls, service_account_keys

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service's address: its serving certificate names it
NODE_MONITOR_GRACE_S = 12  # a node whose kubelet is silent this long is NotReady (a cluster's default: 50)


class ControlPlaneError(RuntimeError):
    """A component did not start; the message holds the end of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_kubeconfig(path: Path, server: str, ca: Path, client: KeyPair, namespace: str = "default") -> Path:
    """A kubeconfig that reaches ``server`` as the owner of ``client``'s certificate."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [
            {"name": "user", "user": {"client-certificate": str(client.cert), "client-key": str(client.key)}}
        ],
        "contexts": [
            {"name": "local", "context": {"cluster": "local", "user": "user", "namespace": namespace}}
        ],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


@dataclass
class ControlPlane:
    """The four components, started by :meth:`start` and stopped by :meth:`stop` (also on ``with``)."""

    programs: Programs
    folder: Path
    pki: Authority = field(init=False)
    url: str = field(init=False, default="")
    admin_kubeconfig: Path = field(init=False)
    _processes: dict[str, subprocess.Popen[bytes]] = field(init=False, default_factory=dict)
    _commands: dict[str, list[str]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "logs").mkdir(exist_ok=True)
        self.pki = Authority(self.folder / "pki")
        self.admin = self.pki.issue("admin", "gpupool-admin", ("system:masters",))
        self.admin_kubeconfig = self.folder / "admin.kubeconfig"

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        try:
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every component, newest first: SIGTERM, then SIGKILL after five seconds."""
        for name in reversed(list(self._processes)):
            _terminate(self._processes.pop(name))

    def restart_apiserver(self) -> None:
        """Stop the API server and start it again on the same port (its clients' connections drop)."""
        self.stop_apiserver()
        self.start_apiserver()

    def stop_apiserver(self) -> None:
        _terminate(self._processes.pop("kube-apiserver"))

    def start_apiserver(self) -> None:
        """Start the API server stopped by :meth:`stop_apiserver` again, on the same port, and wait for it."""
        self._run("kube-apiserver", self._commands["kube-apiserver"])
        self._wait_ready()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def kubeconfig_for(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig (in the folder, as ``<name>.kubeconfig``) for a client certificate of ``user``."""
        pair = self.pki.issue(name, user, groups)
        return write_kubeconfig(self.folder / f"{name}.kubeconfig", self.url, self.pki.ca.cert, pair)

    def client(self, pair: KeyPair | None = None) -> httpx.Client:
        """A plain HTTP client of the API server, as the admin unless ``pair`` says otherwise."""
        pair = pair or self.admin
        return httpx.Client(base_url=self.url, verify=client_tls(self.pki.ca.cert, pair), timeout=30)

    # ---- components ----------------------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        """etcd over TLS that takes only clients with a certificate of the cluster's CA (the API server's):
        over plain HTTP any account on the host could read and write every object, Secrets included."""
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"https://127.0.0.1:{client_port}"
        self.etcd_peer_url = f"https://127.0.0.1:{peer_port}"
        serving = self.pki.issue("etcd", "etcd", server_names=("127.0.0.1", "localhost"))
        self.etcd_client = self.pki.issue("apiserver-etcd-client", "kube-apiserver-etcd-client")
        self._run(
            "etcd",
            [
                str(self.programs.etcd),
                "--name=local",
                f"--data-dir={self.folder / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--cert-file={serving.cert}",
                f"--key-file={serving.key}",
                "--client-cert-auth",
                f"--trusted-ca-file={self.pki.ca.cert}",
                # one member, so no peer ever connects; the port takes only the cluster's certificates all
                # the same (over plain HTTP anyone on the host could post raft messages to it)
                f"--listen-peer-urls=https://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=https://127.0.0.1:{peer_port}",
                f"--initial-cluster=local=https://127.0.0.1:{peer_port}",
                f"--peer-cert-file={serving.cert}",
                f"--peer-key-file={serving.key}",
                "--peer-client-cert-auth",
                f"--peer-trusted-ca-file={self.pki.ca.cert}",
                "--unsafe-no-fsync",  # a throw-away cluster: nothing to keep across a power cut
                "--quota-backend-bytes=2147483648",
                "--log-level=warn",
            ],
        )
        tls = client_tls(self.pki.ca.cert, self.etcd_client)
        _wait(
            lambda: (
                httpx.get(f"{self.etcd_url}/health", timeout=2, verify=tls).json().get("health") == "true"
            ),
            "etcd",
            self,
        )

    def _start_apiserver(self) -> None:
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        serving = self.pki.issue(
            "apiserver",
            "kube-apiserver",
            server_names=(
                "127.0.0.1", "localhost", SERVICE_IP, "kubernetes", "kubernetes.default",
                "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
            ),
        )  # fmt: skip
        kubelet_client = self.pki.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
        )
        accounts = service_account_keys(self.folder / "pki")
        command = [
            str(self.programs.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--etcd-cafile={self.pki.ca.cert}",
            f"--etcd-certfile={self.etcd_client.cert}",
            f"--etcd-keyfile={self.etcd_client.key}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.folder / 'apiserver-certs'}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.pki.ca.cert}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={accounts.cert}",
            f"--service-account-signing-key-file={accounts.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            f"--kubelet-certificate-authority={self.pki.ca.cert}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=false",
            "--profiling=false",
            "--v=1",
        ]
        self._commands["kube-apiserver"] = command
        self._run("kube-apiserver", command)
        self._wait_ready()
        write_kubeconfig(self.admin_kubeconfig, self.url, self.pki.ca.cert, self.admin)

    def _start_controllers(self) -> None:
        accounts = service_account_keys(self.folder / "pki")
        manager = self.kubeconfig_for("controller-manager", "system:kube-controller-manager")
        scheduler = self.kubeconfig_for("scheduler", "system:kube-scheduler")
        common = ["--leader-elect=false", "--bind-address=127.0.0.1", "--v=1"]
        self._run(
            "kube-controller-manager",
            [
                str(self.programs.kube_controller_manager),
                f"--kubeconfig={manager}",
                f"--authentication-kubeconfig={manager}",
                f"--authorization-kubeconfig={manager}",
                f"--secure-port={free_port()}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={accounts.key}",
                f"--root-ca-file={self.pki.ca.cert}",
                f"--cluster-signing-cert-file={self.pki.ca.cert}",
                f"--cluster-signing-key-file={self.pki.ca.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--node-monitor-period=2s",
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE_S}s",
                "--concurrent-job-syncs=5",
                *common,
            ],
        )
        self._run(
            "kube-scheduler",
            [
                str(self.programs.kube_scheduler),
                f"--kubeconfig={scheduler}",
                f"--authentication-kubeconfig={scheduler}",
                f"--authorization-kubeconfig={scheduler}",
                f"--secure-port={free_port()}",
                *common,
            ],
        )

    def _run(self, name: str, command: list[str]) -> None:
        log = (self.folder / "logs" / f"{name}.log").open("ab")
        self._processes[name] = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder, start_new_session=True
        )
        log.close()

    def _wait_ready(self) -> None:
        def ready() -> bool:
            with self.client() as api:
                return api.get("/readyz", timeout=2).status_code == 200

        _wait(ready, "kube-apiserver", self, timeout_s=120)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.folder / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def exited(self) -> dict[str, int]:
        """Components that have exited, with their exit codes."""
        return {n: code for n, p in self._processes.items() if (code := p.poll()) is not None}


def _wait(ready: Any, name: str, plane: ControlPlane, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if name in plane.exited():
            raise ControlPlaneError(f"{name} exited at start-up:\n{plane.log_tail(name)}")
        try:
            if ready():
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise ControlPlaneError(f"{name} was not ready within {timeout_s:.0f} s:\n{plane.log_tail(name)}")


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
