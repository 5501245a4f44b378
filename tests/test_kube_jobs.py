"""Jobs on Kubernetes: the real job manager, lease manager and store on the cluster's pool, its Kubernetes runner
talking real ``kubernetes_asyncio`` over HTTP to the API server stand-in, which plays kubelet and the Job
controller when a test says so. A job becomes a ``batch/v1`` Job on its leased node; how the pod ends decides
the job's state (success, the user's exit code, a disruption requeued, a deadline); a node going NotReady
stops and requeues its job elsewhere; cancel deletes the Job; the log comes from the pod; with Kueue the Job
starts suspended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from fastapi import FastAPI
from kube_apiserver import KubeApiServer, kube_apiserver, write_kubeconfig

from gpupool.spawner.kube.jobs import job_name
from gpupool.spawner.pool.jobs import Job, JobState
from gpupool.spawner.pool.profiles import Profile
from gpupool.spawner.pool.requests import WholeGpus
from gpupool.spawner.service.job_input import InvalidJob
from gpupool.spawner.service.job_store import JobStore
from gpupool.spawner.service.jobs import JobManager, Submission
from gpupool.spawner.service.kube_pool import load_kube_pool
from gpupool.spawner.service.leases import LeaseManager
from gpupool.spawner.service.store import LeaseState, LeaseStore, sqlite_url

H100, A100 = "dgx-h100-01", "gpu-a100-01"
IMAGE = "registry.example.org/gpupool-singleuser:1.0"
PROFILES = [
    Profile("a100", "One A100", 2000, 4096, WholeGpus(1, frozenset({"A100-40GB"})), max_lifetime=3600),
    Profile("gpu", "Any whole GPU", 2000, 4096, WholeGpus(1), max_lifetime=3600),
]
TRAIN = Submission(
    profile="a100", command=["python", "train.py", "--epochs", "3"], working_dir="/home/jovyan/work"
)


SERVICE_URL = "http://gpupool.jhub.svc:10101/services/gpupool/"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[KubeApiServer, Path]]:
    with kube_apiserver("dgx-h100-mixed", "a100-40gb") as server:
        yield server, write_kubeconfig(tmp_path / "kubeconfig", server.url)


class Service:
    """The service's pool and jobs as ``__main__`` wires them for ``GPUPOOL_BACKEND=kubernetes``."""

    def __init__(self, tmp: Path, kubeconfig: Path, **env: str) -> None:
        settings = {
            "KUBECONFIG": str(kubeconfig),
            "GPUPOOL_KUBE_JOB_IMAGE": IMAGE,
            "GPUPOOL_SERVICE_URL": SERVICE_URL,
            **env,
        }
        self.backend = load_kube_pool(settings)
        self.manager = LeaseManager(self.backend.nodes, LeaseStore(sqlite_url(str(tmp / "leases.sqlite"))))
        runner = self.backend.job_runner(settings, grace=1)
        self.jobs = JobManager(
            self.manager, JobStore(self.manager.store.engine), PROFILES, grace=1, job_runner=runner
        )
        self.app = FastAPI()
        self.backend.attach(self.app, self.manager, self.jobs)

    def run(self, scenario: Callable[[JobManager], Awaitable[None]]) -> None:
        """Run ``scenario`` against the job manager while the service runs (its watches and its job loop)."""

        async def main() -> None:
            async with self.running() as jobs:
                await scenario(jobs)

        asyncio.run(main())

    @asynccontextmanager
    async def running(self) -> AsyncIterator[JobManager]:
        async with self.app.router.lifespan_context(self.app):
            loop = asyncio.create_task(self.jobs.run_forever(interval=0.05))
            try:
                yield self.jobs
            finally:
                loop.cancel()
                await asyncio.gather(loop, return_exceptions=True)


async def eventually(condition: Callable[[], Any], what: str, timeout_s: float = 20.0) -> Any:
    """``condition()`` once truthy; generous, because CI shares two cores with the stand-in's watches."""
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)
    return found


def kube_job(server: KubeApiServer, job: Job, attempt: int = 1) -> dict[str, Any] | None:
    return server.get("jobs", job_name(job.id, attempt), "default")


def pod_of(server: KubeApiServer, name: str) -> dict[str, Any] | None:
    pods = [p for p in server.objects("pods", "default") if p["metadata"]["labels"].get("job-name") == name]
    return pods[0] if pods else None


def state(jobs: JobManager, job: Job) -> JobState:
    return jobs.get(job.id).state


async def started(server: KubeApiServer, job: Job, attempt: int = 1) -> str:
    """Wait for the attempt's Job, start its pod as the kubelet would; the pod's name."""
    name = job_name(job.id, attempt)
    await eventually(lambda: kube_job(server, job, attempt), f"Job {name} created")
    return str(server.run_job(name)["metadata"]["name"])


def test_a_job_becomes_a_batch_job_on_its_leased_node_reads_its_pods_log_and_succeeds(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    server, kubeconfig = cluster

    async def scenario(jobs: JobManager) -> None:
        job, _ = jobs.submit("alice", [], TRAIN)
        lease = jobs.leases.get(job.lease_id or "")
        assert lease.state is LeaseState.GRANTED and lease.node == A100
        created = await eventually(lambda: kube_job(server, job), "the Job")
        kubernetes_validate.validate(created, "1.30", strict=True)
        pod = created["spec"]["template"]["spec"]
        main = pod["containers"][0]
        affinity = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert affinity["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [A100]
        assert main["resources"]["limits"] == {"cpu": "2000m", "memory": "4096Mi", "nvidia.com/gpu": "1"}
        assert main["image"] == IMAGE and main["command"] == ["python", "train.py", "--epochs", "3"]
        assert main["workingDir"] == "/home/jovyan/work"
        assert pod["volumes"] == [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}]
        env = {e["name"]: e["value"] for e in main["env"]}
        assert env["GPUPOOL_CHECKPOINT_DIR"] == f"/home/jovyan/.gpupool/jobs/{job.id}/checkpoints"
        assert env["GPUPOOL_JOB_ATTEMPT"] == "1" and env["GPUPOOL_LEASE_ID"] == lease.id
        assert env["GPUPOOL_SERVICE_URL"] == SERVICE_URL  # the widgets inside the job find the service
        assert pod["securityContext"]["runAsUser"] == 1000
        assert created["spec"]["activeDeadlineSeconds"] == 3600 and "suspend" not in created["spec"]
        assert state(jobs, job) is JobState.RUNNING
        name = server.run_job(created["metadata"]["name"])["metadata"]["name"]
        server.set_pod_log(name, "epoch 1 loss 0.9\nepoch 2 loss 0.5\n")
        await eventually(
            lambda: jobs.read_log(jobs.get(job.id)) == b"epoch 1 loss 0.9\nepoch 2 loss 0.5\n", "log"
        )
        assert jobs.read_log(jobs.get(job.id), offset=17) == b"epoch 2 loss 0.5\n"
        server.finish_pod(name, 0)
        await eventually(lambda: state(jobs, job) is JobState.SUCCEEDED, "the job to succeed")
        assert jobs.get(job.id).exit_code == 0
        assert jobs.leases.get(lease.id).state is LeaseState.RELEASED
        assert jobs.leases.pool.allocations == {}

    Service(tmp_path, kubeconfig).run(scenario)


def test_the_users_exit_code_fails_the_job_and_a_deadline_times_it_out(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    server, kubeconfig = cluster

    async def scenario(jobs: JobManager) -> None:
        failing, _ = jobs.submit("alice", [], TRAIN)
        server.finish_pod(await started(server, failing), 3)
        await eventually(lambda: state(jobs, failing).finished, "the failing job to end")
        done = jobs.get(failing.id)
        assert done.state is JobState.FAILED and done.exit_code == 3 and done.requeues == 0
        assert done.reason == "the command exited with status 3"
        slow, _ = jobs.submit("bob", [], TRAIN)
        await started(server, slow)
        server.expire_job(job_name(slow.id, 1))
        await eventually(lambda: state(jobs, slow).finished, "the slow job to end")
        timed_out = jobs.get(slow.id)
        assert timed_out.state is JobState.TIMED_OUT and "3600 s" in timed_out.reason
        assert jobs.leases.pool.allocations == {}

    Service(tmp_path, kubeconfig).run(scenario)


def test_a_disrupted_pod_requeues_the_job_and_a_new_job_runs_attempt_2(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    server, kubeconfig = cluster

    async def scenario(jobs: JobManager) -> None:
        job, _ = jobs.submit("alice", [], TRAIN)
        pod = await started(server, job)
        server.disrupt_pod(pod, "PreemptionByScheduler", "preempted by a higher-priority pod")
        second = await eventually(lambda: kube_job(server, job, 2), "attempt 2's Job")
        assert kube_job(server, job, 1) is None  # the lost attempt's Job was deleted, not left to retry
        history = [t.state for t in jobs.get(job.id).history]
        assert history == [JobState.QUEUED, JobState.RUNNING, JobState.REQUEUED, JobState.RUNNING]
        assert "PreemptionByScheduler" in jobs.get(job.id).history[2].reason
        env = {e["name"]: e["value"] for e in second["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["GPUPOOL_JOB_ATTEMPT"] == "2" and env["GPUPOOL_LEASE_ID"] == f"{job.id}-2"
        server.finish_pod(server.run_job(second["metadata"]["name"])["metadata"]["name"], 0)
        await eventually(lambda: state(jobs, job) is JobState.SUCCEEDED, "attempt 2 to succeed")
        assert jobs.get(job.id).attempts == 2

    Service(tmp_path, kubeconfig).run(scenario)


def test_a_node_going_not_ready_stops_its_job_and_it_runs_again_on_a_healthy_node(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    server, kubeconfig = cluster

    async def scenario(jobs: JobManager) -> None:
        job, _ = jobs.submit("alice", [], Submission(profile="gpu", command=["python", "train.py"]))
        first = jobs.leases.get(job.lease_id or "").node
        other = A100 if first == H100 else H100
        pod = await started(server, job)
        assert server.get("pods", pod, "default")["spec"]["nodeName"] == first  # type: ignore[index]
        server.set_node_ready(first or "", False)
        await eventually(lambda: kube_job(server, job, 1) is None, "the first Job deleted")
        deletes = [q for m, p, q in server.requests if m == "DELETE" and p.endswith(job_name(job.id, 1))]
        assert deletes and deletes[0]["propagationPolicy"] == "Foreground"
        assert deletes[0]["gracePeriodSeconds"] == "1"
        assert server.get("pods", pod, "default") is None  # its pod went with it
        second = await eventually(lambda: kube_job(server, job, 2), "attempt 2's Job")
        terms = second["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        node = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        assert node["matchExpressions"][0]["values"] == [other]
        assert jobs.leases.get(f"{job.id}-2").node == other
        assert f"node {first} was marked unhealthy" in jobs.get(job.id).history[2].reason
        assert state(jobs, job) is JobState.RUNNING

    Service(tmp_path, kubeconfig).run(scenario)


def test_cancelling_a_running_job_deletes_its_kubernetes_job(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    server, kubeconfig = cluster

    async def scenario(jobs: JobManager) -> None:
        job, _ = jobs.submit("alice", [], TRAIN)
        await started(server, job)
        jobs.cancel(job.id, "user alice")
        await eventually(lambda: state(jobs, job) is JobState.CANCELLED, "the job cancelled")
        assert kube_job(server, job) is None and server.objects("pods", "default") == []
        assert jobs.get(job.id).reason == "cancelled by user alice"
        assert jobs.leases.pool.allocations == {}

    Service(tmp_path, kubeconfig).run(scenario)


def test_with_kueue_the_job_is_created_suspended_in_its_queue(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    server, kubeconfig = cluster

    async def scenario(jobs: JobManager) -> None:
        job, _ = jobs.submit("alice", [], TRAIN)
        created = await eventually(lambda: kube_job(server, job), "the Job")
        kubernetes_validate.validate(created, "1.30", strict=True)
        assert created["spec"]["suspend"] is True
        assert created["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        with pytest.raises(ValueError, match="suspended"):
            server.run_job(created["metadata"]["name"])
        await asyncio.sleep(0.2)
        assert state(jobs, job) is JobState.RUNNING  # waiting for Kueue is not an end

    Service(tmp_path, kubeconfig, GPUPOOL_KUEUE_QUEUE="team-a").run(scenario)


def test_a_working_dir_outside_the_containers_home_is_refused_naming_the_field(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    service = Service(tmp_path, cluster[1])
    with pytest.raises(InvalidJob, match=r"working_dir: /etc is outside your home /home/jovyan"):
        service.jobs.submit("alice", [], Submission(profile="a100", command=["true"], working_dir="/etc"))
    with pytest.raises(InvalidJob, match="working_dir: must be a plain absolute path"):
        service.jobs.submit(
            "alice", [], Submission(profile="a100", command=["true"], working_dir="/home/jovyan/../x")
        )
    assert service.jobs.all_jobs() == []


def test_the_kubernetes_backend_without_a_job_image_stops_at_start_up(
    cluster: tuple[KubeApiServer, Path], tmp_path: Path
) -> None:
    backend = load_kube_pool({"KUBECONFIG": str(cluster[1])})
    with pytest.raises(SystemExit, match="GPUPOOL_KUBE_JOB_IMAGE must name the image"):
        backend.job_runner({})
    with pytest.raises(SystemExit, match="GPUPOOL_KUEUE_QUEUE: expected an RFC 1123 label"):
        backend.job_runner({"GPUPOOL_KUBE_JOB_IMAGE": IMAGE, "GPUPOOL_KUEUE_QUEUE": "Team A"})
