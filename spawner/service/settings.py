"""Every setting of the gpupool service, as traits of one traitlets ``Application``.

As in JupyterHub and jupyterhub-idle-culler, each setting is a trait with ``help=`` text, checked when it is
set, so a bad value stops the service before its port opens, naming the setting. A setting comes from, in
order of precedence: the command line (``--ServiceSettings.policy=fgd``), a config file
(``GPUPOOL_CONFIG_FILE``, ``c.ServiceSettings.policy = "fgd"``), its environment variable (the ``env`` tag:
what JupyterHub sets for a managed service, and gpupool's own ``GPUPOOL_*``), then the default.
:func:`settings_table` writes the table the README shows.

This module only reads and checks settings; :mod:`.assembly` builds the service from them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from traitlets import Bool, Float, Int, TraitError, TraitType, Unicode, validate
from traitlets.config import Application, Config

from ..files.profiles_file import EXAMPLE_PROFILES
from ..kube.labels import SHARED_RESOURCE
from ..kube.manifests import ManifestError, require_dns_label
from ..names import SERVICE_NAME, SERVICE_PREFIX
from ..pool.job_states import PRIORITY_CLASSES
from ..pool.policies import policy_by_name

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


class ServiceSettings(Application):
    """The gpupool service's settings; see the module docstring for where each comes from."""

    name = "gpupool-service"
    description = "The gpupool service: leases of GPUs, MIG slices and GPU shares for JupyterHub."

    config_file = Unicode(
        "",
        help="A Python config file loaded after the environment, e.g. /etc/gpupool/service_config.py holding "
        "`c.ServiceSettings.policy = 'fgd'`. Empty: none.",
    ).tag(config=True, env="GPUPOOL_CONFIG_FILE")

    # ---- the pool ----------------------------------------------------------------------------------------
    backend = Unicode(
        "local",
        help="Where the pool comes from: `local` (a pool file, else this host's GPUs through NVML, else a "
        "refusal to start, or the demo pool with `simulated_fallback`) or `kubernetes` (the cluster's nodes "
        "and pods, through `kubeconfig` or the pod's service account).",
    ).tag(config=True, env="GPUPOOL_BACKEND")
    pool_file = Unicode(
        "", help="A pool file (the simulated backend), e.g. hub_config/pools/demo.yaml. Empty: discover."
    ).tag(config=True, env="GPUPOOL_POOL")
    profiles_file = Unicode(
        str(EXAMPLE_PROFILES), help="The profiles file; the default is the shipped example."
    ).tag(config=True, env="GPUPOOL_PROFILES")
    simulated_fallback = Bool(
        False,
        help="Without an NVIDIA driver or GPUs (and no pool file), serve the simulated demo pool, labelled "
        "simulated, instead of stopping at start with NVML's error. gpupool up sets it; a production hub "
        "should not.",
    ).tag(config=True, env="GPUPOOL_SIMULATED_FALLBACK")
    quotas_file = Unicode(
        "",
        help="A quotas file, e.g. hub_config/quotas.yaml. Empty: each user may hold half the pool's CPUs, "
        "memory, whole or shared GPUs and MIG slices (or what the largest profile asks, if more).",
    ).tag(config=True, env="GPUPOOL_QUOTAS")
    policy = Unicode(
        "gpupool", help="The placement policy by name: gpupool, fgd, best-fit, first-fit, spread or random."
    ).tag(config=True, env="GPUPOOL_POLICY")
    db_url = Unicode(
        "",
        help="The lease store as an SQLAlchemy URL, e.g. postgresql+psycopg://gpupool@db/gpupool (the "
        "driver comes with pip install 'jupyterhub-gpupool[postgresql]'). Empty: gpupool.sqlite in the working "
        "directory. One service owns a database: a second one pointed at it refuses to start.",
    ).tag(config=True, env="GPUPOOL_DB_URL")

    store_check_seconds = Float(
        10.0,
        help="Seconds between looks at the PostgreSQL store's lock, which a database restart drops: the "
        "service takes it again, or stops if another service took the database meanwhile. 0: never look.",
    ).tag(config=True, env="GPUPOOL_STORE_CHECK_SECONDS")

    @property
    def store_url(self) -> str:
        """:attr:`db_url`, or the SQLite file it defaults to."""
        return self.db_url or f"sqlite:///{Path.cwd() / 'gpupool.sqlite'}"

    # ---- loops -------------------------------------------------------------------------------------------
    reconcile_seconds = Float(
        60.0,
        help="Seconds between passes that reconcile leases with the hub's servers, and retire users who hold "
        "leases and whom the hub no longer has (needs the hub API token with list:users and read:servers). 0 "
        "turns it off.",
    ).tag(config=True, env="GPUPOOL_RECONCILE_SECONDS")
    stop_unleased = Bool(
        False,
        help="Stop a server that runs a gpupool profile without a lease, once two reconcile passes in a row "
        "confirm it (needs delete:servers). False: only report it.",
    ).tag(config=True, env="GPUPOOL_STOP_UNLEASED")
    sample_seconds = Float(
        2.0, help="Seconds between telemetry samples; 0 turns sampling off, else at least 0.1."
    ).tag(config=True, env="GPUPOOL_SAMPLE_SECONDS")
    gpu_idle_threshold = Float(
        10.0,
        help="Utilisation in percent (0 to under 100) at or below which a held GPU counts as idle for the "
        "profiles' gpu_idle_timeout.",
    ).tag(config=True, env="GPUPOOL_GPU_IDLE_THRESHOLD")
    metrics_public = Bool(
        False,
        help="Serve /metrics without a token. False: an admin's token (custom:gpupool:admin) is needed.",
    ).tag(config=True, env="GPUPOOL_METRICS_PUBLIC")

    # ---- jobs --------------------------------------------------------------------------------------------
    job_grace_seconds = Float(
        30.0, help="Seconds between SIGTERM and SIGKILL when a job is stopped (a pod's termination grace)."
    ).tag(config=True, env="GPUPOOL_JOB_GRACE_SECONDS")
    max_queued_jobs = Int(100, help="Jobs one user may have waiting at once.").tag(
        config=True, env="GPUPOOL_MAX_QUEUED_JOBS"
    )
    preempt_after_seconds = Float(
        1800.0,
        help="Seconds a server may wait in the queue before the pool stops and requeues a running job of a "
        "preemptible class whose devices would serve it (youngest first, with its checkpoint folder; no retry "
        "used). 0: never preempt.",
    ).tag(config=True, env="GPUPOOL_PREEMPT_AFTER_SECONDS")
    preemptible_classes = Unicode(
        "batch,low",
        help="The job priority classes preemption may stop, comma-separated; leave out a class to protect "
        "its jobs (interactive jobs are never preempted).",
    ).tag(config=True, env="GPUPOOL_PREEMPTIBLE_CLASSES")
    job_home_root = Unicode(
        "",
        help="The folder of users' homes (<root>/<user>) jobs run in when the service does not run as root, or "
        "runs them as job_account. Empty: the users' system homes (as root, jobs run as the user's system "
        "account), or job_account's home.",
    ).tag(config=True, env="GPUPOOL_JOB_HOME_ROOT")
    job_account = Unicode(
        "",
        help="When the service runs as root: one unprivileged system account that runs every user's jobs, in "
        "<job_home_root>/<user>. Users who share an account can read each other's files and tokens. Empty: "
        "each user's own system account.",
    ).tag(config=True, env="GPUPOOL_JOB_ACCOUNT")
    job_account_per_user = Bool(
        False,
        help="When the service runs as root and the hub's users have no system accounts: run each user's jobs as "
        "an account gpupool makes for them (gp-<name>, no password or login shell) in <job_home_root>/<user>, "
        "as the hub's SimpleLocalGPUSpawner.account_per_user does for servers (gpupool up as root sets both).",
    ).tag(config=True, env="GPUPOOL_JOB_ACCOUNT_PER_USER")
    system_groups = Bool(
        False,
        help="Count a user's groups on this host (e.g. gpu-users in /etc/group) with their JupyterHub groups "
        "for profiles and quotas restricted to groups. The production configuration sets it.",
    ).tag(config=True, env="GPUPOOL_SYSTEM_GROUPS")
    service_url = Unicode(
        "",
        help="This service as job pods reach it, prefix included (given to them for the notebook widgets), "
        "e.g. http://gpupool.jhub.svc:10101/services/gpupool/.",
    ).tag(config=True, env="GPUPOOL_SERVICE_URL")

    # ---- Kubernetes --------------------------------------------------------------------------------------
    kubeconfig = Unicode(
        "",
        help="A kubeconfig file for the kubernetes backend. Empty: the pod's service account, else ~/.kube/config.",
    ).tag(config=True, env="KUBECONFIG")
    kube_namespace = Unicode("default", help="Where gpupool's pods and Jobs go (a DNS label).").tag(
        config=True, env="GPUPOOL_KUBE_NAMESPACE"
    )
    kube_shared_resource = Unicode(
        SHARED_RESOURCE, help="The extended resource of time-sliced GPUs, e.g. nvidia.com/gpu.shared."
    ).tag(config=True, env="GPUPOOL_KUBE_SHARED_RESOURCE")
    kube_job_image = Unicode(
        "",
        help="The image training Jobs run in (the single-user image), e.g. "
        "registry.example.org/gpupool-singleuser:1.0. Required with the kubernetes backend.",
    ).tag(config=True, env="GPUPOOL_KUBE_JOB_IMAGE")
    kueue_queue = Unicode(
        "", help="A Kueue LocalQueue for training Jobs (they then start suspended). Empty: no Kueue."
    ).tag(config=True, env="GPUPOOL_KUEUE_QUEUE")
    kube_home_claim = Unicode(
        "claim-{username}", help="The user's home PersistentVolumeClaim, as KubeSpawner names it."
    ).tag(config=True, env="GPUPOOL_KUBE_HOME_CLAIM")
    kube_home_mount = Unicode("/home/jovyan", help="Where the job image expects the user's home.").tag(
        config=True, env="GPUPOOL_KUBE_HOME_MOUNT"
    )
    kube_job_ttl_seconds = Int(
        86400, help="How long a finished Job, its pod and so its log stay, in seconds."
    ).tag(config=True, env="GPUPOOL_KUBE_JOB_TTL_SECONDS")
    kube_job_refused_seconds = Float(
        300.0,
        help="Seconds a training Job may go without a pod because the cluster refuses to create one (a "
        "ResourceQuota, a LimitRange, an admission webhook) before the run fails with the cluster's reason and "
        "its GPUs go back to the pool. 0: it waits until its maximum runtime.",
    ).tag(config=True, env="GPUPOOL_KUBE_JOB_REFUSED_SECONDS")

    # ---- what JupyterHub gives a managed service -----------------------------------------------------------
    bind_url = Unicode("http://127.0.0.1:10101", help="Where the service listens.").tag(
        config=True, env="JUPYTERHUB_SERVICE_URL"
    )
    service_prefix = Unicode(SERVICE_PREFIX, help="The URL prefix the proxy forwards to the service.").tag(
        config=True, env="JUPYTERHUB_SERVICE_PREFIX"
    )
    service_name = Unicode(SERVICE_NAME, help="The service's name in the hub.").tag(
        config=True, env="JUPYTERHUB_SERVICE_NAME"
    )
    hub_api_url = Unicode("", help="The hub's API, which checks the tokens callers bring. Required.").tag(
        config=True, env="JUPYTERHUB_API_URL"
    )
    api_token = Unicode(
        "", help="The service's own hub token: reconciliation and the pages' OAuth login need it."
    ).tag(config=True, env="JUPYTERHUB_API_TOKEN")
    base_url = Unicode("/", help="The hub's base URL.").tag(config=True, env="JUPYTERHUB_BASE_URL")
    oauth_client_id = Unicode("", help="The service's OAuth client. Empty: service-<service_name>.").tag(
        config=True, env="JUPYTERHUB_CLIENT_ID"
    )

    # ---- checks, each naming the setting -------------------------------------------------------------------

    @validate("backend")
    def _backend(self, proposal: dict[str, Any]) -> str:
        if proposal["value"] not in ("local", "kubernetes"):
            raise TraitError(f"{_name('backend')} must be local or kubernetes, got {proposal['value']!r}")
        return str(proposal["value"])

    @validate("policy")
    def _policy(self, proposal: dict[str, Any]) -> str:
        try:
            policy_by_name(proposal["value"])
        except ValueError as error:
            raise TraitError(f"{_name('policy')}: {error}") from None
        return str(proposal["value"])

    @validate("preemptible_classes")
    def _preemptible_classes(self, proposal: dict[str, Any]) -> str:
        names = [name.strip() for name in str(proposal["value"]).split(",") if name.strip()]
        unknown = [name for name in names if name not in PRIORITY_CLASSES or name == "interactive"]
        if unknown:
            known = ", ".join(c for c in PRIORITY_CLASSES if c != "interactive")
            raise TraitError(f"{_name('preemptible_classes')}: {unknown[0]!r} is not one of {known}")
        return ",".join(names)

    @property
    def preemptible(self) -> frozenset[str]:
        """``preemptible_classes`` as a set."""
        return frozenset(name for name in self.preemptible_classes.split(",") if name)

    @validate(
        "reconcile_seconds",
        "job_grace_seconds",
        "preempt_after_seconds",
        "kube_job_refused_seconds",
        "store_check_seconds",
    )
    def _non_negative(self, proposal: dict[str, Any]) -> float:
        value = float(proposal["value"])
        if not (math.isfinite(value) and value >= 0):
            raise TraitError(f"{_name(proposal['trait'].name)} must be 0 or more seconds, got {value!r}")
        return value

    @validate("sample_seconds")
    def _sample_seconds(self, proposal: dict[str, Any]) -> float:
        value = float(proposal["value"])
        if not math.isfinite(value) or value < 0 or 0 < value < 0.1:
            raise TraitError(f"{_name('sample_seconds')} must be 0 (off) or at least 0.1, got {value!r}")
        return value

    @validate("gpu_idle_threshold")
    def _threshold(self, proposal: dict[str, Any]) -> float:
        value = float(proposal["value"])
        if not (math.isfinite(value) and 0 <= value < 100):
            raise TraitError(
                f"{_name('gpu_idle_threshold')} must be from 0 to under 100 (percent), got {value!r}"
            )
        return value

    @validate("max_queued_jobs", "kube_job_ttl_seconds")
    def _count(self, proposal: dict[str, Any]) -> int:
        value = int(proposal["value"])
        if value < 0:
            raise TraitError(f"{_name(proposal['trait'].name)} must be 0 or more, got {value}")
        return value

    @validate("kube_namespace")
    def _namespace(self, proposal: dict[str, Any]) -> str:
        try:
            return require_dns_label(proposal["value"], _name("kube_namespace"))
        except ManifestError as error:
            raise TraitError(str(error)) from None

    @validate("kube_shared_resource")
    def _shared(self, proposal: dict[str, Any]) -> str:
        if "/" not in proposal["value"]:
            raise TraitError(
                f"{_name('kube_shared_resource')} must be a resource name such as {SHARED_RESOURCE}, "
                f"got {proposal['value']!r}"
            )
        return str(proposal["value"])

    @validate("bind_url")
    def _bind_url(self, proposal: dict[str, Any]) -> str:
        if urlsplit(proposal["value"]).hostname is None:
            raise TraitError(f"{_name('bind_url')} has no host: {proposal['value']!r}")
        return str(proposal["value"])

    # ---- loading -------------------------------------------------------------------------------------------

    @classmethod
    def from_environment(cls, env: Mapping[str, str], argv: list[str] | None = None) -> ServiceSettings:
        """The settings from ``env`` (then the config file it names, then ``argv``); SystemExit naming the
        first bad one."""
        settings = cls()
        try:
            settings.update_config(environment_config(env))
            settings.parse_command_line(argv or [])
            if settings.config_file:
                settings.load_config_file(settings.config_file)
                settings.parse_command_line(argv or [])  # the command line wins over the file
        except TraitError as error:
            raise SystemExit(f"gpupool service: {error}") from None
        if not settings.hub_api_url:
            raise SystemExit("JUPYTERHUB_API_URL is not set: run the service from JupyterHub, or set it")
        return settings

    @property
    def listen(self) -> tuple[str, int]:
        url = urlsplit(self.bind_url)
        assert url.hostname is not None  # checked by the trait
        return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def environment_config(env: Mapping[str, str]) -> Config:
    """The settings ``env`` sets, as a traitlets Config; a value a trait cannot read names its variable."""
    section: dict[str, Any] = {}
    for name, trait in _settings():
        variable = str(trait.metadata.get("env") or "")
        raw = env.get(variable) if variable else None
        if raw is None or (raw == "" and not isinstance(trait, Unicode)):
            continue
        section[name] = _read(trait, variable, raw)
    return Config({"ServiceSettings": section})


def passed_on(environ: Mapping[str, str]) -> dict[str, str]:
    """The service's settings ``environ`` holds (``GPUPOOL_DB_URL``, ``KUBECONFIG``, …), for a hub to hand to
    the service it starts: JupyterHub starts a managed service with its ``environment`` and little else. The
    ``JUPYTERHUB_*`` ones are left out: the hub sets those for each service itself."""
    names = {str(trait.metadata.get("env") or "") for _, trait in _settings()}
    return {
        name: value for name, value in environ.items() if name in names and not name.startswith("JUPYTERHUB_")
    }


def _read(trait: TraitType[Any, Any], variable: str, raw: str) -> Any:
    if isinstance(trait, Bool):
        if raw.strip().lower() not in _TRUE + _FALSE:
            raise SystemExit(f"gpupool service: {variable} must be 1 or 0 (true or false), got {raw!r}")
        return raw.strip().lower() in _TRUE
    if isinstance(trait, Float | Int):
        try:
            return trait.from_string(raw.strip())
        except ValueError:
            kind = "a number" if isinstance(trait, Float) else "a whole number"
            raise SystemExit(f"gpupool service: {variable} must be {kind}, got {raw!r}") from None
    return raw


def _name(trait: str) -> str:
    """How the user set ``trait``: its environment variable (the usual way), else its config name."""
    return str(ServiceSettings.class_traits()[trait].metadata.get("env") or f"ServiceSettings.{trait}")


def _settings() -> list[tuple[str, TraitType[Any, Any]]]:
    """gpupool's own settings (not Application's logging ones), in the order the class declares them."""
    return [
        (name, value)
        for name, value in vars(ServiceSettings).items()
        if isinstance(value, TraitType) and value.metadata.get("config")
    ]


def settings_table() -> str:
    """The Markdown table of every setting: config name, environment variable, default and help."""
    rows = ["| setting | environment | default | what it does |", "|---|---|---|---|"]
    for name, trait in _settings():
        default = trait.default_value
        shown = "" if default in ("", None) else f"`{default}`"
        if name == "profiles_file":
            shown = "the shipped example"
        help_text = " ".join(str(trait.help).split()).replace("|", "\\|")
        rows.append(f"| `{name}` | `{trait.metadata.get('env', '')}` | {shown} | {help_text} |")
    return "\n".join(rows)
