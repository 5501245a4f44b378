"""The gpupool service on Kubernetes: its Deployment, Service, configuration and the RBAC it needs.

``gpupool kube manifests`` prints these for ``kubectl apply -f -``; the Zero to JupyterHub values in
``hub_config/helm/values.yaml`` point the hub at the Service built here (name ``gpupool``, port 10101).

What the service may do, and no more: read Nodes, Pods and Events cluster-wide (the pool is every GPU node,
and other workloads' pods use capacity too), and in the user namespace create, watch and delete the pods and
Jobs that hold its leases and read their logs. Its secrets come from Secrets, never from the manifests:
the database URL (``gpupool-db``, key ``url``) and the hub API token Zero to JupyterHub keeps for the
``gpupool`` service (Secret ``hub``, key ``hub.services.gpupool.apiToken``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..names import API_PATH, SERVICE_NAME, SERVICE_PREFIX
from .manifests import (
    COMPONENT_LABEL,
    DEFAULT_GID,
    DEFAULT_UID,
    MANAGED_BY,
    JsonDict,
    ManifestError,
    container_security_context,
    metadata,
    pod_security_context,
    require_dns_label,
    require_dns_subdomain,
    require_text,
)

SERVICE_PORT = 10101
CONFIG_MOUNT = "/etc/gpupool"
RBAC_API = "rbac.authorization.k8s.io/v1"


@dataclass(frozen=True)
class ServiceDeployment:
    """Where and how the gpupool service runs; every field has the value a default Zero to JupyterHub
    install in ``namespace`` needs, except ``image`` (the hub image, ``images/hub/Dockerfile``)."""

    namespace: str
    image: str
    user_namespace: str | None = None  # where the users' pods and Jobs go; default: ``namespace``
    name: str = "gpupool"
    port: int = SERVICE_PORT
    hub_api_url: str = "http://hub:8081/hub/api"
    hub_secret: str = "hub"
    hub_token_key: str = "hub.services.gpupool.apiToken"
    db_secret: str = "gpupool-db"
    db_secret_key: str = "url"
    config_map: str = "gpupool-config"  # profiles.yaml (and quotas.yaml with ``quotas``)
    quotas: bool = False
    policy: str = "gpupool"
    job_image: str = "gpupool-singleuser:latest"  # what training Jobs run in (images/singleuser/Dockerfile)

    def __post_init__(self) -> None:
        require_dns_label(self.namespace, "namespace")
        require_dns_label(self.users, "user_namespace")
        require_dns_label(self.name, "name")
        require_text(self.image, "image")
        require_text(self.job_image, "job_image")
        require_text(self.hub_api_url, "hub_api_url")
        for field in ("hub_secret", "db_secret", "config_map"):
            require_dns_subdomain(getattr(self, field), field)
        if not 1 <= self.port <= 65535:
            raise ManifestError(f"port: expected a TCP port from 1 to 65535, got {self.port}")

    @property
    def users(self) -> str:
        """The user namespace."""
        return self.user_namespace or self.namespace

    @property
    def labels(self) -> dict[str, str]:
        """The labels of every object here; the pod selector is the first two."""
        return {"app.kubernetes.io/name": self.name, COMPONENT_LABEL: "gpupool-service", **MANAGED_BY}

    @property
    def selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name, COMPONENT_LABEL: "gpupool-service"}


# Zero to JupyterHub's NetworkPolicies admit pods with these labels to the hub's API (token checks, the hub's
# user list for reconciliation) and to the singleuser servers (the culler's GPU checks go the other way).
POD_NETWORK_ACCESS = {"hub.jupyter.org/network-access-hub": "true"}


def service_account(d: ServiceDeployment) -> JsonDict:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(d.name, d.namespace, d.labels)}


def cluster_role(d: ServiceDeployment) -> JsonDict:
    """Read-only, cluster-wide: the inventory (Nodes with their GPU labels), every pod's requests, events."""
    return {
        "apiVersion": RBAC_API,
        "kind": "ClusterRole",
        "metadata": metadata(_cluster_name(d), None, d.labels),
        "rules": [
            {"apiGroups": [""], "resources": ["nodes", "pods", "events"], "verbs": ["get", "list", "watch"]}
        ],
    }


def cluster_role_binding(d: ServiceDeployment) -> JsonDict:
    return {
        "apiVersion": RBAC_API,
        "kind": "ClusterRoleBinding",
        "metadata": metadata(_cluster_name(d), None, d.labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": _cluster_name(d)},
        "subjects": [{"kind": "ServiceAccount", "name": d.name, "namespace": d.namespace}],
    }


def user_role(d: ServiceDeployment) -> JsonDict:
    """In the user namespace only: the pods and Jobs that hold leases, their logs, and the users' home claims
    (read only)."""
    verbs = ["create", "delete", "get", "list", "watch", "patch"]
    return {
        "apiVersion": RBAC_API,
        "kind": "Role",
        "metadata": metadata(d.name, d.users, d.labels),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": verbs},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": verbs},
            # whether a user's home claim exists before a Job mounts it (KubeSpawner makes it)
            {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "watch"]},
        ],
    }


def user_role_binding(d: ServiceDeployment) -> JsonDict:
    return {
        "apiVersion": RBAC_API,
        "kind": "RoleBinding",
        "metadata": metadata(d.name, d.users, d.labels),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": d.name},
        "subjects": [{"kind": "ServiceAccount", "name": d.name, "namespace": d.namespace}],
    }


def config_map(d: ServiceDeployment, profiles_yaml: str, quotas_yaml: str | None = None) -> JsonDict:
    """The profiles (and quotas) the service reads; the hub mounts the same ConfigMap for its form."""
    data = {"profiles.yaml": profiles_yaml}
    if quotas_yaml is not None:
        data["quotas.yaml"] = quotas_yaml
    elif d.quotas:
        raise ManifestError("quotas_yaml: the deployment reads quotas.yaml (quotas=True) but none was given")
    meta = metadata(d.config_map, d.namespace, d.labels)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def deployment(d: ServiceDeployment) -> JsonDict:
    """One replica, replaced with ``Recreate``: the store has one owner, so two services never run at once."""
    pod_spec: JsonDict = {
        "serviceAccountName": d.name,
        "securityContext": pod_security_context(DEFAULT_UID, DEFAULT_GID),
        "containers": [_service_container(d)],
        "volumes": [
            {"name": "config", "configMap": {"name": d.config_map}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(d.name, d.namespace, d.labels),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": d.selector},
            "template": {"metadata": {"labels": d.labels | POD_NETWORK_ACCESS}, "spec": pod_spec},
        },
    }


def _service_container(d: ServiceDeployment) -> JsonDict:
    """The service's container: read-only root, ready once its API answers."""
    api = f"{SERVICE_PREFIX}{API_PATH}"
    return {
        "name": "gpupool",
        "image": d.image,
        "command": ["python3", "-m", "gpupool.spawner.service"],
        "workingDir": "/tmp",  # a scratch emptyDir: the root filesystem is read-only
        "ports": [{"name": "http", "containerPort": d.port}],
        "env": _service_env(d),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
        # the OpenAPI document needs no token and answers only once the store and pool are loaded
        "readinessProbe": {
            "httpGet": {"path": f"{api}/openapi.json", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {**container_security_context(DEFAULT_UID), "readOnlyRootFilesystem": True},
    }


def _service_env(d: ServiceDeployment) -> list[JsonDict]:
    """The service's settings (``GPUPOOL_*``) and its JupyterHub service identity; secrets by reference."""
    return [
        {"name": "GPUPOOL_BACKEND", "value": "kubernetes"},
        {"name": "GPUPOOL_KUBE_NAMESPACE", "value": d.users},
        {"name": "GPUPOOL_KUBE_JOB_IMAGE", "value": d.job_image},
        # what job pods (maybe in another namespace) get as GPUPOOL_SERVICE_URL, for the notebook widgets
        {
            "name": "GPUPOOL_SERVICE_URL",
            "value": f"http://{d.name}.{d.namespace}.svc:{d.port}{SERVICE_PREFIX}",
        },
        {"name": "GPUPOOL_PROFILES", "value": f"{CONFIG_MOUNT}/profiles.yaml"},
        *([{"name": "GPUPOOL_QUOTAS", "value": f"{CONFIG_MOUNT}/quotas.yaml"}] if d.quotas else []),
        {"name": "GPUPOOL_POLICY", "value": d.policy},
        {"name": "GPUPOOL_STOP_UNLEASED", "value": "1"},
        {
            "name": "GPUPOOL_DB_URL",
            "valueFrom": {"secretKeyRef": {"name": d.db_secret, "key": d.db_secret_key}},
        },
        {"name": "JUPYTERHUB_SERVICE_NAME", "value": SERVICE_NAME},
        {"name": "JUPYTERHUB_SERVICE_URL", "value": f"http://0.0.0.0:{d.port}"},  # listen on the pod's IP
        {"name": "JUPYTERHUB_SERVICE_PREFIX", "value": SERVICE_PREFIX},
        {"name": "JUPYTERHUB_API_URL", "value": d.hub_api_url},
        {
            "name": "JUPYTERHUB_API_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": d.hub_secret, "key": d.hub_token_key}},
        },
    ]


def service(d: ServiceDeployment) -> JsonDict:
    """``http://<name>.<namespace>:<port>``: what the hub's ``hub.services.gpupool.url`` points at."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(d.name, d.namespace, d.labels),
        "spec": {
            "type": "ClusterIP",
            "selector": d.selector,
            "ports": [{"name": "http", "port": d.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def service_manifests(
    d: ServiceDeployment, profiles_yaml: str, quotas_yaml: str | None = None
) -> list[JsonDict]:
    """Everything the service needs, in the order ``kubectl apply`` should create it."""
    return [
        service_account(d),
        cluster_role(d),
        cluster_role_binding(d),
        user_role(d),
        user_role_binding(d),
        config_map(d, profiles_yaml, quotas_yaml),
        deployment(d),
        service(d),
    ]


def _cluster_name(d: ServiceDeployment) -> str:
    """Cluster-scoped names carry the namespace, so two hubs in one cluster never share a ClusterRole."""
    return f"{d.name}-{d.namespace}"
