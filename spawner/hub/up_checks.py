"""What a hub checks before it starts anything: for ``gpupool up``, the request makes sense and the profiles
and quotas the hub and the service will read load; for the production configuration, the pool is real."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..files.quotas_file import EXAMPLE_QUOTAS


class UpError(RuntimeError):
    """A start-up problem the user can fix; the message says how."""


def is_loopback(ip: str) -> bool:
    """Whether only this machine can reach ``ip`` (``localhost``, 127.0.0.0/8, ``::1``)."""
    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def check_request(
    ip: str, pool: str | None, extra_config: tuple[str, ...], demo_login: bool, kubeconfig: str | None
) -> None:
    if demo_login and not is_loopback(ip):
        raise UpError(
            f"the demo login (one user, a printed password) only listens on this machine, not on --ip {ip}; "
            "serve other machines with the production configuration: "
            "`jupyterhub -f hub_config/jupyterhub_config.py` (or pass --no-demo-login and an authenticator in -f)"
        )
    for extra in extra_config:
        if not Path(extra).is_file():
            raise UpError(f"-f {extra}: {_not_a_file(extra)}")
    if pool is not None and not Path(pool).is_file():
        raise UpError(f"--pool {pool}: {_not_a_file(pool)}")
    if kubeconfig is not None and pool is not None:
        raise UpError("--pool and --kubeconfig: choose one; on Kubernetes the pool is the cluster's nodes")
    if kubeconfig is not None and not Path(kubeconfig).is_file():
        raise UpError(f"--kubeconfig {kubeconfig}: no such file (gpupool kube up prints the path of its own)")


def _not_a_file(path: str) -> str:
    return "a folder, not a file" if Path(path).is_dir() else "no such file"


def check_ports(port: int, ports: tuple[int | None, int | None, int | None]) -> dict[str, int]:
    """Every port in range, and no two the same (the internal ones default to ``port`` + 1, + 81, + 2101);
    each port by the flag that sets it."""
    derived = (port + 1, port + 81, port + 2101)
    named = {"--port": port}
    for flag, given, default in zip(
        ("--proxy-api-port", "--hub-port", "--service-port"), ports, derived, strict=True
    ):
        named[flag] = given or default
    for flag, value in named.items():
        if not 0 < value < 65536:
            raise UpError(
                f"{flag} {value}: a port is 1 to 65535 (set the internal ports when --port is high)"
            )
    taken: dict[int, str] = {}
    for flag, value in named.items():
        if value in taken:
            raise UpError(f"{flag} {value}: {taken[value]} uses that port already; give each its own")
        taken[value] = flag
    return named


def check_data_files(environ: Mapping[str, str]) -> None:
    """Read the profiles and quotas the hub and the service will read, now: a mistake (the loaders name the
    file, line and field) stops ``gpupool up`` on the terminal before anything starts."""
    from ..files.profiles_file import EXAMPLE_PROFILES, load_profiles
    from ..files.quotas_file import load_quotas

    try:
        load_profiles(environ.get("GPUPOOL_PROFILES") or EXAMPLE_PROFILES)
        load_quotas(environ.get("GPUPOOL_QUOTAS") or EXAMPLE_QUOTAS)
    except (OSError, ValueError) as error:
        raise UpError(str(error)) from None


def require_real_pool(environ: Mapping[str, str] = os.environ) -> None:
    """For the production configuration, while JupyterHub loads it: stop the hub now, exiting non-zero with
    NVML's error on the terminal, when the gpupool service would refuse to start for want of real GPUs (no
    driver, or none found), instead of a hub whose every spawn then fails. ``GPUPOOL_POOL`` (a pool file) or
    ``GPUPOOL_SIMULATED_FALLBACK=1`` in the hub's environment ask for a simulated pool on purpose."""
    from ..backends.discovery import NoRealGpus, discover_pool

    fallback = environ.get("GPUPOOL_SIMULATED_FALLBACK", "").lower() in ("1", "true", "yes")
    try:
        discover_pool(environ.get("GPUPOOL_POOL") or None, simulated_fallback=fallback)
    except (NoRealGpus, OSError, ValueError) as error:
        raise SystemExit(f"gpupool: {error}") from None


def kubeconfig_namespace(kubeconfig: str) -> str:
    """The namespace of the kubeconfig's current context, where kubectl works too; else ``default``."""
    try:
        config = yaml.safe_load(Path(kubeconfig).read_text()) or {}
        contexts = {entry.get("name"): entry.get("context") or {} for entry in config.get("contexts") or []}
        return str(contexts.get(config.get("current-context"), {}).get("namespace") or "default")
    except (OSError, yaml.YAMLError, AttributeError, TypeError) as error:
        raise UpError(f"--kubeconfig {kubeconfig}: not a kubeconfig ({error})") from None


def check_shared_passwords(c: Any) -> None:
    """SystemExit, in one line, when the shared-password login's passwords break its rules (under 8 or 32
    characters, or one for both): JupyterHub would say so at the end of a 60-line traceback."""
    from jupyterhub.authenticators.shared import SharedPasswordAuthenticator  # type: ignore[import-untyped]
    from traitlets import TraitError

    try:
        SharedPasswordAuthenticator(config=c)
    except (ValueError, TraitError) as error:
        raise SystemExit(f"gpupool: {error}") from None
