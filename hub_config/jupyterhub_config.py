"""Production JupyterHub configuration for one multi-GPU server whose users have system accounts.

``gpupool install`` (README, "One server") copies it to ``/etc/gpupool/jupyterhub_config.py`` and installs the
unit ``gpupool.service``, which runs it as root (the spawner starts each server as its user) from the state
folder ``/var/lib/gpupool``, with ``/etc/gpupool/environment`` read first::

    cd /var/lib/gpupool
    /opt/gpupool/env/bin/python -m gpupool.spawner.hub.app -f /etc/gpupool/jupyterhub_config.py

What differs from the embedded demo (``gpupool up``): users log in with their system passwords (PAM) and
servers run as them (``LocalGPUSpawner``), the pool is this host's GPUs through NVML, the profiles file is
yours, and the hub listens on every address, so put TLS in front of it or set ``ssl_cert``/``ssl_key``.
Change the values marked ``EDIT``; everything else states a choice gpupool relies on.
"""

import os
import sys
from pathlib import Path

from gpupool.spawner.hub.compat import service_start_timeout
from gpupool.spawner.hub.up import CULLER_SCOPES, culler_command, read_or_create_secret, templates
from gpupool.spawner.hub.up_checks import UpError, check_data_files, require_real_pool
from gpupool.spawner.hub.up_running import HUB_PID_FILE, running_hub
from gpupool.spawner.orphans import parent_environment
from gpupool.spawner.service.settings import passed_on

c = get_config()  # type: ignore[name-defined]  # noqa: F821  (JupyterHub provides it)

STATE = Path.cwd()  # databases, cookie secret and tokens live beside each other, readable by root only
# One hub per state folder: a second one would stop the running hub's proxy (its pid file says where) and
# leave port 8000 dead until the first one noticed.
if (HUB_PID := running_hub(STATE)) is not None:
    sys.exit(
        f"gpupool: a hub already runs from {STATE} (pid {HUB_PID}): stop it first "
        f"(systemctl stop gpupool, or kill {HUB_PID})"
    )
c.JupyterHub.pid_file = str(STATE / HUB_PID_FILE)
PROFILES = os.environ.get("GPUPOOL_PROFILES", "/etc/gpupool/profiles.yaml")  # EDIT
QUOTAS = os.environ.get("GPUPOOL_QUOTAS", "/etc/gpupool/quotas.yaml")  # EDIT (see quotas.yaml)
ADMINS = {"root"}  # EDIT: who administers the hub and sees every lease: accounts in USERS_GROUP that log in
USERS_GROUP = "gpu-users"  # EDIT: the system group whose members may log in

# --- The pool is this host's GPUs ------------------------------------------------------------------------------
# Checked first: with no NVIDIA driver or no GPUs the hub stops here, non-zero, with NVML's error, rather than
# start and fail every spawn. GPUPOOL_POOL (a pool file) or GPUPOOL_SIMULATED_FALLBACK=1 in the hub's environment
# serve a simulated pool on purpose, for a trial; the service gets them with its other settings below.
require_real_pool()
# The profiles and quotas files, read now: a mistake stops the hub in one line naming the file and field.
try:
    check_data_files({"GPUPOOL_PROFILES": PROFILES, "GPUPOOL_QUOTAS": QUOTAS})
except UpError as error:
    sys.exit(f"gpupool: {error}")

# --- Network -------------------------------------------------------------------------------------------------
# Users reach only the proxy. The hub and the gpupool service listen on loopback: nothing else needs them.
c.JupyterHub.bind_url = "http://:8000"  # EDIT: behind a TLS-terminating reverse proxy, or:
# c.JupyterHub.ssl_cert = "/etc/letsencrypt/live/gpu.example.org/fullchain.pem"
# c.JupyterHub.ssl_key = "/etc/letsencrypt/live/gpu.example.org/privkey.pem"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")

# --- Who may log in ------------------------------------------------------------------------------------------
# PAM checks system passwords; only members of USERS_GROUP get in, so a new system account is not a new hub
# user by accident. Admin users get JupyterHub's admin panel; the gpupool-admin role below adds the pool.
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {USERS_GROUP}
c.Authenticator.admin_users = ADMINS
# Profiles and quotas restricted to groups (e.g. "training") count both the user's system groups (as
# /etc/group or LDAP lists them: LocalGPUSpawner.system_groups and the service's GPUPOOL_SYSTEM_GROUPS) and their
# JupyterHub groups (the admin panel or the REST API).

# --- Spawner -------------------------------------------------------------------------------------------------
# Each server runs as its system user, pinned to the devices its lease names (CUDA_VISIBLE_DEVICES).
# The spawner never picks a device itself: it asks the gpupool service, with a token of its own that may
# lease for any user. The token is made once and kept beside the database, because the hub keeps every
# config token it has ever seen: a new one per start would leave the old ones valid.
SPAWNER_TOKEN = read_or_create_secret(STATE / "gpupool-hub-token")
c.JupyterHub.spawner_class = "gpupool"  # LocalGPUSpawner (also "gpupool-simple", "gpupool-kube")
c.LocalGPUSpawner.service_url = "http://127.0.0.1:10101/services/gpupool/"  # straight to the service
c.LocalGPUSpawner.service_api_token = SPAWNER_TOKEN
c.LocalGPUSpawner.profiles_file = PROFILES  # the form and the service must read the same file
c.Spawner.default_url = "/lab"
# A hub restart (an upgrade, a config change) leaves running servers and their leases alone: the new hub finds
# each one by its pid and carries on, so users notice nothing.
c.JupyterHub.cleanup_servers = False
c.Spawner.start_timeout = 600  # a queued spawn waits up to this long for devices before it gives up

# --- Services ------------------------------------------------------------------------------------------------
c.JupyterHub.custom_scopes = {
    "custom:gpupool:leases": {"description": "Create, read and release gpupool leases for any user"},
    "custom:gpupool:admin": {"description": "Read and release every gpupool lease, use every profile"},
}
c.JupyterHub.template_paths = [str(templates())]  # the home page shows a user's pending cull warnings
c.JupyterHub.services = [
    {
        # The only owner of the pool. Without GPUPOOL_POOL it reads this host's GPUs through NVML; with no
        # driver or no GPUs it stops, naming NVML's error (GPUPOOL_SIMULATED_FALLBACK=1 serves the simulated
        # demo pool instead, for a trial; never on a hub users rely on).
        "name": "gpupool",
        "url": "http://127.0.0.1:10101",
        "command": [sys.executable, "-m", "gpupool.spawner.service"],
        "environment": {
            "GPUPOOL_PROFILES": PROFILES,
            "GPUPOOL_QUOTAS": QUOTAS,  # per user and per group limits; leave it out for none
            "GPUPOOL_POLICY": "gpupool",  # placement: gpupool (default), fgd, best-fit, spread, first-fit
            "GPUPOOL_STOP_UNLEASED": "1",  # stop a server holding no lease, confirmed by two passes a minute apart
            "GPUPOOL_SYSTEM_GROUPS": "1",  # a job's profile and quota count the user's system groups too
            "GPUPOOL_DB_URL": f"sqlite:///{STATE / 'gpupool.sqlite'}",
            # Any setting of the service's in /etc/gpupool/environment (root's alone) wins over those above,
            # e.g. GPUPOOL_DB_URL=postgresql+psycopg://gpupool:PASSWORD@db.example.org/gpupool: a password
            # there is not in this file, which every account can read.
            **passed_on(os.environ),
            **parent_environment(),  # a hub killed with -9 takes the service along, even mid-start
        },
        "cwd": str(STATE),
        # its pages (dashboard, cull warnings on the hub's home page) let logged-in users in through the
        # hub's OAuth without a confirmation page; an admin's login carries the admin scope, nobody else's
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": ["custom:gpupool:admin"],
        # a cold first start (imports from disk, a busy machine) can take longer than the 30 s default,
        # and JupyterHub exits when a managed service is not up in time (JupyterHub 6+; 5.x waits ~10 s)
        **service_start_timeout(120),
    },
    {
        # Stops idle servers; their leases go back to the pool with them. gpupool's arbiter (see
        # gpupool.spawner.hub.cull) applies each profile's idle_timeout, gpu_idle_timeout and max_lifetime
        # (--timeout is for servers whose profile sets none), never culls a server whose GPUs are busy for
        # inactivity, and warns the user GPUPOOL_CULL_WARNING_SECONDS ahead.
        "name": "jupyterhub-idle-culler",
        "command": culler_command(timeout=3600, cull_every=60),
        "environment": {
            "GPUPOOL_SERVICE_URL": "http://127.0.0.1:10101/services/gpupool/",
            "GPUPOOL_CULL_WARNING_SECONDS": "900",  # EDIT: how long ahead users are warned
            **parent_environment(),
        },
    },
    {"name": "gpupool-hub", "api_token": SPAWNER_TOKEN},  # the spawners' identity towards the service
]

# --- Roles ---------------------------------------------------------------------------------------------------
# Users may call the service (read the pool and profiles, manage their own leases) but never act for others.
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", "access:services!service=gpupool"]},
    {  # a server's own token may call the service too (gpupool.widgets in a notebook); the first two scopes are
        # JupyterHub's defaults for this role, which a role of this name replaces
        "name": "server",
        "scopes": ["users:activity!user", "access:servers!server", "access:services!service=gpupool"],
    },
    {
        "name": "gpupool-hub",
        "scopes": ["custom:gpupool:leases", "access:services!service=gpupool"],
        "services": ["gpupool-hub"],
    },
    {
        "name": "gpupool-admin",
        "scopes": ["custom:gpupool:admin", "access:services!service=gpupool"],
        "users": sorted(ADMINS),
    },
    {
        "name": "idle-culler",
        "scopes": list(CULLER_SCOPES),  # with admin:server_state, custom:gpupool:admin and gpupool access
        "services": ["jupyterhub-idle-culler"],
    },
    {  # reconciliation (the leases against the servers that really run), and the group names the files use
        "name": "gpupool-service",
        "scopes": ["list:users", "read:servers", "delete:servers", "list:groups"],
        "services": ["gpupool"],
    },
]
