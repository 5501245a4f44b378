"""Every manifest gpupool builds for users' servers and jobs, schema-checked (kubernetes-validate, strict: no
unknown field anywhere) against Kubernetes 1.30 and the newest version the installed package bundles, and the
behaviour gpupool relies on: the leased node only, the grant's resources, Kueue, names, failure policy."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_validate.utils import latest_version, major_minor

from gpupool.spawner.kube import job_manifests as jobs
from gpupool.spawner.kube import pods
from gpupool.spawner.kube.grant import KubeGrant
from gpupool.spawner.kube.manifests import (
    KUEUE_QUEUE_LABEL,
    LEASE_LABEL,
    USER_LABEL,
    ManifestError,
    dns_label,
    env_list,
    label_value,
    require_dns_label,
    require_dns_subdomain,
    resource_limits,
)
from gpupool.spawner.service.jobs import processes

VERSIONS = ("1.30", major_minor(latest_version()))
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # with fullmatch: "$" passes "a\n"
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
SERVICE_URL = "http://gpupool:10101/services/gpupool/"
MIG = KubeGrant("dgx-h100-01", {"nvidia.com/mig-3g.40gb": 1})
TWO_GPUS = KubeGrant("a100-box", {"nvidia.com/gpu": 2})
CPU_ONLY = KubeGrant("cpu-node-1", {})


def validate(manifest: dict[str, Any], version: str) -> None:
    """Strict validation against ``version``; the package falls back to an older schema silently, so the
    version it used is checked too."""
    used = kubernetes_validate.validate(manifest, version, strict=True)
    assert used == version, f"validated against {used}, not {version}"


def overrides(grant: KubeGrant = MIG, lease_id: str = "k3x9aZ0qLm2w", user: str = "alice") -> Any:
    return pods.server_pod_overrides(
        grant, lease_id=lease_id, user=user, profile="mig-3g", cpu_milli=4000, memory_mib=32768,
        service_url=SERVICE_URL,
    )  # fmt: skip


def server(grant: KubeGrant = MIG, user: str = "alice") -> dict[str, Any]:
    return pods.server_pod(
        overrides(grant, user=user), name=pods.server_pod_name(user), namespace="jhub",
        image="registry.example.org/gpupool-singleuser:0.1.0", home_claim=f"claim-{dns_label(user)}",
    )  # fmt: skip


def job(grant: KubeGrant = TWO_GPUS, queue: str | None = None, **kwargs: Any) -> dict[str, Any]:
    settings = jobs.JobSettings(namespace="jhub", service_url=SERVICE_URL, queue_name=queue)
    arguments: dict[str, Any] = {
        "job_id": "J7q2mXw9",
        "user": "alice",
        "command": ["python", "train.py", "--epochs", "10"],
        "image": "registry.example.org/gpupool-singleuser:0.1.0",
        "grant": grant,
        "lease_id": "_lease-id9",
        "cpu_milli": 8000,
        "memory_mib": 65536,
        "max_runtime": 6 * 3600,
        "retries": 2,
        **kwargs,
    }
    return jobs.training_job(settings, **arguments)


def kubespawner_pod(grant: KubeGrant) -> dict[str, Any]:
    """The pod KubeSpawner's own ``make_pod`` builds with gpupool's overrides, as the API would receive it."""
    from kubernetes_asyncio.client import ApiClient
    from kubespawner.objects import make_pod

    o = overrides(grant)
    pod = make_pod(
        name="jupyter-alice",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image="registry.example.org/gpupool-singleuser:0.1.0",
        env=o["environment"],
        labels=o["extra_labels"],
        annotations=o["extra_annotations"],
        cpu_limit=o["cpu_limit"],
        cpu_guarantee=o["cpu_guarantee"],
        mem_limit=o["mem_limit"],
        mem_guarantee=o["mem_guarantee"],
        extra_resource_limits=o["extra_resource_limits"],
        extra_resource_guarantees=o["extra_resource_guarantees"],
        tolerations=o["tolerations"],
        node_affinity_required=o["node_affinity_required"],
    )

    async def serialise() -> dict[str, Any]:
        async with ApiClient() as api:  # its connection pool needs a running loop
            serialised: dict[str, Any] = api.sanitize_for_serialization(pod)
            return serialised

    return asyncio.run(serialise())


BUILDERS = {
    "server-mig": lambda: server(MIG),
    "server-two-gpus": lambda: server(TWO_GPUS),
    "server-cpu-only": lambda: server(CPU_ONLY),
    "server-awkward-user": lambda: server(MIG, user="Alice.Smith@x"),
    "kubespawner-make-pod": lambda: kubespawner_pod(MIG),
    "job": lambda: job(),
    "job-kueue": lambda: job(queue="gpu-queue"),
    "job-shell-cpu-only": lambda: job(CPU_ONLY, command=["python train.py | tee out"], shell=True),
    "job-no-deadline": lambda: job(max_runtime=None, retries=0),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_every_manifest_passes_strict_schema_validation(kind: str, version: str) -> None:
    validate(BUILDERS[kind](), version)


def test_strict_validation_catches_a_misspelt_field() -> None:
    """The check above can fail: strict mode refuses a field the schema does not know."""
    pod = server()
    pod["spec"]["containers"][0]["resource"] = pod["spec"]["containers"][0].pop("resources")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pod, VERSIONS[0])


def test_the_newest_bundled_version_is_newer_than_1_30() -> None:
    assert tuple(map(int, VERSIONS[1].split("."))) > (1, 30)


@pytest.mark.parametrize(
    ("build", "node"),
    [(lambda: server()["spec"], "dgx-h100-01"), (lambda: job()["spec"]["template"]["spec"], "a100-box")],
    ids=["server", "job"],
)
def test_a_leased_pod_may_land_only_on_the_leased_node(build: Any, node: str) -> None:
    spec = build()
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
    ]
    assert "nodeName" not in spec  # the scheduler still checks taints and capacity
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_kubespawner_builds_the_same_scheduling_and_resources_from_the_overrides() -> None:
    ours, theirs = server(MIG)["spec"], kubespawner_pod(MIG)["spec"]
    assert theirs["affinity"] == ours["affinity"]
    assert theirs["tolerations"] == ours["tolerations"]
    resources = theirs["containers"][0]["resources"]
    assert (
        resources["limits"]["nvidia.com/mig-3g.40gb"]
        == resources["requests"]["nvidia.com/mig-3g.40gb"]
        == "1"
    )
    env = {e["name"]: e["value"] for e in theirs["containers"][0]["env"]}
    assert env["GPUPOOL_LEASE_ID"] == "k3x9aZ0qLm2w" and env["GPUPOOL_SERVICE_URL"] == SERVICE_URL


@pytest.mark.parametrize("grant", [MIG, TWO_GPUS], ids=["mig", "two-gpus"])
def test_limits_and_requests_equal_the_grant(grant: KubeGrant) -> None:
    for container in (
        server(grant)["spec"]["containers"][0],
        job(grant)["spec"]["template"]["spec"]["containers"][0],
    ):
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        assert limits == requests
        gpu = {k: v for k, v in limits.items() if k not in ("cpu", "memory")}
        assert gpu == {name: str(count) for name, count in grant.limits.items()}
    assert server(grant)["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "4000m"
    assert server(grant)["spec"]["containers"][0]["resources"]["limits"]["memory"] == "32768Mi"


def test_a_cpu_only_lease_sees_no_gpu_and_a_gpu_lease_leaves_the_choice_to_the_device_plugin() -> None:
    cpu_env = overrides(CPU_ONLY)["environment"]
    assert cpu_env["NVIDIA_VISIBLE_DEVICES"] == "void" and cpu_env["CUDA_VISIBLE_DEVICES"] == ""
    assert not overrides(CPU_ONLY)["extra_resource_limits"]
    gpu_env = overrides(MIG)["environment"]
    assert "NVIDIA_VISIBLE_DEVICES" not in gpu_env and "CUDA_VISIBLE_DEVICES" not in gpu_env


def test_an_mps_shares_memory_cap_reaches_the_server_and_the_job_container() -> None:
    capped = KubeGrant(
        "gpu-a100-01", {"nvidia.com/gpu.shared": 1}, {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6144M"}
    )
    (container,) = server(capped)["spec"]["containers"]
    assert {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=6144M"} in container["env"]
    (job_container,) = job(capped, env={"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=99999M"})["spec"]["template"][
        "spec"
    ]["containers"]
    env = {e["name"]: e.get("value") for e in job_container["env"]}
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"  # the user's own value cannot lift the cap


def test_pods_carry_the_lease_and_user_labels_and_the_exact_lease_id() -> None:
    meta = server(user="Alice.Smith@x")["metadata"]
    assert meta["labels"][LEASE_LABEL] == "k3x9aZ0qLm2w"
    assert LABEL_VALUE.fullmatch(meta["labels"][USER_LABEL])
    assert meta["labels"][USER_LABEL] == label_value("Alice.Smith@x")
    assert meta["annotations"][LEASE_LABEL] == "k3x9aZ0qLm2w"


def test_the_kueue_variant_is_suspended_and_labelled_and_the_plain_one_is_not() -> None:
    queued, plain = job(queue="gpu-queue"), job()
    assert queued["spec"]["suspend"] is True
    assert queued["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "gpu-queue"
    assert "suspend" not in plain["spec"] and KUEUE_QUEUE_LABEL not in plain["metadata"]["labels"]


def test_awkward_names_yield_valid_unique_names() -> None:
    users = ["Alice.Smith@x", "alice.smith@x", "alice-smith-x", "alice_smith_x", "ALICE", "alice", "a" * 200]
    names = [pods.server_pod_name(u) for u in users]
    assert len(set(names)) == len(users)
    assert all(DNS_LABEL.fullmatch(n) and len(n) <= 63 for n in names)
    assert pods.server_pod_name("alice") == "jupyter-alice"  # a valid name stays readable
    job_names = {job(job_id=i)["metadata"]["name"] for i in ("J7q2mXw9", "j7q2mxw9", "_j7q2mXw9-")}
    assert len(job_names) == 3 and all(DNS_LABEL.fullmatch(n) for n in job_names)


@given(st.text(min_size=0, max_size=120), st.text(min_size=0, max_size=120))
def test_dns_labels_and_label_values_are_always_valid_and_never_shared(a: str, b: str) -> None:
    for value in (a, b):
        assert DNS_LABEL.fullmatch(dns_label(value)) and len(dns_label(value)) <= 63
        assert LABEL_VALUE.fullmatch(label_value(value)) and len(label_value(value)) <= 63
    if a != b:
        assert dns_label(a) != dns_label(b)
        assert label_value(a) != label_value(b)


@pytest.mark.parametrize("value", ["\n", "alice\n", "alice\r\n", "Alice.Smith\n"])
def test_a_name_ending_in_a_newline_is_hashed_not_passed_through(value: str) -> None:
    """A user name with a trailing newline once came back unchanged (hypothesis found it): the API server
    would refuse the pod's labels, so that user could never start a server on Kubernetes."""
    assert "\n" not in dns_label(value) and dns_label(value) != value.strip()
    assert "\n" not in label_value(value) and label_value(value) != value.strip()


@pytest.mark.parametrize(
    "check",
    [
        lambda: require_dns_label("users\n", "namespace"),
        lambda: require_dns_subdomain("node-1\n", "node"),
        lambda: env_list({"CUDA_VISIBLE_DEVICES\n": "0"}),
        lambda: resource_limits({"nvidia.com/gpu\n": 1}),
    ],
    ids=["namespace", "node", "env name", "resource name"],
)
def test_names_ending_in_a_newline_are_refused(check: Any) -> None:
    with pytest.raises(ManifestError, match=r"\\n"):
        check()


def test_lease_ids_that_are_not_label_values_still_label_a_job() -> None:
    """token_urlsafe ids may start or end with '-' or '_', which a label value may not."""
    labels = job(lease_id="-ab_cd-ef01_")["metadata"]["labels"]
    assert LABEL_VALUE.fullmatch(labels[LEASE_LABEL]) and labels[LEASE_LABEL] == label_value("-ab_cd-ef01_")
    assert job(lease_id="-ab_cd-ef01_")["metadata"]["annotations"][LEASE_LABEL] == "-ab_cd-ef01_"


def _policy_action(job_manifest: dict[str, Any], pod_status: dict[str, Any]) -> str:
    """The action of the first rule of the Job's podFailurePolicy that matches a failed pod, as the Job
    controller evaluates it (rules in order; onExitCodes on the named container's terminated exit code;
    onPodConditions on a condition of that type and status); "Count" when none does."""
    for rule in job_manifest["spec"]["podFailurePolicy"]["rules"]:
        if "onPodConditions" in rule:
            wanted = {(c["type"], c["status"]) for c in rule["onPodConditions"]}
            if any((c["type"], c["status"]) in wanted for c in pod_status.get("conditions", [])):
                return str(rule["action"])
        if "onExitCodes" in rule:
            match = rule["onExitCodes"]
            for status in pod_status.get("containerStatuses", []):
                if status["name"] != match["containerName"]:
                    continue
                code = status["state"]["terminated"]["exitCode"]
                inside = code in match["values"]
                if (match["operator"] == "In") == inside:
                    return str(rule["action"])
    return "Count"


def _failed(exit_code: int, *conditions: str) -> dict[str, Any]:
    return {
        "conditions": [{"type": c, "status": "True"} for c in conditions],
        "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": exit_code}}}],
    }


def test_the_failure_policy_retries_a_disruption_and_fails_on_the_users_error() -> None:
    manifest = job()
    # preempted or evicted: the kubelet killed the container (137), and the pod says it was disrupted
    assert _policy_action(manifest, _failed(137, "DisruptionTarget")) == "Ignore"
    assert _policy_action(manifest, _failed(1)) == "FailJob"  # the training script's own error
    assert _policy_action(manifest, _failed(137)) == "FailJob"  # out of memory, no disruption: the user's
    assert _policy_action(manifest, _failed(0)) == "Count"
    spec = manifest["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"  # required by podFailurePolicy; the Job decides, not the kubelet
    assert spec["containers"][0]["name"] == jobs.MAIN_CONTAINER
    assert manifest["spec"]["backoffLimit"] == 2


def test_a_job_runs_its_argv_without_a_shell_unless_asked() -> None:
    main = job()["spec"]["template"]["spec"]["containers"][0]
    assert main["command"] == ["python", "train.py", "--epochs", "10"] and "args" not in main
    shelled = job(command=["python train.py | tee out"], shell=True)["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert shelled["command"] == ["/bin/sh", "-c", "python train.py | tee out"]
    with pytest.raises(ManifestError, match="command: expected a list of arguments"):
        job(command="python train.py")
    with pytest.raises(ManifestError, match="one shell line"):
        job(command=["python", "train.py"], shell=True)


def test_the_deadline_is_the_maximum_runtime_rounded_up() -> None:
    assert job(max_runtime=90.2)["spec"]["activeDeadlineSeconds"] == 91
    assert "activeDeadlineSeconds" not in job(max_runtime=None)["spec"]
    with pytest.raises(ManifestError, match="max_runtime"):
        job(max_runtime=0)


def test_checkpoints_live_where_the_local_runner_keeps_them_on_the_users_home_volume() -> None:
    assert (jobs.JOBS_SUBDIR, jobs.CHECKPOINTS) == (processes.JOBS_SUBDIR, processes.CHECKPOINTS)
    spec = job()["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env["GPUPOOL_CHECKPOINT_DIR"] == "/home/jovyan/.gpupool/jobs/J7q2mXw9/checkpoint"
    assert spec["volumes"] == [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "home", "mountPath": "/home/jovyan"}]
    assert spec["initContainers"][0]["command"][-1] == env["GPUPOOL_CHECKPOINT_DIR"]


def test_gpupool_variables_win_over_the_users_env() -> None:
    main = job(env={"GPUPOOL_CHECKPOINT_DIR": "/tmp/x", "WANDB_MODE": "offline"})["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in main["containers"][0]["env"]}
    assert env["GPUPOOL_CHECKPOINT_DIR"].startswith("/home/jovyan/") and env["WANDB_MODE"] == "offline"


@pytest.mark.parametrize("scheme", ["safe", "escape"])
@pytest.mark.parametrize(
    "template", ["claim-{username}", "claim-{username}{servername}", "claim-{user_server}"]
)
@pytest.mark.parametrize("user", ["Alice.Smith@x", "bob", "a" * 60])
def test_the_home_claim_is_the_one_kubespawner_names_for_the_users_server(
    scheme: str, template: str, user: str
) -> None:
    """A Job mounts the volume the user's server has: KubeSpawner's own expansion (run on a stand-in for the
    spawner, whose constructor wants a cluster) names the same claim."""
    from kubespawner import KubeSpawner

    spawner = SimpleNamespace(
        name="", user=SimpleNamespace(name=user, id=1), slug_scheme=scheme, _namespace_default=lambda: "jhub"
    )
    settings = jobs.JobSettings(namespace="jhub", claim_template=template, slug_scheme=scheme)
    assert jobs.home_claim_name(settings, user) == KubeSpawner._expand_user_properties(spawner, template)


@pytest.mark.parametrize("pod", [server, lambda: job()])
def test_leased_pods_never_run_as_root(pod: Any) -> None:
    manifest = pod()
    spec = manifest["spec"] if manifest["kind"] == "Pod" else manifest["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    for container in spec.get("initContainers", []) + spec["containers"]:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    ("grant", "field"),
    [
        (KubeGrant("dgx-h100-01", {"mig-3g.40gb": 1}), "grant.limits"),
        (KubeGrant("dgx-h100-01", {"nvidia.com/gpu": 0}), "grant.limits\\['nvidia.com/gpu'\\]"),
        (KubeGrant("DGX_H100", {"nvidia.com/gpu": 1}), "grant.node"),
    ],
)
def test_errors_name_the_field_and_what_was_expected(grant: KubeGrant, field: str) -> None:
    with pytest.raises(ManifestError, match=f"^{field}: .*expected"):
        overrides(grant)
    with pytest.raises(ManifestError, match=r"settings\.namespace: expected an RFC 1123 label"):
        jobs.JobSettings(namespace="JHub")
    with pytest.raises(ManifestError, match="cpu_milli: expected"):
        pods.server_pod_overrides(
            MIG, lease_id="x", user="u", profile="p", cpu_milli=0, memory_mib=1, service_url=SERVICE_URL
        )
