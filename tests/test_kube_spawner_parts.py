"""The parts of ``KubeGPUSpawner`` that need no cluster: its profile list, the pod a lease makes through
KubeSpawner's own pod builder, and Kubernetes events in plain words."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kube_cluster import point_kubespawner_at
from kubernetes_asyncio.client import ApiClient

from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES, load_profiles
from gpupool.spawner.hub import form
from gpupool.spawner.hub.compat import SpawnException
from gpupool.spawner.hub.kube_spawner import KubeGPUSpawner
from gpupool.spawner.kube.events import plain_event

PROFILES = load_profiles(EXAMPLE_PROFILES)
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: none, user: {token: unused}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


@pytest.fixture(autouse=True)
def _kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KubeSpawner loads a client configuration even when nothing calls the API: one that leads nowhere."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    point_kubespawner_at(monkeypatch, path)


class _User:
    """What KubeSpawner reads of a hub user."""

    def __init__(self, name: str, groups: tuple[str, ...] = ()) -> None:
        self.name = name
        self.id = 7
        self.url = f"/user/{name}/"
        self.admin = False
        self.groups = [type("Group", (), {"name": g})() for g in groups]
        self.settings: dict[str, Any] = {}


def _spawner(name: str = "alice", **config: Any) -> KubeGPUSpawner:
    spawner = KubeGPUSpawner(
        _mock=True,
        user=_User(name),
        service_url="http://gpupool:10101/services/gpupool/",
        service_api_token="t",
        **config,
    )
    spawner.user_options = {"profile": "mig-3g"}
    return spawner


def _lease(limits: dict[str, int], node: str = "dgx-h100-01") -> dict[str, Any]:
    return {
        "id": "lease-1",
        "profile": "mig-3g",
        "devices": [],
        "kubernetes": {"node": node, "limits": limits},
    }


def test_the_profile_list_shows_only_usable_profiles_with_what_could_start_now() -> None:
    choices = form.choices_for(
        PROFILES, [], False, {"mig-3g": (2, 0), "h100": (0, 3)}, {"a100-pair": "no node has two A100s"}
    )
    listed = {row["slug"]: row for row in form.profile_list(choices)}
    assert "h100-x4" not in listed  # only for the training group
    assert "a100-pair" not in listed  # never fits this pool
    assert "2 can start now" in str(listed["mig-3g"]["description"])
    assert "none free now, 3 waiting: you would queue" in str(listed["h100"]["description"])
    assert sum(1 for row in listed.values() if row.get("default")) == 1
    assert all("kubespawner_override" not in row for row in listed.values())  # the lease decides


def test_the_profile_list_keeps_a_profile_the_users_quota_refuses_now_saying_so_and_never_as_default() -> (
    None
):
    """With the spawn form's closed rows out of KubeSpawner's reach, a profile over the user's quota vanished
    from its list without a word."""
    said = "stu1's quota allows 1 MIG slice at once; 1 is held or queued and 1 more was asked for"
    choices = form.choices_for(PROFILES, [], False, {"mig-3g": (2, 0)}, {}, over_quota={"mig-3g": said})
    listed = {row["slug"]: row for row in form.profile_list(choices)}
    assert str(listed["mig-3g"]["description"]).endswith(f"not now: {said}")
    assert not listed["mig-3g"].get("default") and sum(1 for r in listed.values() if r.get("default")) == 1


def test_a_lease_becomes_the_pods_node_affinity_limits_labels_and_environment() -> None:
    async def leased() -> dict[str, Any]:
        spawner = _spawner(
            tolerations=[{"key": "hub.jupyter.org/dedicated", "operator": "Exists"}],
            cmd=["jupyterhub-singleuser"],  # Zero to JupyterHub's singleuser.cmd
        )
        spawner.apply_lease(_lease({"nvidia.com/mig-3g.40gb": 1}))
        return await _pod(spawner)

    manifest = asyncio.run(leased())
    container = manifest["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == "1"
    assert container["resources"]["requests"]["nvidia.com/mig-3g.40gb"] == "1"
    terms = manifest["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["dgx-h100-01"]
    keys = [t.get("key") for t in manifest["spec"]["tolerations"]]
    assert "hub.jupyter.org/dedicated" in keys and "nvidia.com/gpu" in keys  # the configured one is kept
    assert manifest["metadata"]["labels"]["gpupool.io/lease"] == "lease-1"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUPOOL_LEASE_ID"] == "lease-1" and "CUDA_VISIBLE_DEVICES" not in env
    # a Kubernetes trial: job folders hidden from JupyterLab, and terminals without the server's PATH
    argv = [*container.get("command", []), *container.get("args", [])]
    assert "--ContentsManager.allow_hidden=True" in argv, argv
    assert any(arg.startswith("--ServerApp.terminado_settings=") for arg in argv), argv
    kubernetes_validate.validate(manifest, "1.30", strict=True)


def test_a_second_lease_replaces_the_first_instead_of_piling_up() -> None:
    async def leased_twice() -> dict[str, Any]:
        spawner = _spawner()
        spawner.apply_lease(_lease({"nvidia.com/gpu": 2}, node="a100-node"))
        spawner.apply_lease(_lease({"nvidia.com/mig-3g.40gb": 1}))
        return await _pod(spawner)

    manifest = asyncio.run(leased_twice())
    limits = manifest["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits and limits["nvidia.com/mig-3g.40gb"] == "1"
    assert [t.get("key") for t in manifest["spec"]["tolerations"]].count("nvidia.com/gpu") == 1


def test_a_lease_without_a_kubernetes_placement_is_a_configuration_error() -> None:
    async def unplaced() -> None:
        _spawner().apply_lease({"id": "x", "profile": "mig-3g", "devices": []})

    with pytest.raises(SpawnException, match="GPUPOOL_BACKEND=kubernetes"):
        asyncio.run(unplaced())


@pytest.mark.parametrize(
    ("reason", "message", "said"),
    [
        (
            "Scheduled",
            "Successfully assigned jhub/jupyter-alice to dgx-h100-01",
            "placed on node dgx-h100-01, the node of its gpupool lease",  # a CPU-only one has no GPUs to lease
        ),
        (
            "FailedScheduling",
            "0/2 nodes are available: 1 Insufficient nvidia.com/mig-3g.40gb, 1 node(s) didn't match Pod's "
            "node affinity/selector.",
            "no free nvidia.com/mig-3g.40gb",
        ),
        (
            "Pulling",
            'Pulling image "quay.io/x/gpupool-singleuser:1"',
            "Downloading quay.io/x/gpupool-singleuser:1",
        ),
        ("Started", "Started container notebook", "JupyterLab is coming up"),
        ("SomethingNew", "as Kubernetes wrote it", "as Kubernetes wrote it"),
    ],
)
def test_pod_events_read_as_plain_sentences(reason: str, message: str, said: str) -> None:
    assert said in plain_event(reason, message)


async def _pod(spawner: KubeGPUSpawner) -> dict[str, Any]:
    """The pod KubeSpawner itself would create for ``spawner``, as the API server would receive it."""
    spawner.api_token = "token"
    spawner.oauth_client_id = "jupyterhub-user-alice"
    built = await spawner.get_pod_manifest()
    serialized: dict[str, Any] = ApiClient().sanitize_for_serialization(built)
    return serialized
