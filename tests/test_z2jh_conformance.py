"""gpupool's Helm values on Zero to JupyterHub 4.4.0, as the chart really turns them into a hub configuration.

``hub_config/helm/values.yaml`` is merged over the chart's defaults as Helm merges values files and checked
against the chart's schema (:mod:`z2jh_chart`); the chart's own ``jupyterhub_config.py`` and ``z2jh.py`` then
run on the files the chart mounts into the hub pod, in the hub image's versions with gpupool installed
(JupyterHub 5.5.0, KubeSpawner 7.0.0, jupyterhub-idle-culler 2.x; :mod:`pinned_packages`), and the spawner
they name is made with the result against the real control plane (:mod:`z2jh_hub_config`). The culler
command the result holds is started as the hub would start it. Needs ``../shared/data/z2jh-4.4.0``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_cluster import LocalKube
from pinned_packages import installed_over, pinned
from z2jh_chart import chart_folder, chart_values, hub_pod_environment, hub_pod_files

from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES, load_profiles
from gpupool.spawner.kube import deploy

ROOT = Path(__file__).resolve().parent.parent
IMAGE_PACKAGES = (
    "jupyterhub",
    "jupyterhub-kubespawner",
    "jupyterhub-idle-culler",
    "kubernetes-asyncio",
    "pycurl",
)
CULLER_CONFIG_IN_IMAGE = "/usr/local/share/gpupool/idle_culler_config.py"  # images/hub/Dockerfile links it
# the README's `helm upgrade … -f hub_config/helm/values.yaml --set hub.image.name=… --set singleuser.image.name=…`
README_SETS = {
    "hub": {"image": {"name": "registry.example.org/gpupool-hub"}},
    "singleuser": {"image": {"name": "registry.example.org/gpupool-singleuser"}},
}


def image_environment(extra_pins: tuple[str, ...] = ()) -> dict[str, str]:
    requirements = chart_folder() / "images" / "hub" / "requirements.txt"
    pins = {p.split("==")[0]: p for p in installed_over(requirements, IMAGE_PACKAGES)}
    pins |= {p.split("==")[0]: p for p in extra_pins}
    return {"PYTHONPATH": str(pinned(sorted(pins.values())))}


@pytest.fixture(scope="module")
def chart(
    kube: LocalKube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """The hub configuration the chart makes of gpupool's values, and the service tokens it generated."""
    tmp = tmp_path_factory.mktemp("z2jh")
    ours = yaml.safe_load((ROOT / "hub_config" / "helm" / "values.yaml").read_text())
    values = chart_values(ours, README_SETS)
    tokens = hub_pod_files(values, tmp / "etc-jupyterhub")
    out = tmp / "hub-config.json"
    env = os.environ | hub_pod_environment() | image_environment()
    env["KUBECONFIG"] = str(kube.kubeconfig(tmp / "kubeconfig"))
    hub_files = chart_folder() / "jupyterhub" / "files" / "hub"
    script = [
        sys.executable,
        str(ROOT / "tests" / "z2jh_hub_config.py"),
        str(hub_files),
        str(tmp / "etc-jupyterhub"),
    ]
    run = subprocess.run(
        [*script, str(EXAMPLE_PROFILES), str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, (
        f"z2jh's jupyterhub_config.py failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    )
    yield json.loads(out.read_text()), tokens


def test_the_chart_gives_kube_gpu_spawner_with_gpupools_form_and_start_timeout(
    chart: tuple[dict[str, Any], dict[str, str]],
) -> None:
    config, _ = chart
    assert config["spawner_class"] == "gpupool.spawner.hub.kube_spawner.KubeGPUSpawner"
    # the ConfigMap gpupool kube manifests makes, mounted by the values
    assert config["profiles_file"] == "/etc/gpupool/profiles.yaml"
    assert config["start_timeout"] == 600  # not the chart's 300: a queued spawn may wait for a GPU
    # the chart's profileList: [] leaves gpupool's profiles: those for everyone (ada is in no group)
    for profile in load_profiles(EXAMPLE_PROFILES):
        assert (f'value="{profile.slug}"' in config["form"]) is (not profile.groups), profile.slug
    assert "/usr/local/share/gpupool/templates" in config["template_paths"]


def test_the_services_roles_and_scopes_are_gpupools_with_tokens_the_chart_made(
    chart: tuple[dict[str, Any], dict[str, str]],
) -> None:
    config, tokens = chart
    services = config["services"]
    assert set(services) == {"gpupool", "gpupool-hub", "jupyterhub-idle-culler"}  # the chart's culler is off
    for name, service in services.items():
        assert service["api_token"] == tokens[name] and len(tokens[name]) == 64, name  # made by the chart
    gpupool = services["gpupool"]
    assert gpupool["url"] == "http://gpupool:10101" and gpupool["oauth_no_confirm"] is True
    assert gpupool["oauth_client_allowed_scopes"] == ["custom:gpupool:admin"]
    assert config["custom_scopes"] == ["custom:gpupool:admin", "custom:gpupool:leases"]
    roles = config["roles"]
    assert roles["gpupool-hub"]["services"] == ["gpupool-hub"]
    assert "custom:gpupool:leases" in roles["gpupool-hub"]["scopes"]
    assert roles["idle-culler"]["services"] == ["jupyterhub-idle-culler"]
    assert {"admin:server_state", "custom:gpupool:admin"} <= set(roles["idle-culler"]["scopes"])
    assert roles["gpupool-service"]["services"] == ["gpupool"]
    assert "access:services!service=gpupool" in roles["user"]["scopes"]
    assert "access:services!service=gpupool" in roles["server"]["scopes"]


def test_the_service_deployment_reads_the_charts_token_and_may_reach_the_hub() -> None:
    """``gpupool kube manifests``' Deployment: its hub token is the chart's Secret key, and its pods carry the
    label the chart's NetworkPolicy admits to the hub."""
    manifest = deploy.deployment(deploy.ServiceDeployment(namespace="jhub", image="gpupool-hub:0.1.0"))
    template = manifest["spec"]["template"]
    assert template["metadata"]["labels"]["hub.jupyter.org/network-access-hub"] == "true"
    (container,) = template["spec"]["containers"]
    refs = [
        e["valueFrom"]["secretKeyRef"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert {"name": "hub", "key": "hub.services.gpupool.apiToken"} in refs


def _start_culler(service: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [sys.executable if part == "python3" else part for part in service["command"]]
    assert f"--config={CULLER_CONFIG_IN_IMAGE}" in command
    command = [
        f"--config={ROOT / 'hub_config' / 'idle_culler_config.py'}" if p.startswith("--config=") else p
        for p in command
    ]
    hub = {"JUPYTERHUB_API_TOKEN": service["api_token"], "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api"}
    return subprocess.Popen(
        command,
        env=os.environ | env | service["environment"] | hub,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_the_culler_the_chart_starts_runs_with_gpupools_arbiter_and_would_not_with_the_images_own(
    chart: tuple[dict[str, Any], dict[str, str]],
) -> None:
    config, _ = chart
    culler = config["services"]["jupyterhub-idle-culler"]
    assert culler["environment"]["GPUPOOL_SERVICE_URL"] == "http://gpupool:10101/services/gpupool/"
    running = _start_culler(culler, image_environment())
    try:
        time.sleep(5)  # a bad config or option ends it at once; a good one waits for its next pass
        assert running.poll() is None, running.communicate()[0].decode()[-3000:]
    finally:
        running.send_signal(signal.SIGTERM)
        running.wait(timeout=10)
    old = _start_culler(culler, image_environment(("jupyterhub-idle-culler==1.4.0",)))  # the image's pin
    output = old.communicate(timeout=60)[0].decode()
    assert old.returncode != 0 and "config" in output, output[-2000:]
