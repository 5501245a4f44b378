"""The embedded hub that ``gpupool up`` starts: one machine, one demo user, everything in one state folder.

``gpupool up`` passes its options in the environment (``GPUPOOL_UP``, see ``gpupool.spawner.hub.up``); run
directly (``jupyterhub -f hub_config/embedded.py``) it keeps its state in ``.gpupool/`` of the working
directory. Files given with ``gpupool up -f`` are loaded last and may change anything here.
For a shared server with system users, start from ``hub_config/jupyterhub_config.py`` instead.
"""

import os
import sys
from pathlib import Path

from gpupool.spawner.hub import up, up_checks
from gpupool.spawner.hub.up_running import HUB_PID_FILE, PROXY_PID_FILE
from gpupool.spawner.hub.up_service_config import pass_to_service

c = get_config()  # type: ignore[name-defined]  # noqa: F821  (JupyterHub provides it)
settings = up.UpSettings.from_env(os.environ)
state = settings.state

# Where it listens. The hub and its proxy API stay on loopback; only the proxy faces users.
c.JupyterHub.ip = settings.ip
c.JupyterHub.port = settings.port
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = settings.hub_port
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.proxy_api_port}"
c.ConfigurableHTTPProxy.command = [settings.proxy_command]
# Routes for the hub and the services as soon as the proxy runs, not once every service answers: the login
# page does not wait on the gpupool service's start, and requests for the service wait on its port.
c.JupyterHub.proxy_class = "gpupool.spawner.hub.proxy.RoutedAtStartProxy"

# All state in one folder, so a restart (or another folder) is a clean, separate hub. The proxy token is
# kept too: a proxy left running by a killed hub is then picked up again instead of blocking the port.
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / HUB_PID_FILE)  # read before a start: is a hub running here?
c.ConfigurableHTTPProxy.pid_file = str(state / PROXY_PID_FILE)
c.ConfigurableHTTPProxy.auth_token = up.read_or_create_secret(state / "proxy-auth-token")

# The gpupool service owns the pool; the culler stops idle servers (their leases go back with them); the
# spawners lease with the token of a service of their own, never with a user's token.
c.JupyterHub.custom_scopes = up.CUSTOM_SCOPES
c.JupyterHub.services = up.services(settings)
c.JupyterHub.load_roles = up.roles([up.DEMO_USER] if settings.demo_login else [])
c.JupyterHub.template_paths = [str(up.templates())]  # the home page shows pending cull warnings

# Spawners without system users: every server runs as the account that started the hub, with its home in
# the state folder; started as root, each user's as an account of their own, made at their first start.
# They reach the service directly, not through the proxy.
c.JupyterHub.spawner_class = "gpupool-simple"  # SimpleLocalGPUSpawner
c.SimpleLocalGPUSpawner.home_root = settings.homes or str(state / "homes")
c.LocalGPUSpawner.service_url = settings.service_url
c.LocalGPUSpawner.service_api_token = up.spawner_token(state)
c.Spawner.default_url = "/lab"
# A queued spawn waits for its devices up to this long (JupyterHub's own 60 s gave up on a queue of one);
# the progress page says its place in the queue meanwhile.
c.Spawner.start_timeout = 600
# The single-user server from the same environment as the hub, whether or not that environment is on PATH;
# as root, from the environment every account can run, which is first on their PATH too.
c.Spawner.cmd = [str(Path(settings.user_bin or Path(sys.executable).parent) / "jupyterhub-singleuser")]
if settings.own_accounts and settings.user_bin:
    c.SimpleLocalGPUSpawner.account_per_user = True
    c.Spawner.environment = {"PATH": up.user_path(settings.user_bin)}
elif os.geteuid() == 0 and not settings.kubeconfig:
    raise RuntimeError(
        "as root, start the embedded hub with `gpupool up`: it runs each user's servers and jobs as an "
        "unprivileged account of their own (jupyterhub -f embedded.py would run them as root)"
    )

# With --kubeconfig, servers are pods on that cluster, on the node and resources of their lease. Made for
# `gpupool kube up`'s local cluster: its kubelet runs the pod's command (the singleuser server above) on this
# machine at an address of the pod's own, which the hub reaches on loopback.
if settings.kubeconfig:
    os.environ.setdefault("KUBECONFIG", settings.kubeconfig)  # gpupool up sets it; `jupyterhub -f` may not
    c.JupyterHub.spawner_class = "gpupool-kube"  # KubeGPUSpawner
    c.JupyterHub.hub_connect_ip = "127.0.0.1"
    c.KubeGPUSpawner.namespace = settings.kube_namespace
    c.KubeGPUSpawner.image = up.KUBE_LOCAL_IMAGE
    c.KubeGPUSpawner.service_url = settings.service_url
    c.KubeGPUSpawner.service_api_token = up.spawner_token(state)
    # Each user's home is a volume claim, claim-<user>, made at their first server, as Zero to JupyterHub's
    # dynamic storage makes it; their training Jobs mount it. The local cluster gives each such claim a volume.
    c.KubeGPUSpawner.storage_pvc_ensure = True
    c.KubeGPUSpawner.storage_class = ""
    c.KubeGPUSpawner.storage_capacity = "1Gi"
    c.KubeGPUSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}]
    c.KubeGPUSpawner.volume_mounts = [{"name": "home", "mountPath": "/home/jovyan"}]
    c.KubeGPUSpawner.working_dir = "/home/jovyan"  # a Jupyter image's WORKDIR; the local kubelet pulls none
    if os.geteuid() == 0:
        # the local cluster's simulated kubelet stands in for a container runtime and runs the pod's command as
        # its own user, root on a root-only dev box or CI; a real cluster runs it as the image's user
        c.KubeGPUSpawner.args = ["--allow-root"]

# The demo login: one admin user whose generated password `gpupool up` prints; only on loopback (checked by
# `gpupool up` before it gets here). Without it, JupyterHub's default (PAM) or an -f file decides.
if settings.demo_login:
    c.JupyterHub.authenticator_class = "shared-password"
    c.Authenticator.allowed_users = {up.DEMO_USER}
    c.Authenticator.admin_users = {up.DEMO_USER}
    c.SharedPasswordAuthenticator.admin_password = up.demo_password(state)

for extra in settings.extra_config:
    try:
        load_subconfig(extra)  # type: ignore[name-defined]  # noqa: F821
    except SyntaxError as error:  # one line, where JupyterHub printed thirty of its own traceback
        raise SystemExit(f"gpupool: -f {extra}, line {error.lineno}: {error.msg}") from None
if c.JupyterHub.authenticator_class == "shared-password":  # an -f file's passwords, checked in one line
    up_checks.check_shared_passwords(c)

# One profiles file for the spawn form and the service (GPUPOOL_PROFILES, or what an -f file gave either), and
# the service's own settings from the -f files (c.ServiceSettings.policy = "fgd") on its command line.
pass_to_service(c, up.SERVICE, kube=bool(settings.kubeconfig))
