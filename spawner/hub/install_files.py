"""What ``gpupool install`` writes besides the Python environment: where each part goes, the launcher, the
systemd unit and the environment file, and the headers that mark the demo's profiles and quotas as examples."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

UNIT_NAME = "gpupool.service"


@dataclass(frozen=True)
class Layout:
    """Where an install puts things: programs under ``prefix``, the admin's files in ``config``, the hub's
    databases and secrets in ``state``, the systemd unit in ``units``."""

    prefix: Path = Path("/opt/gpupool")
    config: Path = Path("/etc/gpupool")
    state: Path = Path("/var/lib/gpupool")
    units: Path = Path("/etc/systemd/system")

    @property
    def env(self) -> Path:
        """The Python environment of the hub, the service and every user's servers and jobs."""
        return self.prefix / "env"

    @property
    def node(self) -> Path:
        """configurable-http-proxy, installed with npm."""
        return self.prefix / "node"

    @property
    def proxy_bin(self) -> Path:
        return self.node / "node_modules" / ".bin"

    @property
    def launcher(self) -> Path:
        return self.prefix / "bin" / "gpupool-hub"

    @property
    def unit(self) -> Path:
        return self.units / UNIT_NAME

    @property
    def environment_file(self) -> Path:
        return self.config / "environment"

    @property
    def hub_config(self) -> Path:
        return self.config / "jupyterhub_config.py"


# Reads the environment file's KEY=value lines with each value as written, `$`, backslashes and inner spaces
# included (a shell's `. file` expanded a password's `$` and split it at a space). Only the blanks around a
# line, a pair of quotes around a value (which keep blanks at its ends) and an `export ` before it are dropped.
_READ_SETTINGS = r"""if [ -r @ENVIRONMENT@ ]; then
    n=0
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        line=${line#"${line%%[![:space:]]*}"}
        line=${line%"${line##*[![:space:]]}"}
        case $line in '' | '#'*) continue ;; esac
        line=${line#export }
        key=${line%%=*}
        value=${line#*=}
        case $line in
            *=*) ;;
            *) key= ;;
        esac
        case $key in
            '' | [0-9]* | *[!A-Za-z0-9_]*)
                echo "gpupool-hub: @ENVIRONMENT@, line $n: expected KEY=value (a name of letters, digits and _)" >&2
                exit 2
                ;;
        esac
        case $value in
            \"*\") value=${value#\"}; value=${value%\"} ;;
            \'*\') value=${value#\'}; value=${value%\'} ;;
        esac
        export "$key=$value"
    done < @ENVIRONMENT@
fi"""


def launcher(layout: Layout) -> str:
    """The hub's start as the unit runs it; without systemd, run this very file (as root)."""
    q = shlex.quote
    path = f"{layout.env / 'bin'}:{layout.proxy_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    settings = _READ_SETTINGS.replace("@ENVIRONMENT@", q(str(layout.environment_file)))
    return f"""#!/bin/sh
# gpupool's JupyterHub, started as {UNIT_NAME} starts it. Run it as root: the hub starts each user's
# server as that user. Settings: {layout.environment_file}; configuration: {layout.hub_config}.
set -e
{settings}
# servers and jobs find jupyterhub-singleuser and python here first, the hub its proxy
export PATH={q(path)}
cd {q(str(layout.state))}
# JupyterHub as gpupool up runs it: a start that fails (a service refusing a setting) takes its proxy along
exec {q(str(layout.env / "bin" / "python"))} -m gpupool.spawner.hub.app -f {q(str(layout.hub_config))} "$@"
"""


def unit(layout: Layout) -> str:
    return f"""# gpupool: JupyterHub with a GPU pool on this host (written by `gpupool install`).
[Unit]
Description=gpupool JupyterHub (GPU pool)
After=network-online.target
Wants=network-online.target

[Service]
ExecStart={layout.launcher}
# Only the hub is signalled on stop: it stops its proxy and services itself, and users' servers (and their
# leases) carry on through a restart, as the configuration's cleanup_servers = False intends.
KillMode=process
Restart=on-failure
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
"""


def environment(layout: Layout, simulated_pool: Path | None) -> str:
    pool = (
        f"GPUPOOL_POOL={simulated_pool}"
        if simulated_pool
        else f"# GPUPOOL_POOL={layout.config / 'pool.yaml'}"
    )
    return f"""# Settings of gpupool's hub, read by {layout.launcher} (and so by {UNIT_NAME}); KEY=value lines,
# each value as written (no shell quoting needed: a password may hold $ or spaces; quotes around it are dropped,
# as are blanks at the line's ends). Any setting of the gpupool
# service (GPUPOOL_DB_URL, GPUPOOL_POLICY, ... see the README's table) reaches the service from here.
#
# The pool is this host's GPUs, read through NVML; with no NVIDIA driver or no GPUs the hub refuses to start
# and says why. To try gpupool without GPUs, name a pool file of simulated GPUs (labelled "simulated" in the
# spawn form and the API); never on a hub users rely on:
{pool}
#
# Another profiles or quotas file than {layout.config}/profiles.yaml and quotas.yaml:
# GPUPOOL_PROFILES=...
# GPUPOOL_QUOTAS=...
"""


EXAMPLE_HEADER = """# Written by `gpupool install` from gpupool's demo: EXAMPLES, made for the simulated demo pool. Edit
# them for this host's GPUs (`gpupool pool` lists them) and restart the hub. The schema follows.
#
"""
