"""The gpupool service's own deployment: its manifests (schema-checked, strict, against Kubernetes 1.30 and the
newest bundled version), ``gpupool kube manifests`` run as an admin runs it, the Zero to JupyterHub values that
must agree with them and with ``hub_config/jupyterhub_config.py``, and the Dockerfiles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version, major_minor
from traitlets.config import Config

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.hub import up
from gpupool.spawner.kube import deploy
from gpupool.spawner.kube.manifests import ManifestError, gpu_tolerations
from gpupool.spawner.service.settings import ServiceSettings

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("1.30", major_minor(latest_version()))
VALUES = ROOT / "hub_config" / "helm" / "values.yaml"
SETTINGS = deploy.ServiceDeployment(namespace="jhub", image="registry.example.org/gpupool-hub:0.1.0")

DEFAULT_PREFIX = ServiceSettings().service_prefix  # where the service answers unless told otherwise


def manifests(settings: deploy.ServiceDeployment = SETTINGS) -> dict[str, dict[str, Any]]:
    documents = deploy.service_manifests(settings, "profiles: []\n", "users: {}\n")
    return {doc["kind"]: doc for doc in documents}


def gpupool_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as an admin runs it."""
    script = Path(sys.executable).with_name("gpupool")
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_service_manifests_pass_strict_schema_validation(version: str) -> None:
    settings = deploy.ServiceDeployment(
        namespace="jhub", image="gpupool-hub:0.1.0", user_namespace="jhub-users", quotas=True
    )
    for document in manifests(settings).values():
        assert kubernetes_validate.validate(document, version, strict=True) == version


def test_the_service_reads_the_cluster_and_writes_only_in_the_user_namespace() -> None:
    docs = manifests(deploy.ServiceDeployment(namespace="jhub", image="i", user_namespace="users"))
    assert docs["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods", "events"], "verbs": ["get", "list", "watch"]}
    ]
    role = docs["Role"]
    assert role["metadata"]["namespace"] == "users"
    granted = {(r, g) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {("pods", ""), ("pods/log", ""), ("jobs", "batch"), ("persistentvolumeclaims", "")}
    claims = next(rule for rule in role["rules"] if rule["resources"] == ["persistentvolumeclaims"])
    assert claims["verbs"] == ["get", "list", "watch"]  # whether a home exists; KubeSpawner makes them
    subject = {"kind": "ServiceAccount", "name": "gpupool", "namespace": "jhub"}
    assert docs["RoleBinding"]["subjects"] == docs["ClusterRoleBinding"]["subjects"] == [subject]
    assert docs["RoleBinding"]["metadata"]["namespace"] == "users"
    assert (
        docs["ClusterRoleBinding"]["roleRef"]["name"]
        == docs["ClusterRole"]["metadata"]["name"]
        == "gpupool-jhub"
    )


def test_one_non_root_replica_with_its_secrets_referenced_never_inlined() -> None:
    spec = manifests()["Deployment"]["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUPOOL_BACKEND"]["value"] == "kubernetes"
    assert env["GPUPOOL_KUBE_NAMESPACE"]["value"] == "jhub"
    # the service refuses to start without the jobs' image
    assert env["GPUPOOL_KUBE_JOB_IMAGE"]["value"] == SETTINGS.job_image
    assert env["GPUPOOL_SERVICE_URL"]["value"] == "http://gpupool.jhub.svc:10101/services/gpupool/"
    assert env["GPUPOOL_DB_URL"]["valueFrom"]["secretKeyRef"] == {"name": "gpupool-db", "key": "url"}
    assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "hub",
        "key": "hub.services.gpupool.apiToken",
    }
    assert all(
        "value" not in e for e in env.values() if e["name"] in ("GPUPOOL_DB_URL", "JUPYTERHUB_API_TOKEN")
    )


def test_the_readiness_probe_asks_the_services_api_on_its_port() -> None:
    docs = manifests()
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert DEFAULT_PREFIX == deploy.SERVICE_PREFIX  # the service answers where the Deployment routes to
    assert container["readinessProbe"]["httpGet"] == {
        "path": f"{DEFAULT_PREFIX}api/v1/openapi.json",
        "port": "http",
    }
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert urlsplit(env["JUPYTERHUB_SERVICE_URL"]).port == container["ports"][0]["containerPort"] == 10101
    assert docs["Service"]["spec"]["ports"][0]["port"] == 10101
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert docs["Deployment"]["spec"]["selector"]["matchLabels"].items() <= (
        docs["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    )


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ManifestError, match=r"^namespace: expected an RFC 1123 label"):
        deploy.ServiceDeployment(namespace="JHub", image="i")
    with pytest.raises(ManifestError, match=r"^port: expected"):
        deploy.ServiceDeployment(namespace="jhub", image="i", port=0)
    with pytest.raises(ManifestError, match=r"^quotas_yaml:"):
        deploy.service_manifests(deploy.ServiceDeployment(namespace="jhub", image="i", quotas=True), "x")


def test_gpupool_kube_manifests_prints_yaml_that_validates() -> None:
    result = gpupool_cli(
        "kube", "manifests", "--namespace", "jhub", "--user-namespace", "jhub-users",
        "--image", "registry.example.org/gpupool-hub:0.1.0", "--quotas", str(ROOT / "hub_config" / "quotas.yaml"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    kinds = [doc["kind"] for doc in documents]
    assert kinds == [
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Deployment",
        "Service",
    ]  # fmt: skip
    for document in documents:
        for version in VERSIONS:
            assert kubernetes_validate.validate(document, version, strict=True) == version
    config = documents[kinds.index("ConfigMap")]["data"]
    assert config["profiles.yaml"] == (ROOT / "hub_config" / "profiles.yaml").read_text()
    assert config["quotas.yaml"] == (ROOT / "hub_config" / "quotas.yaml").read_text()
    container = documents[kinds.index("Deployment")]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.org/gpupool-hub:0.1.0"


def test_gpupool_kube_manifests_refuses_bad_input_naming_it(tmp_path: Path) -> None:
    result = gpupool_cli("kube", "manifests", "--namespace", "JHub")
    assert result.returncode == 2 and "namespace: expected an RFC 1123 label" in result.stderr
    assert result.stdout == ""
    bad = tmp_path / "profiles.yaml"
    bad.write_text("profiles: [{slug: x}]\n")
    result = gpupool_cli("kube", "manifests", "--namespace", "jhub", "--profiles", str(bad))
    assert result.returncode == 2 and str(bad) in result.stderr and result.stdout == ""


# ---- the Helm values ---------------------------------------------------------------------------------------


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(VALUES.read_text())
    return loaded


def production_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    """``hub_config/jupyterhub_config.py`` as JupyterHub loads it (it keeps a token in its working folder)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUPOOL_POOL", str(DEMO_POOL))  # no GPU here: a simulated pool on purpose
    # the files gpupool install puts in /etc/gpupool, which the configuration reads at load
    monkeypatch.setenv("GPUPOOL_PROFILES", str(ROOT / "hub_config" / "profiles.yaml"))
    monkeypatch.setenv("GPUPOOL_QUOTAS", str(ROOT / "hub_config" / "quotas.yaml"))
    config = Config()
    source = (ROOT / "hub_config" / "jupyterhub_config.py").read_text()
    exec(compile(source, "jupyterhub_config.py", "exec"), {"get_config": lambda: config})
    return config


def test_helm_values_point_the_hub_at_the_service_the_manifests_create() -> None:
    hub = values()["hub"]
    service = urlsplit(hub["services"]["gpupool"]["url"])
    assert (service.hostname, service.port) == (SETTINGS.name, deploy.SERVICE_PORT)
    # no token in the values: the chart makes one per service, in Secret "hub", which the Deployment reads
    assert "apiToken" not in hub["services"]["gpupool"] and "apiToken" not in hub["services"]["gpupool-hub"]
    assert SETTINGS.hub_token_key == "hub.services.gpupool.apiToken" and SETTINGS.hub_secret == "hub"
    spawner = hub["config"]["KubeGPUSpawner"]
    culler = hub["services"]["jupyterhub-idle-culler"]
    for url in (spawner["service_url"], culler["environment"]["GPUPOOL_SERVICE_URL"]):
        parts = urlsplit(url)
        assert (parts.hostname, parts.port, parts.path) == (
            SETTINGS.name,
            deploy.SERVICE_PORT,
            DEFAULT_PREFIX,
        )
    assert hub["config"]["JupyterHub"]["spawner_class"] == "gpupool.spawner.hub.kube_spawner.KubeGPUSpawner"
    assert hub["extraVolumes"][0]["configMap"]["name"] == SETTINGS.config_map
    assert hub["extraVolumeMounts"][0]["mountPath"] == deploy.CONFIG_MOUNT
    assert spawner["profiles_file"] == f"{deploy.CONFIG_MOUNT}/profiles.yaml"
    token = hub["extraEnv"]["GPUPOOL_API_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token == {"name": "hub", "key": "hub.services.gpupool-hub.apiToken"}


def test_helm_values_grant_the_scopes_the_production_config_grants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, production = values()["hub"], production_config(tmp_path, monkeypatch)
    assert hub["config"]["JupyterHub"]["custom_scopes"] == production.JupyterHub.custom_scopes
    ours = {name: role for name, role in hub["loadRoles"].items()}
    theirs = {role["name"]: role for role in production.JupyterHub.load_roles}
    assert ours.keys() == theirs.keys()
    for name, role in theirs.items():
        assert set(ours[name]["scopes"]) == set(role["scopes"]), name
        assert ours[name].get("services", []) == role.get("services", []), name
    assert set(ours["idle-culler"]["scopes"]) == set(up.CULLER_SCOPES)
    production_services = {s["name"] for s in production.JupyterHub.services}
    assert set(hub["services"]) == production_services


def test_helm_values_replace_the_charts_culler_with_gpupools_hook() -> None:
    v = values()
    assert v["cull"]["enabled"] is False
    command = v["hub"]["services"]["jupyterhub-idle-culler"]["command"]
    assert command[:3] == ["python3", "-m", "jupyterhub_idle_culler"]
    config = next(arg.split("=", 1)[1] for arg in command if arg.startswith("--config="))
    assert Path(config).name == up.culler_config().name == "idle_culler_config.py"
    assert config in (ROOT / "images" / "hub" / "Dockerfile").read_text()  # the image puts it there


def test_helm_values_let_gpu_servers_onto_gpu_nodes_and_reach_the_service() -> None:
    single = values()["singleuser"]
    assert single["extraTolerations"] == gpu_tolerations()
    assert single["image"]["name"]
    for policy in (
        single["networkPolicy"],
        values()["hub"]["networkPolicy"],
        values()["proxy"]["chp"]["networkPolicy"],
    ):
        rule = policy["egress"][0]
        assert rule["to"][0]["podSelector"]["matchLabels"].items() <= SETTINGS.selector.items()
        assert rule["ports"] == [{"port": deploy.SERVICE_PORT, "protocol": "TCP"}]


# ---- the images --------------------------------------------------------------------------------------------


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = dockerfile.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


@pytest.mark.parametrize(
    ("image", "base"),
    [("hub", "quay.io/jupyterhub/k8s-hub:4."), ("singleuser", "quay.io/jupyter/pytorch-notebook:cuda12")],
)
def test_the_dockerfiles_build_on_the_right_base_and_end_as_a_normal_user(image: str, base: str) -> None:
    steps = instructions(ROOT / "images" / image / "Dockerfile")
    args = dict(arg.split("=", 1) for kind, arg in steps if kind == "ARG" and "=" in arg)
    froms = [arg for kind, arg in steps if kind == "FROM"]
    assert len(froms) == 1
    resolved = args.get(froms[0].strip("${}"), froms[0])
    assert resolved.startswith(base)
    users = [arg for kind, arg in steps if kind == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0")
    installs = " ".join(arg for kind, arg in steps if kind == "RUN")
    assert "/tmp/gpupool" in installs
    if image == "singleuser":
        assert "nvidia-ml-py" in installs and "gpupool.widgets" in installs
    else:
        assert '"/tmp/gpupool[kubernetes,postgresql]"' in installs  # the chart's store is PostgreSQL
