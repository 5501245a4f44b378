"""The pieces every manifest gpupool creates shares: names, labels, resources, scheduling, security.

gpupool builds its Kubernetes objects the way KubeSpawner's ``objects.py`` does: pure functions from plain
values to plain dicts (the JSON the API server takes), with no client, no cluster and no clock, so that every
manifest can be built and schema-checked in a test. This module holds what they share; the builders are in
:mod:`.pods` (a notebook server's pod), :mod:`.job_manifests` (a training job's ``batch/v1`` Job) and :mod:`.deploy`
(the gpupool service's own Deployment, Service and RBAC).

Names. Kubernetes names and label values have narrow alphabets, and JupyterHub user names do not
(``Alice.Smith@x``). :func:`dns_label` and :func:`label_value` keep a valid value unchanged and turn any other
into a readable slug plus a short hash of the original, so two different inputs never share a name. The exact
values travel in annotations, which take any string.

Errors. A value gpupool cannot turn into a valid manifest raises :class:`ManifestError`, naming the field and
what was expected, before anything reaches the API server.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

# Labels select (pods of a lease, of a user, of a job); annotations carry the exact, unsanitised values.
LEASE_LABEL = "gpupool.io/lease"
USER_LABEL = "gpupool.io/user"
JOB_LABEL = "gpupool.io/job"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpupool"}
HOSTNAME_LABEL = "kubernetes.io/hostname"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# The NVIDIA GPU Operator's nodes are commonly tainted so that only pods asking for GPUs land there.
GPU_TAINT = "nvidia.com/gpu"

# The docker-stacks images' user (jovyan) and group (users), as Zero to JupyterHub runs them.
DEFAULT_UID = 1000
DEFAULT_GID = 100

JsonDict = dict[str, Any]

# Used with fullmatch only: "$" also matches before a trailing newline, so "alice\n" would pass a match().
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_HASH_LENGTH = 8


class ManifestError(ValueError):
    """A value that cannot become a valid Kubernetes manifest; the message names the field and what it needs."""


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:_HASH_LENGTH]


def dns_label(value: str, *, max_length: int = 63) -> str:
    """``value`` as an RFC 1123 label (lower-case letters, digits and ``-``, at most ``max_length``).

    A value that is already one, and has no ``--``, is returned unchanged. Anything else becomes a slug of it,
    ``--`` and 8 hex digits of its SHA-256: ``Alice.Smith@x`` → ``alice-smith-x--<hash>``. A slug never holds
    ``--`` itself, so a hashed name never equals an unhashed one, and two inputs share a name only if their
    hashes collide.
    """
    if max_length < _HASH_LENGTH + 3:
        raise ManifestError(f"max_length must be at least {_HASH_LENGTH + 3}, got {max_length}")
    if _DNS_LABEL.fullmatch(value) and "--" not in value and len(value) <= max_length:
        return value
    slug = re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-")
    slug = slug[: max_length - _HASH_LENGTH - 2].rstrip("-") or "x"
    return f"{slug}--{_digest(value)}"


def label_value(value: str) -> str:
    """``value`` as a label value (at most 63 of letters, digits, ``-_.``, starting and ending alphanumeric),
    by the rule of :func:`dns_label` but keeping case: a lease id such as ``_k3x-9aZ`` or a user name such as
    ``Alice.Smith@x`` gets a slug and a hash; a valid value without ``--`` stays as it is."""
    if _LABEL_VALUE.fullmatch(value) and value and "--" not in value and len(value) <= 63:
        return value
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", value)
    slug = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", slug)
    slug = slug[: 63 - _HASH_LENGTH - 2]
    slug = re.sub(r"[^A-Za-z0-9]+$", "", slug) or "x"
    return f"{slug}--{_digest(value)}"


def require_dns_label(value: str, field: str) -> str:
    """``value`` when it is an RFC 1123 label (a namespace, a container or object name), else ManifestError."""
    if not (_DNS_LABEL.fullmatch(value) and len(value) <= 63):
        raise ManifestError(
            f"{field}: expected an RFC 1123 label (at most 63 lower-case letters, digits and '-', starting "
            f"and ending with a letter or digit), got {value!r}"
        )
    return value


def require_dns_subdomain(value: str, field: str) -> str:
    """``value`` when it is an RFC 1123 subdomain (a node or Secret name), else ManifestError."""
    if not (_DNS_SUBDOMAIN.fullmatch(value) and len(value) <= 253):
        raise ManifestError(
            f"{field}: expected an RFC 1123 subdomain (lower-case letters, digits, '-' and '.', at most 253), "
            f"got {value!r}"
        )
    return value


def require_text(value: str, field: str) -> str:
    """``value`` when it is a non-empty string without surrounding blanks (an image, a URL), else ManifestError."""
    if not isinstance(value, str) or not value or value != value.strip():
        raise ManifestError(f"{field}: expected a non-empty string without surrounding blanks, got {value!r}")
    return value


def resource_limits(limits: Mapping[str, int], field: str = "grant.limits") -> dict[str, str]:
    """Extended-resource limits (``{"nvidia.com/mig-3g.40gb": 1}``) as quantities, checked: each name a
    qualified name with a domain (``nvidia.com/…``), each count a whole number of at least 1. Extended
    resources cannot be overcommitted, so Kubernetes needs requests equal to limits: callers use the result
    for both."""
    quantities: dict[str, str] = {}
    for name, count in limits.items():
        prefix, slash, short = name.partition("/")
        if not (
            slash
            and _DNS_SUBDOMAIN.fullmatch(prefix)
            and _QUALIFIED_NAME.fullmatch(short)
            and len(short) <= 63
            and "." in prefix
        ):
            raise ManifestError(
                f"{field}: {name!r} is not an extended resource name; expected '<domain>/<name>' such as "
                "'nvidia.com/gpu' or 'nvidia.com/mig-3g.40gb'"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ManifestError(f"{field}[{name!r}]: expected a whole number of at least 1, got {count!r}")
        quantities[name] = str(count)
    return quantities


def cpu_quantity(cpu_milli: int, field: str = "cpu_milli") -> str:
    """milli-CPU as a quantity (``1500`` → ``"1500m"``)."""
    if isinstance(cpu_milli, bool) or not isinstance(cpu_milli, int) or cpu_milli < 1:
        raise ManifestError(f"{field}: expected a whole number of milli-CPU of at least 1, got {cpu_milli!r}")
    return f"{cpu_milli}m"


def memory_quantity(memory_mib: int, field: str = "memory_mib") -> str:
    """MiB as a quantity (``4096`` → ``"4096Mi"``)."""
    if isinstance(memory_mib, bool) or not isinstance(memory_mib, int) or memory_mib < 1:
        raise ManifestError(f"{field}: expected a whole number of MiB of at least 1, got {memory_mib!r}")
    return f"{memory_mib}Mi"


def env_list(env: Mapping[str, str], field: str = "env") -> list[JsonDict]:
    """``{"NAME": "value"}`` as a container's ``env`` list, names checked as Kubernetes checks them."""
    items: list[JsonDict] = []
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ManifestError(
                f"{field}: {name!r} is not an environment variable name; expected letters, digits, '_', '-' "
                "and '.', not starting with a digit"
            )
        if not isinstance(value, str):
            raise ManifestError(f"{field}[{name!r}]: expected a string, got {value!r}")
        items.append({"name": name, "value": value})
    return items


def node_selector_terms(node: str) -> list[JsonDict]:
    """The required node-affinity terms that allow exactly one node, by its ``kubernetes.io/hostname`` label.

    The label, not ``spec.nodeName``: a pod bound by name skips the scheduler, so taints, the node's real
    capacity and a node that went away would surface as a failed pod rather than a pending one with events.
    """
    require_dns_subdomain(node, "grant.node")
    return [{"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}]


def node_affinity(node: str) -> JsonDict:
    """A pod's ``affinity`` that requires the leased node (see :func:`node_selector_terms`)."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": node_selector_terms(node)}
        }
    }


def gpu_tolerations() -> list[JsonDict]:
    """Tolerate the GPU nodes' ``nvidia.com/gpu`` taint (any value), so leased pods may land there."""
    return [{"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}]


def pod_security_context(uid: int = DEFAULT_UID, gid: int = DEFAULT_GID) -> JsonDict:
    """Never root: the pod runs as ``uid`` and files on its volumes are group-owned by ``gid``."""
    if uid == 0:
        raise ManifestError("security.run_as_user: expected a non-root user id, got 0")
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
        "fsGroup": gid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(uid: int = DEFAULT_UID) -> JsonDict:
    """No way back to root inside the container: no setuid escalation, no capabilities (Kubernetes' restricted
    Pod Security Standard)."""
    if uid == 0:
        raise ManifestError("security.run_as_user: expected a non-root user id, got 0")
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def metadata(
    name: str,
    namespace: str | None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> JsonDict:
    """An object's ``metadata``; a cluster-scoped object passes ``namespace=None``."""
    meta: JsonDict = {"name": name}
    if namespace is not None:
        meta["namespace"] = require_dns_label(namespace, "namespace")
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta
