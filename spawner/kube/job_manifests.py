"""A gpupool training job as a ``batch/v1`` Job: the user's image and home, the lease's node and resources.

The Job runs as the local runner runs a job (:mod:`gpupool.spawner.service.jobs.processes`): as the user, never root,
with the command as an argument list (never parsed by a shell unless the job asks for one), and with
``GPUPOOL_CHECKPOINT_DIR`` at ``~/.gpupool/jobs/<id>/checkpoint`` on the user's home volume, the same folder
for every attempt. What Kubernetes adds:

- ``activeDeadlineSeconds`` is the job's maximum runtime: the Job controller stops it, not a gpupool timer;
- a pod failure policy that tells the two kinds of failure apart. A pod the cluster took away (preemption,
  eviction, a drained or lost node: the ``DisruptionTarget`` condition) is ignored, so the Job starts a new
  pod without counting it against ``backoffLimit``; the job's own non-zero exit fails the Job at once, as a
  local job's does. ``backoffLimit`` then counts only failures neither rule matches;
- with Kueue (a queue name in :class:`JobSettings`) the Job carries ``kueue.x-k8s.io/queue-name`` and is
  created suspended; Kueue admits it by unsuspending it.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..device_env import device_env
from .grant import KubeGrant
from .manifests import (
    COMPONENT_LABEL,
    DEFAULT_GID,
    DEFAULT_UID,
    JOB_LABEL,
    KUEUE_QUEUE_LABEL,
    LEASE_LABEL,
    MANAGED_BY,
    USER_LABEL,
    JsonDict,
    ManifestError,
    container_security_context,
    cpu_quantity,
    dns_label,
    env_list,
    gpu_tolerations,
    label_value,
    memory_quantity,
    metadata,
    node_affinity,
    pod_security_context,
    require_dns_label,
    require_dns_subdomain,
    require_text,
    resource_limits,
)

MAIN_CONTAINER = "main"
# The local runner's layout (service.runner.JOBS_SUBDIR and CHECKPOINTS), relative to the user's home.
JOBS_SUBDIR = ".gpupool/jobs"
CHECKPOINTS = "checkpoint"


@dataclass(frozen=True)
class JobSettings:
    """What every job of one hub shares: where Jobs go and how users' homes and Kueue are set up.

    ``claim_template`` names the user's home PVC; ``{username}`` is the user name as KubeSpawner's default
    ``safe`` slug scheme writes it (``escape`` for the legacy scheme), so the Job mounts the volume the
    user's server has. ``home_mount`` is where the single-user image expects it.
    """

    namespace: str
    service_url: str = ""
    claim_template: str = "claim-{username}"
    slug_scheme: str = "safe"
    home_mount: str = "/home/jovyan"
    queue_name: str | None = None
    grace_seconds: int = 30
    uid: int = DEFAULT_UID
    gid: int = DEFAULT_GID
    ttl_seconds_after_finished: int | None = None

    def __post_init__(self) -> None:
        require_dns_label(self.namespace, "settings.namespace")
        if self.slug_scheme not in ("safe", "escape"):
            raise ManifestError(
                f"settings.slug_scheme: expected 'safe' or 'escape', got {self.slug_scheme!r}"
            )
        if not posixpath.isabs(self.home_mount):
            raise ManifestError(f"settings.home_mount: expected an absolute path, got {self.home_mount!r}")
        if self.queue_name is not None:
            require_dns_label(self.queue_name, "settings.queue_name")
        if self.grace_seconds < 0:
            raise ManifestError(f"settings.grace_seconds: expected 0 or more, got {self.grace_seconds}")


def home_claim_name(settings: JobSettings, user: str) -> str:
    """The user's home PVC by ``settings.claim_template``, expanded as KubeSpawner expands it for the user's
    default server (``{servername}`` empty, trailing ``-`` stripped), with its slug functions."""
    from kubespawner.slugs import escape_slug, multi_slug, safe_slug  # the spawner's own, so the names agree

    if settings.slug_scheme == "safe":
        username = str(safe_slug(user, max_length=48))
        # KubeSpawner 7 hashes {user_server} again when the slug leaves no room for the "--" join
        user_server = str(multi_slug([user, ""], max_length=48)) if len(username) + 2 > 48 else username
    else:
        username = user_server = str(escape_slug(user))
    try:
        claim = settings.claim_template.format(username=username, servername="", user_server=user_server)
    except (KeyError, IndexError, ValueError) as error:
        raise ManifestError(
            f"settings.claim_template: {settings.claim_template!r} may use {{username}}, {{servername}} and "
            f"{{user_server}} only ({error})"
        ) from None
    return require_dns_subdomain(claim.rstrip("-"), "settings.claim_template")


ATTEMPT_ANNOTATION = "gpupool.io/attempt"


JOB_PREFIX = "gpupool-job-"  # every training Job's name begins so


def job_name(job_id: str, attempt: int = 1) -> str:
    """``gpupool-job-<id>-<attempt>`` as a valid Job name (at most 63, as the ``job-name`` label on its pods
    must be). Each attempt has a Job of its own, so a retry never waits for the last one's deletion."""
    return dns_label(f"{JOB_PREFIX}{job_id}-{attempt}")


def checkpoint_dir(settings: JobSettings, job_id: str) -> str:
    """``<home>/.gpupool/jobs/<id>/checkpoint``: the job's checkpoints on its user's volume."""
    if not job_id or "/" in job_id or job_id in (".", ".."):
        raise ManifestError(f"job_id: expected a job id without '/', got {job_id!r}")
    return posixpath.join(settings.home_mount, JOBS_SUBDIR, job_id, CHECKPOINTS)


def job_argv(command: Sequence[str], *, shell: bool = False) -> list[str]:
    """The container's command: ``command`` as it is, or with ``shell`` its single string run by ``/bin/sh -c``
    (only when the job asked for a shell; arguments are otherwise never parsed)."""
    if isinstance(command, str):
        raise ManifestError(
            "command: expected a list of arguments, got a string; pass shell=True for a shell line"
        )
    argv = list(command)
    if not argv or not all(isinstance(arg, str) for arg in argv) or not argv[0]:
        raise ManifestError(f"command: expected a non-empty list of strings, got {argv!r}")
    if shell:
        if len(argv) != 1:
            raise ManifestError(
                f"command: with shell=True expected one shell line, got {len(argv)} arguments"
            )
        return ["/bin/sh", "-c", argv[0]]
    return argv


def job_labels(job_id: str, lease_id: str, user: str) -> dict[str, str]:
    """The labels that find a job's Job and pods, by job, lease and user."""
    return {
        JOB_LABEL: label_value(job_id),
        LEASE_LABEL: label_value(lease_id),
        USER_LABEL: label_value(user),
    }


def training_job(
    settings: JobSettings,
    *,
    job_id: str,
    user: str,
    command: Sequence[str],
    image: str,
    grant: KubeGrant,
    lease_id: str,
    cpu_milli: int,
    memory_mib: int,
    max_runtime: float | None = None,
    retries: int = 0,
    env: Mapping[str, str] | None = None,
    working_dir: str | None = None,
    shell: bool = False,
    home_claim: str | None = None,
    attempt: int = 1,
) -> JsonDict:
    """The ``batch/v1`` Job for one attempt of a gpupool job on its lease (see the module docstring).

    ``image`` is the user's server image; ``home_claim`` the user's home PVC when the caller knows it (the
    spawner's ``pvc_name``), else :func:`home_claim_name`. ``working_dir`` relative to the home, default the
    home. ``env`` is the user's; gpupool's variables come after it and win. Raises :class:`ManifestError`
    naming the field when a value cannot become a valid Job.
    """
    argv = job_argv(command, shell=shell)
    require_text(image, "image")
    gpus = resource_limits(grant.limits)
    resources = {"cpu": cpu_quantity(cpu_milli), "memory": memory_quantity(memory_mib), **gpus}
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ManifestError(f"retries: expected a whole number of 0 or more, got {retries!r}")
    checkpoints = checkpoint_dir(settings, job_id)
    claim = require_dns_subdomain(home_claim, "home_claim") if home_claim else home_claim_name(settings, user)
    workdir = posixpath.join(settings.home_mount, working_dir) if working_dir else settings.home_mount
    if posixpath.normpath(workdir) != workdir:
        raise ManifestError(f"working_dir: expected a plain path without '..', got {working_dir!r}")
    container_env = _container_env(settings, job_id, lease_id, checkpoints, env, cpu_only=not gpus)
    container_env.update(grant.environment)  # an MPS share's memory cap: gpupool's, like its other variables
    pod_spec = _pod_spec(
        settings,
        node=grant.node,
        claim=claim,
        image=image,
        argv=argv,
        workdir=workdir,
        env=container_env,
        resources=resources,
        checkpoints=checkpoints,
    )
    labels = {**MANAGED_BY, **job_labels(job_id, lease_id, user), COMPONENT_LABEL: "training-job"}
    annotations = {JOB_LABEL: job_id, LEASE_LABEL: lease_id, USER_LABEL: user}
    template = {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec}
    spec = _job_spec(settings, template, retries, max_runtime)
    return _job(
        settings, job_name(job_id, attempt), labels, {**annotations, ATTEMPT_ANNOTATION: str(attempt)}, spec
    )


def _job(
    settings: JobSettings, name: str, labels: dict[str, str], annotations: dict[str, str], spec: JsonDict
) -> JsonDict:
    """The Job itself; with Kueue, in its queue and suspended."""
    job_meta_labels = dict(labels)
    if settings.queue_name is not None:
        job_meta_labels[KUEUE_QUEUE_LABEL] = settings.queue_name
        spec["suspend"] = True  # Kueue admits the Job by unsuspending it
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(name, settings.namespace, job_meta_labels, annotations),
        "spec": spec,
    }


def _container_env(
    settings: JobSettings,
    job_id: str,
    lease_id: str,
    checkpoints: str,
    env: Mapping[str, str] | None,
    *,
    cpu_only: bool,
) -> dict[str, str]:
    """The user's ``env`` between gpupool's defaults and gpupool's own variables, which win."""
    gpupool_env = {
        "GPUPOOL_JOB_ID": job_id,
        "GPUPOOL_LEASE_ID": require_text(lease_id, "lease_id"),
        "GPUPOOL_CHECKPOINT_DIR": checkpoints,
        **({"GPUPOOL_SERVICE_URL": settings.service_url} if settings.service_url else {}),
        **(device_env("") if cpu_only else {}),  # a CPU-only job sees no GPU (see pods.lease_pod_env)
    }
    return {"HOME": settings.home_mount, "PYTHONUNBUFFERED": "1", **(env or {}), **gpupool_env}


def _pod_spec(
    settings: JobSettings,
    *,
    node: str,
    claim: str,
    image: str,
    argv: list[str],
    workdir: str,
    env: Mapping[str, str],
    resources: Mapping[str, str],
    checkpoints: str,
) -> JsonDict:
    """The pod of every attempt: the user's home mounted, never root, on the leased node."""
    home_mount = [{"name": "home", "mountPath": settings.home_mount}]
    security = container_security_context(settings.uid)
    return {
        "restartPolicy": "Never",  # a failed pod stays failed: the Job (and its failure policy) decides
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": settings.grace_seconds,
        "securityContext": pod_security_context(settings.uid, settings.gid),
        "affinity": node_affinity(node),
        "tolerations": gpu_tolerations(),
        "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": claim}}],
        # the checkpoint folder exists before the job starts, private to the user, as the local runner makes it
        "initContainers": [
            {
                "name": "checkpoint-dir",
                "image": image,
                "command": ["mkdir", "-p", "-m", "700", "--", checkpoints],
                "volumeMounts": home_mount,
                "securityContext": security,
                "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
            }
        ],
        "containers": [
            {
                "name": MAIN_CONTAINER,
                "image": image,
                "command": argv,
                "workingDir": workdir,
                "env": env_list(env),
                "resources": {"limits": dict(resources), "requests": dict(resources)},
                "volumeMounts": home_mount,
                "securityContext": security,
            }
        ],
    }


def _job_spec(settings: JobSettings, template: JsonDict, retries: int, max_runtime: float | None) -> JsonDict:
    """Retries, the pod failure policy, the deadline and clean-up of the module docstring."""
    spec: JsonDict = {
        "backoffLimit": retries,
        "podFailurePolicy": {
            "rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": MAIN_CONTAINER, "operator": "NotIn", "values": [0]},
                },
            ]
        },
        "template": template,
    }
    if max_runtime is not None:
        if not max_runtime > 0:
            raise ManifestError(f"max_runtime: expected a positive number of seconds, got {max_runtime!r}")
        spec["activeDeadlineSeconds"] = math.ceil(max_runtime)
    if settings.ttl_seconds_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = settings.ttl_seconds_after_finished
    return spec
