"""What ``gpupool up -f`` files set for the gpupool service reaches it: one profiles file for the spawn form and
the service, and ``c.ServiceSettings`` on the service's command line; mistakes stop the hub at start-up.

A trial set ``c.SimpleLocalGPUSpawner.profiles_file`` in an ``-f`` file: the form offered its profiles and the
service refused each ("unknown profile"); ``c.ServiceSettings.policy`` there did nothing at all."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest
from hub_harness import environ_of
from traitlets.config import Config
from up_harness import demo_hub_api, free_port_family, require_proxy, start_demo_server, start_up

from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES
from gpupool.spawner.hub.up_checks import UpError, kubeconfig_namespace
from gpupool.spawner.hub.up_service_config import pass_to_service
from gpupool.spawner.service.settings import ServiceSettings

HUB = {"JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api"}
LAB_PROFILES = """profiles:
  - slug: mig-half
    display_name: Half an H100
    mig: {profile: 3g.40gb}
    cpu: 8
    memory: 32GiB
    default: true
  - slug: h100-x8
    display_name: Eight H100s
    gpus: {count: 8, products: [H100-80GB]}
    cpu: 64
    memory: 512GiB
"""


def hub_config(**sections: dict[str, object]) -> Config:
    c = Config({"JupyterHub": {"services": [{"name": "gpupool", "command": [sys.executable, "-m", "svc"]}]}})
    for section, values in sections.items():
        for name, value in values.items():
            c[section][name] = value
    return c


def service_settings(c: Config, environ: dict[str, str] | None = None) -> ServiceSettings:
    """Settings as the service started with this config's command line reads them."""
    command = c.JupyterHub.services[0]["command"]
    return ServiceSettings.from_environment(HUB | (environ or {}), command[3:])


@pytest.fixture
def lab_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lab").mkdir()
    path = tmp_path / "lab" / "profiles.yaml"
    path.write_text(LAB_PROFILES)
    return path


@pytest.mark.parametrize("section", ["SimpleLocalGPUSpawner", "LocalGPUSpawner", "ServiceSettings"])
def test_a_profiles_file_given_to_either_side_reaches_the_form_and_the_service(
    lab_profiles: Path, section: str
) -> None:
    c = hub_config(**{section: {"profiles_file": "lab/profiles.yaml"}})  # relative to where gpupool up runs
    pass_to_service(c, "gpupool", kube=False, environ={})
    assert c.SimpleLocalGPUSpawner.profiles_file == str(lab_profiles)
    assert service_settings(c).profiles_file == str(lab_profiles)  # absolute: the service runs elsewhere


def test_the_kube_spawner_gets_the_same_file(lab_profiles: Path) -> None:
    c = hub_config(ServiceSettings={"profiles_file": str(lab_profiles)})
    pass_to_service(c, "gpupool", kube=True, environ={})
    assert c.KubeGPUSpawner.profiles_file == str(lab_profiles)


def test_without_f_files_both_read_gpupool_profiles_else_the_shipped_example(lab_profiles: Path) -> None:
    given = hub_config()
    pass_to_service(given, "gpupool", kube=False, environ={"GPUPOOL_PROFILES": str(lab_profiles)})
    assert (
        service_settings(given).profiles_file
        == given.SimpleLocalGPUSpawner.profiles_file
        == str(lab_profiles)
    )
    shipped = hub_config()
    pass_to_service(shipped, "gpupool", kube=False, environ={})
    assert service_settings(shipped).profiles_file == str(EXAMPLE_PROFILES)


def test_two_different_profiles_files_stop_the_hub_naming_both(lab_profiles: Path) -> None:
    c = hub_config(
        SimpleLocalGPUSpawner={"profiles_file": str(lab_profiles)},
        ServiceSettings={"profiles_file": str(EXAMPLE_PROFILES)},
    )
    with pytest.raises(SystemExit) as stopped:
        pass_to_service(c, "gpupool", kube=False, environ={})
    said = str(stopped.value)
    assert "c.SimpleLocalGPUSpawner.profiles_file" in said and str(EXAMPLE_PROFILES) in said
    assert "must read the same profiles" in said


def test_a_broken_profiles_file_from_an_f_file_stops_the_hub_naming_the_field(lab_profiles: Path) -> None:
    """It used to start, then answer the first login with a 500 and a traceback in the hub's log."""
    lab_profiles.write_text(
        LAB_PROFILES + LAB_PROFILES.replace("profiles:\n", "").replace("default: true", "")
    )
    c = hub_config(SimpleLocalGPUSpawner={"profiles_file": str(lab_profiles)})
    with pytest.raises(SystemExit) as stopped:
        pass_to_service(c, "gpupool", kube=False, environ={})
    assert str(lab_profiles) in str(stopped.value) and "mig-half" in str(stopped.value)


def test_service_settings_from_an_f_file_reach_the_service_over_its_environment(tmp_path: Path) -> None:
    c = hub_config(ServiceSettings={"policy": "best-fit", "stop_unleased": False, "reconcile_seconds": 2.5})
    pass_to_service(c, "gpupool", kube=False, environ={})
    started = service_settings(c, {"GPUPOOL_POLICY": "fgd", "GPUPOOL_STOP_UNLEASED": "1"})
    assert (started.policy, started.stop_unleased, started.reconcile_seconds) == ("best-fit", False, 2.5)


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (
            {"polcy": "fgd"},
            "c.ServiceSettings.polcy: the gpupool service has no such setting; did you mean policy?",
        ),
        ({"policy": "fastest"}, "fastest"),
        ({"reconcile_seconds": "often"}, "reconcile_seconds"),
    ],
)
def test_a_bad_service_setting_in_an_f_file_stops_the_hub_naming_it(
    values: dict[str, object], said: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        pass_to_service(hub_config(ServiceSettings=values), "gpupool", kube=False, environ={})
    assert said in str(stopped.value), stopped.value


def test_a_relative_pool_file_is_made_absolute_for_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    c = hub_config(ServiceSettings={"pool_file": "lab.yaml"})
    pass_to_service(c, "gpupool", kube=False, environ={})
    assert service_settings(c).pool_file == os.path.join(tmp_path, "lab.yaml")


@pytest.mark.e2e
def test_gpupool_up_with_an_f_file_serves_its_profiles_under_its_policy(tmp_path: Path) -> None:
    """End to end, as the trial did it: the form's profile starts, and the service places with the -f policy."""
    require_proxy()
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "profiles.yaml").write_text(LAB_PROFILES)
    extra = tmp_path / "lab.py"
    extra.write_text(
        "c = get_config()  # noqa\n"
        "c.SimpleLocalGPUSpawner.profiles_file = 'lab/profiles.yaml'\n"
        "c.ServiceSettings.policy = 'best-fit'\n"
    )
    up = start_up(tmp_path, tmp_path / "state", free_port_family(), extra)
    try:
        assert "placement policy best-fit" in up.gpupool_lines()
        assert (  # said at start, not only to whoever opens the form
            "profile h100-x8 can never start on this pool: this pool has at most 6 H100-80GB on one node; "
            "8 were asked for"
        ) in up.gpupool_lines()
        with contextlib.closing(demo_hub_api(up)) as hub:
            server = start_demo_server(up, hub, "mig-half")
            assert environ_of(int(server["state"]["pid"]))["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
            assert hub.delete("/users/demo/server").status_code in (202, 204)
    finally:
        up.stop()


def test_servers_and_jobs_share_the_namespace_an_f_file_gives_the_spawner(lab_profiles: Path) -> None:
    """A Kubernetes trial's ``c.KubeGPUSpawner.namespace = "no-such-ns"`` moved the servers and not the jobs,
    and the start-up line still said ``default``."""
    c = hub_config(KubeGPUSpawner={"namespace": "team-a"})
    pass_to_service(c, "gpupool", kube=True, environ={})
    assert service_settings(c).kube_namespace == "team-a"
    only_service = hub_config(ServiceSettings={"kube_namespace": "team-b"})
    pass_to_service(only_service, "gpupool", kube=True, environ={})
    assert only_service.KubeGPUSpawner.namespace == "team-b"
    both = hub_config(KubeGPUSpawner={"namespace": "team-a"}, ServiceSettings={"kube_namespace": "team-b"})
    with pytest.raises(
        SystemExit, match=r"namespace \(team-a\) and c.ServiceSettings.kube_namespace \(team-b\)"
    ):
        pass_to_service(both, "gpupool", kube=True, environ={})


def test_gpupool_up_takes_the_namespace_of_the_kubeconfigs_context(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "current-context: lab\n"
        "contexts:\n"
        "- {name: other, context: {cluster: c, user: u, namespace: elsewhere}}\n"
        "- {name: lab, context: {cluster: c, user: u, namespace: jhub-users}}\n"
    )
    assert kubeconfig_namespace(str(kubeconfig)) == "jhub-users"
    kubeconfig.write_text("current-context: lab\ncontexts:\n- {name: lab, context: {cluster: c, user: u}}\n")
    assert kubeconfig_namespace(str(kubeconfig)) == "default"
    kubeconfig.write_text("- not\n- a kubeconfig\n")
    with pytest.raises(UpError, match="not a kubeconfig"):
        kubeconfig_namespace(str(kubeconfig))
