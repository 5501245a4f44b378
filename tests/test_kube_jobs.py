"""Jobs on Kubernetes against the real control plane: the real job manager, lease manager and store, its
Kubernetes runner acting as the ServiceAccount ``gpupool kube manifests`` creates; the real Job controller runs
the ``batch/v1`` Jobs, the real scheduler binds their pods to the leased node, and gpupool's simulated kubelet
runs the job's command there as a process, so the exit code, the log and the timing are the command's own.
A command's exit code decides success or failure; the Job's deadline times a job out; an eviction (the
``DisruptionTarget`` condition) requeues it as attempt 2; a node whose kubelet falls silent goes NotReady
through the node-lifecycle controller and its job runs again on a healthy node; cancel deletes the Job and
its pod; with Kueue the Job starts suspended and the Job controller starts no pod."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kube_cluster import (
    A100,
    LocalKube,
    Relay,
    home_claim,
    l4_node,
    own_node,
    service_account_kubeconfig,
)
from kube_cluster import eventually as kube_eventually

from gpupool.spawner.kube.job_manifests import job_name
from gpupool.spawner.pool.job_states import Job, JobState
from gpupool.spawner.pool.leases import LeaseState
from gpupool.spawner.service.api.job_routes import job_out
from gpupool.spawner.service.assembly import assemble
from gpupool.spawner.service.jobs.job_manager import JobManager
from gpupool.spawner.service.jobs.runner import NoHome
from gpupool.spawner.service.jobs.submission import InvalidJob, Submission
from gpupool.spawner.service.kube_pool import load_kube_pool
from gpupool.spawner.service.settings import ServiceSettings
from gpupool.spawner.service.store.lease_store import sqlite_url

IMAGE = "registry.example.org/gpupool-singleuser:1.0"
PROFILES = """
profiles:
  - {slug: a100, display_name: One A100, gpus: {count: 1, products: [A100-40GB]}, cpu: 2, memory: 4GiB, max_lifetime: 1h}
  - {slug: l4, display_name: One L4, gpus: {count: 1, products: [L4-24GB]}, cpu: 2, memory: 4GiB, max_lifetime: 1h}
  - {slug: short, display_name: One A100 for 3 s, gpus: {count: 1, products: [A100-40GB]}, cpu: 2, memory: 4GiB,
     max_lifetime: 3}
"""
SERVICE_URL = "http://gpupool.jhub.svc:10101/services/gpupool/"


def until_file(path: Path, *lines: str, exit_code: int = 0) -> list[str]:
    """A job command that prints ``lines``, waits for ``path`` to exist, then exits with ``exit_code``."""
    echo = "".join(f"echo '{line}'; " for line in lines)
    return ["sh", "-c", f"{echo}while [ ! -e '{path}' ]; do sleep 0.1; done; exit {exit_code}"]


class Service:
    """The service as its composition root builds it for ``GPUPOOL_BACKEND=kubernetes``, in a namespace of the
    test's own, as the manifests' ServiceAccount; the tests drive its job manager and watches."""

    def __init__(self, kube: LocalKube, tmp: Path, queue: str = "", **settings: Any) -> None:
        self.kube = kube
        self.namespace = kube.namespace("jobs")
        for user in ("alice", "bob"):
            home_claim(kube, self.namespace, user)
        kubeconfig = service_account_kubeconfig(kube, self.namespace, tmp / "kubeconfig")
        (tmp / "profiles.yaml").write_text(PROFILES)
        self.service = assemble(
            ServiceSettings(
                backend="kubernetes",
                kubeconfig=str(kubeconfig),
                kube_namespace=self.namespace,
                kube_job_image=IMAGE,
                kueue_queue=queue,
                service_url=SERVICE_URL,
                job_grace_seconds=1,
                profiles_file=str(tmp / "profiles.yaml"),
                db_url=sqlite_url(str(tmp / "leases.sqlite")),
                hub_api_url="http://127.0.0.1:9/hub/api",  # no hub: these tests call the managers directly
                reconcile_seconds=0,
                sample_seconds=0,
                **settings,
            )
        )
        self.manager, self.jobs = self.service.manager, self.service.jobs
        assert self.service.cluster is not None
        self.cluster = self.service.cluster

    def run(self, scenario: Callable[[JobManager], Awaitable[None]]) -> None:
        """Run ``scenario`` against the job manager while the service runs (its watches and its job loop)."""

        async def main() -> None:
            async with self.running() as jobs:
                await scenario(jobs)

        asyncio.run(main())

    @asynccontextmanager
    async def running(self) -> AsyncIterator[JobManager]:
        async with self.cluster.watching():
            loop = asyncio.create_task(self.jobs.run_forever(interval=0.05))
            try:
                yield self.jobs
            finally:
                loop.cancel()
                await asyncio.gather(loop, return_exceptions=True)

    def kube_job(self, job: Job, attempt: int = 1) -> dict[str, Any] | None:
        return self.kube.get(f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{job_name(job.id, attempt)}")

    def pods(self, job: Job, attempt: int = 1) -> list[dict[str, Any]]:
        selector = f"batch.kubernetes.io/job-name={job_name(job.id, attempt)}"
        return self.kube.items(f"/api/v1/namespaces/{self.namespace}/pods", labelSelector=selector)

    def running_pod(self, job: Job, attempt: int = 1) -> dict[str, Any] | None:
        running = [p for p in self.pods(job, attempt) if p.get("status", {}).get("phase") == "Running"]
        return running[0] if running else None


async def eventually(condition: Callable[[], Any], what: str, timeout_s: float = 45.0) -> Any:
    """``condition()`` once truthy; generous, because CI shares two cores with the whole control plane."""
    deadline = time.monotonic() + timeout_s
    while not (found := await asyncio.to_thread(condition)):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.1)
    return found


def state(jobs: JobManager, job: Job) -> JobState:
    return jobs.get(job.id).state


def test_a_job_becomes_a_batch_job_on_its_leased_node_reads_its_pods_log_and_succeeds(
    kube: LocalKube, tmp_path: Path
) -> None:
    service = Service(kube, tmp_path)
    done = tmp_path / "done"
    command = until_file(done, "epoch 1 loss 0.9", "epoch 2 loss 0.5")

    async def scenario(jobs: JobManager) -> None:
        job, _ = jobs.submit(
            "alice", [], Submission(profile="a100", command=command, working_dir="/home/jovyan/work")
        )
        lease = jobs.leases.get(job.lease_id or "")
        assert lease.state is LeaseState.GRANTED and lease.node == A100
        created = await eventually(lambda: service.kube_job(job), "the Job")
        pod = created["spec"]["template"]["spec"]
        main = pod["containers"][0]
        # the API server stores quantities in canonical form (2000m is 2, 4096Mi is 4Gi)
        assert main["resources"]["limits"] == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
        assert main["image"] == IMAGE and main["command"] == command
        assert main["workingDir"] == "/home/jovyan/work"
        assert pod["volumes"] == [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}]
        env = {e["name"]: e["value"] for e in main["env"]}
        assert env["GPUPOOL_CHECKPOINT_DIR"] == f"/home/jovyan/.gpupool/jobs/{job.id}/checkpoint"
        assert env["GPUPOOL_JOB_ATTEMPT"] == "1" and env["GPUPOOL_LEASE_ID"] == lease.id
        assert env["GPUPOOL_SERVICE_URL"] == SERVICE_URL  # the widgets inside the job find the service
        assert pod["securityContext"]["runAsUser"] == 1000
        assert created["spec"]["activeDeadlineSeconds"] == 3600 and created["spec"].get("suspend") is False
        running = await eventually(lambda: service.running_pod(job), "the Job's pod running")
        assert running["spec"]["nodeName"] == A100  # bound by the real scheduler to the leased node
        assert state(jobs, job) is JobState.RUNNING
        expected = b"epoch 1 loss 0.9\nepoch 2 loss 0.5\n"
        await eventually(
            lambda: jobs.read_log(jobs.get(job.id)) == expected, "the log, through the API server"
        )
        assert jobs.read_log(jobs.get(job.id), offset=17) == b"epoch 2 loss 0.5\n"
        done.touch()
        await eventually(lambda: state(jobs, job) is JobState.SUCCEEDED, "the job to succeed")
        assert jobs.get(job.id).exit_code == 0
        assert jobs.leases.get(lease.id).state is LeaseState.RELEASED
        assert jobs.leases.pool.allocations == {}

    service.run(scenario)


def test_a_user_without_a_home_claim_is_told_to_start_a_server_before_the_job_is_queued(
    kube: LocalKube, tmp_path: Path
) -> None:
    """A Kubernetes trial's job mounted a claim that did not exist: its pod waited unscheduled while gpupool
    called the job running, until its deadline timed it out, having never run."""
    service = Service(kube, tmp_path)
    ask = Submission(profile="a100", command=["true"])

    async def scenario(jobs: JobManager) -> None:
        with pytest.raises(
            NoHome, match=f"claim-carol in namespace {service.namespace}, and there is none yet"
        ):
            jobs.submit("carol", [], ask)
        assert jobs.leases.pool.allocations == {}  # nothing held, nothing queued
        home_claim(kube, service.namespace, "carol")

        def submitted() -> Job | None:
            with contextlib.suppress(NoHome):  # until the watch has seen the claim
                return jobs.submit("carol", [], ask)[0]
            return None

        job = await eventually(submitted, "the job accepted once the claim exists")
        await eventually(lambda: state(jobs, job) is JobState.SUCCEEDED, "the job to succeed")

    service.run(scenario)


def test_the_users_exit_code_fails_the_job_and_a_deadline_times_it_out(
    kube: LocalKube, tmp_path: Path
) -> None:
    service = Service(kube, tmp_path)
    done = tmp_path / "done"

    async def scenario(jobs: JobManager) -> None:
        failing, _ = jobs.submit(
            "alice", [], Submission(profile="a100", command=until_file(done, exit_code=3))
        )
        await eventually(lambda: service.running_pod(failing), "the failing job's pod running")
        done.touch()
        await eventually(lambda: state(jobs, failing).finished, "the failing job to end")
        ended = jobs.get(failing.id)
        assert ended.state is JobState.FAILED and ended.exit_code == 3 and ended.requeues == 0
        assert ended.reason == "the command exited with status 3"
        slow, _ = jobs.submit("bob", [], Submission(profile="short", command=["sleep", "600"]))
        await eventually(lambda: state(jobs, slow).finished, "the slow job to end", timeout_s=60)
        timed_out = jobs.get(slow.id)
        assert timed_out.state is JobState.TIMED_OUT and "3 s" in timed_out.reason, timed_out.reason
        await eventually(lambda: jobs.leases.pool.allocations == {}, "every lease released")

    service.run(scenario)


def test_an_evicted_pod_requeues_the_job_and_a_new_job_runs_attempt_2(
    kube: LocalKube, tmp_path: Path
) -> None:
    service = Service(kube, tmp_path)
    done = tmp_path / "done"

    async def scenario(jobs: JobManager) -> None:
        job, _ = jobs.submit("alice", [], Submission(profile="a100", command=until_file(done)))
        pod = await eventually(lambda: service.running_pod(job), "attempt 1's pod running")
        name = pod["metadata"]["name"]
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
        kube.request("POST", f"/api/v1/namespaces/{service.namespace}/pods/{name}/eviction", eviction)
        second = await eventually(lambda: service.kube_job(job, 2), "attempt 2's Job")
        await eventually(
            lambda: service.kube_job(job, 1) is None, "attempt 1's Job deleted, not left to retry"
        )
        history = [t.state for t in jobs.get(job.id).history]
        assert history == [JobState.QUEUED, JobState.RUNNING, JobState.REQUEUED, JobState.RUNNING]
        assert "EvictionByEvictionAPI" in jobs.get(job.id).history[2].reason
        env = {e["name"]: e["value"] for e in second["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["GPUPOOL_JOB_ATTEMPT"] == "2" and env["GPUPOOL_LEASE_ID"] == f"{job.id}-2"
        await eventually(lambda: service.running_pod(job, 2), "attempt 2's pod running")
        done.touch()
        await eventually(lambda: state(jobs, job) is JobState.SUCCEEDED, "attempt 2 to succeed")
        assert jobs.get(job.id).attempts == 2

    service.run(scenario)


def test_a_node_whose_kubelet_falls_silent_stops_its_job_and_it_runs_again_on_a_healthy_node(
    kube: LocalKube, tmp_path: Path
) -> None:
    with own_node(kube, l4_node("l4-jobs-a")) as first, own_node(kube, l4_node("l4-jobs-b")) as second:
        service = Service(kube, tmp_path)
        agents = {first.name: first, second.name: second}

        async def scenario(jobs: JobManager) -> None:
            job, _ = jobs.submit("alice", [], Submission(profile="l4", command=["sleep", "600"]))
            leased = jobs.leases.get(job.lease_id or "").node or ""
            other = next(name for name in agents if name != leased)
            pod = await eventually(lambda: service.running_pod(job), "attempt 1's pod running")
            assert pod["spec"]["nodeName"] == leased
            agents[leased].go_silent()
            await eventually(lambda: service.kube_job(job, 1) is None, "the first Job deleted", timeout_s=60)
            second_job = await eventually(lambda: service.kube_job(job, 2), "attempt 2's Job")
            terms = second_job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
            node = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            assert node["matchExpressions"][0]["values"] == [other]
            assert jobs.leases.get(f"{job.id}-2").node == other
            assert f"node {leased} was marked unhealthy" in jobs.get(job.id).history[2].reason
            moved = await eventually(lambda: service.running_pod(job, 2), "attempt 2's pod running")
            assert moved["spec"]["nodeName"] == other
            jobs.cancel(job.id, "the test")
            await eventually(lambda: state(jobs, job) is JobState.CANCELLED, "the job cancelled")

        service.run(scenario)


def test_cancelling_a_running_job_deletes_its_kubernetes_job_and_stops_its_command(
    kube: LocalKube, tmp_path: Path
) -> None:
    service = Service(kube, tmp_path)
    alive = tmp_path / "alive"

    async def scenario(jobs: JobManager) -> None:
        command = [
            "sh",
            "-c",
            f"trap 'rm -f {alive}; exit 143' TERM; echo started; touch {alive}; while true; do sleep 0.1; done",
        ]
        job, _ = jobs.submit("alice", [], Submission(profile="a100", command=command))
        await eventually(alive.exists, "the command started")
        jobs.cancel(job.id, "user alice")
        await eventually(lambda: state(jobs, job) is JobState.CANCELLED, "the job cancelled")
        await eventually(
            lambda: service.kube_job(job) is None and service.pods(job) == [], "Job and pod gone"
        )
        assert not alive.exists()  # the command had its SIGTERM
        assert jobs.get(job.id).reason == "cancelled by user alice"
        assert jobs.leases.pool.allocations == {}
        # a Kubernetes trial: the cancelled run's log went with its pod, and `gpupool logs` printed nothing
        cancelled = jobs.get(job.id)
        await eventually(lambda: jobs.read_log(cancelled) == b"started\n", "the log kept past the pod")
        assert job_out(jobs, cancelled).log_path is None  # no output.log in its folder on a cluster

    service.run(scenario)


def test_a_job_whose_pod_the_scheduler_cannot_place_says_why_while_it_has_not_started(
    kube: LocalKube, tmp_path: Path
) -> None:
    """A Kubernetes trial: a job whose pod stayed Pending was shown running, with nothing to say why, until
    its deadline. Here the user's home claim asks for a storage class nothing provisions."""
    service = Service(kube, tmp_path)
    kube.request(
        "POST",
        f"/api/v1/namespaces/{service.namespace}/persistentvolumeclaims",
        {
            "metadata": {"name": "claim-dave"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "no-such-class",
            },
        },
    )

    async def scenario(jobs: JobManager) -> None:
        def submitted() -> Job | None:
            with contextlib.suppress(NoHome):  # until the watch has seen the claim
                return jobs.submit("dave", [], Submission(profile="a100", command=["true"]))[0]
            return None

        job = await eventually(submitted, "the job accepted once the claim exists")

        def held_up() -> str | None:
            return job_out(jobs, jobs.get(job.id)).held_up

        said = await eventually(
            lambda: (held_up() or "").startswith("its pod is not scheduled: ") and held_up(),
            "the scheduler's reason",
        )
        assert "PersistentVolumeClaim" in said, said
        assert state(jobs, job) is JobState.RUNNING and service.running_pod(job) is None
        why = jobs.get(job.id).history[-1].reason  # `gpupool jobs`' WHY beside the hold-up
        assert why.startswith("attempt 1 created as a Kubernetes Job for ") and "started" not in why, why
        jobs.cancel(job.id, "user dave")
        await eventually(lambda: state(jobs, job) is JobState.CANCELLED, "the job cancelled")
        assert job_out(jobs, jobs.get(job.id)).held_up is None

    service.run(scenario)


def test_the_api_servers_refusal_to_read_a_log_is_no_log_not_the_jobs_output(
    kube: LocalKube, tmp_path: Path
) -> None:
    """A Kubernetes trial's follow() printed {"kind":"Status",…,"code":404} as the job's log: a pod read as it
    started (or went) answered 404, and the raw answer was kept as if it were the log."""
    service = Service(kube, tmp_path)

    async def scenario(jobs: JobManager) -> None:
        logs = jobs.runner.logs  # the Kubernetes runner's
        gone = [
            {"metadata": {"name": "gpupool-job-gone-1-abcde", "creationTimestamp": "2026-12-07T00:00:00Z"}}
        ]
        await logs.keep("gone", "gpupool-job-gone-1", lambda: gone)  # the real API server: 404, no such pod
        assert logs.read("gone", "gpupool-job-gone-1", lambda: gone, 0, 1 << 20) == b""

    service.run(scenario)


def test_a_job_whose_pod_a_resource_quota_refuses_says_so_then_fails_and_gives_its_gpu_back(
    kube: LocalKube, tmp_path: Path
) -> None:
    """Stop 34 left this alone: a namespace's ResourceQuota refused the Job's pod, the job read "its Job has no
    pod yet" and held its A100 until its maximum runtime. The Job controller's FailedCreate event says why."""
    service = Service(kube, tmp_path, kube_job_refused_seconds=4)
    quota = {"metadata": {"name": "no-gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}}
    path = f"/api/v1/namespaces/{service.namespace}/resourcequotas"
    kube.request("POST", path, quota)
    await_quota = f"{path}/no-gpus"
    # until the quota controller has counted the namespace, admission refuses with another reason
    kube_eventually(lambda: (kube.get(await_quota) or {}).get("status", {}).get("hard"), "the quota counted")

    async def scenario(jobs: JobManager) -> None:
        job, _ = jobs.submit("alice", [], Submission(profile="a100", command=["true"]))
        said = await eventually(
            lambda: (
                (job_out(jobs, jobs.get(job.id)).held_up or "").startswith("the cluster refuses")
                and job_out(jobs, jobs.get(job.id)).held_up
            ),
            "the cluster's refusal shown",
        )
        assert "exceeded quota: no-gpus" in said and "the run fails after 4 s" in said, said
        assert state(jobs, job) is JobState.RUNNING and jobs.leases.pool.allocations != {}
        await eventually(lambda: state(jobs, job).finished, "the refused job to end")
        ended = jobs.get(job.id)
        assert ended.state is JobState.FAILED and ended.requeues == 0, ended
        assert ended.reason.startswith("the cluster refused to create its pod for "), ended.reason
        assert "exceeded quota: no-gpus" in ended.reason and "Error creating" not in ended.reason
        await eventually(lambda: jobs.leases.pool.allocations == {}, "its A100 back in the pool")
        await eventually(lambda: service.kube_job(job) is None, "its Job deleted")

    service.run(scenario)


def test_a_job_placed_as_the_api_server_stops_answering_is_created_once_it_answers(
    kube: LocalKube, tmp_path: Path
) -> None:
    """A Kubernetes trial's job, placed while the API server was shutting down, failed for good with
    "its Kubernetes Job could not be created: ClientConnectorError". Its create is now tried again. (The
    service reaches the API server through a relay this test cuts; the cluster keeps running.)"""
    service = Service(kube, tmp_path)
    backend = service.cluster.backend
    target = urlsplit(kube.url)
    relay = Relay(target.hostname or "127.0.0.1", target.port or 443)

    async def scenario() -> None:
        port = await relay.open(0)
        config = yaml.safe_load(Path(backend.kubeconfig or "").read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
        (tmp_path / "relayed").write_text(yaml.safe_dump(config))
        backend.kubeconfig = str(tmp_path / "relayed")
        async with service.running() as jobs:
            try:
                job, _ = jobs.submit("alice", [], Submission(profile="a100", command=["true"]))
                await relay.close()  # before the create, which runs as a task on this loop

                def held_up() -> str:
                    return job_out(jobs, jobs.get(job.id)).held_up or ""

                # past "its Job is being created", which it says while the create waits on the cut connection
                said = await eventually(
                    lambda: "being created" not in held_up() and held_up(), "the create tried"
                )
                assert "the API server does not answer" in said, said
                assert state(jobs, job) is JobState.RUNNING
                await eventually(lambda: jobs.leases.placements_held, "placements held")
                later, _ = jobs.submit("alice", [], Submission(profile="a100", command=["true"]))
                waiting = job_out(jobs, jobs.get(later.id))  # what gpupool jobs and JobPanel show
                assert waiting.state == "queued" and "lost its watch of the cluster" in (
                    waiting.held_up or ""
                )
                await relay.open(port)
                for each in (job, later):
                    await eventually(
                        lambda j=each: state(jobs, j) is JobState.SUCCEEDED, "jobs to succeed", 90
                    )
            finally:
                await relay.close()

    asyncio.run(scenario())


def test_with_kueue_the_job_is_created_suspended_and_no_pod_starts(kube: LocalKube, tmp_path: Path) -> None:
    service = Service(kube, tmp_path, queue="team-a")

    async def scenario(jobs: JobManager) -> None:
        job, _ = jobs.submit("alice", [], Submission(profile="a100", command=["true"]))
        created = await eventually(lambda: service.kube_job(job), "the Job")
        assert created["spec"]["suspend"] is True
        assert created["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        await eventually(
            lambda: any(
                c["type"] == "Suspended"
                for c in (service.kube_job(job) or {}).get("status", {}).get("conditions", [])
            ),
            "the Job controller to take it as suspended",
        )
        assert service.pods(job) == []
        assert state(jobs, job) is JobState.RUNNING  # waiting for Kueue is not an end
        shown = job_out(jobs, jobs.get(job.id))  # what GET jobs/{id} answers
        assert shown.held_up == "its Job is suspended until Kueue admits it (queue team-a)"

    service.run(scenario)


def test_a_working_dir_outside_the_containers_home_is_refused_naming_the_field(
    kube: LocalKube, tmp_path: Path
) -> None:
    service = Service(kube, tmp_path)
    with pytest.raises(InvalidJob, match=r"working_dir: /etc is outside your home /home/jovyan"):
        service.jobs.submit("alice", [], Submission(profile="a100", command=["true"], working_dir="/etc"))
    with pytest.raises(InvalidJob, match="working_dir: must be a plain absolute path"):
        service.jobs.submit(
            "alice", [], Submission(profile="a100", command=["true"], working_dir="/home/jovyan/../x")
        )
    assert service.jobs.all_jobs() == []


def test_the_kubernetes_backend_without_a_job_image_stops_at_start_up(
    kube: LocalKube, tmp_path: Path
) -> None:
    backend = load_kube_pool(str(kube.kubeconfig(tmp_path / "kubeconfig")))
    with pytest.raises(SystemExit, match="GPUPOOL_KUBE_JOB_IMAGE must name the image"):
        backend.job_runner(image="")
    with pytest.raises(SystemExit, match="GPUPOOL_KUEUE_QUEUE: expected an RFC 1123 label"):
        backend.job_runner(image=IMAGE, queue="Team A")
