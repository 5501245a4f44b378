"""Device health in-process: the XID and lost-GPU rule, faults found by telemetry, an admin's drains and faults
that survive a restart, repairs.

A real SQLite store and the real lease and job managers; the job manager's loop is stepped by hand. The hub,
the HTTP API and ``gpupool drain`` are in ``test_health_api.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import fake_pynvml
import pytest
from builders import gpu, node
from job_user import clean_home, job_user

from gpupool.spawner.backends.nvml_telemetry import NvmlSampler
from gpupool.spawner.client import GpupoolError
from gpupool.spawner.pool.devices import Health
from gpupool.spawner.pool.job_states import JobState
from gpupool.spawner.pool.leases import LeaseState
from gpupool.spawner.pool.profiles import Profile
from gpupool.spawner.pool.requests import Request, WholeGpus
from gpupool.spawner.service.jobs.job_manager import JobManager
from gpupool.spawner.service.jobs.submission import Submission
from gpupool.spawner.service.leasing.health import HealthKeeper, unhealthy_reason
from gpupool.spawner.service.leasing.lease_manager import LeaseManager
from gpupool.spawner.service.store.health_store import HealthStore, StoredMark
from gpupool.spawner.service.store.job_store import JobStore
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url
from gpupool.spawner.service.telemetry.telemetry_loop import Telemetry, make_sampler
from gpupool.spawner.telemetry.samples import Sample, Snapshot
from gpupool.widgets.admin_cli import parse_device

H100 = frozenset({"H100-80GB"})
ONE = Profile("h100", "One H100", 1000, 1024, WholeGpus(1, H100), max_lifetime=600)
NODES = [node("dgx", [gpu("dgx", 0), gpu("dgx", 1)])]
ONE_GPU = Request(1000, 1024, WholeGpus(1, H100))


def service(where: Path | str) -> tuple[JobManager, HealthKeeper]:
    """Managers and a health keeper on the database ``where`` (a URL, or a folder for an SQLite file in it):
    a second call is a restart."""
    store = LeaseStore(where if isinstance(where, str) else sqlite_url(str(where / "gpupool.sqlite")))
    jobs = JobManager(LeaseManager(NODES, store), JobStore(store.engine), [ONE], grace=1.0)
    keeper = HealthKeeper(jobs, HealthStore(store.engine))
    keeper.restore()
    return jobs, keeper


def sample(gpu_index: int, xids: tuple[int, ...] | None = (), problems: tuple[str, ...] = ()) -> Sample:
    return Sample(f"GPU-dgx-{gpu_index}", "dgx", gpu_index, None, 0.0, xid_errors=xids, problems=problems)


def until(jobs: JobManager, check: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs.step()
        if check():
            return
        time.sleep(0.02)
    pytest.fail(f"{what} within {timeout}s")


def index_of(jobs: JobManager, lease_id: str | None) -> int:
    """The index of the GPU the lease holds."""
    uuid = jobs.leases.get(lease_id or "").devices[0].gpu_uuid
    return next(g.index for g in NODES[0].gpus if g.uuid == uuid)


def server_on(jobs: JobManager, user: str = "alice") -> tuple[str, int]:
    lease = jobs.leases.request_lease(user, [], "server", user, "h100", ONE_GPU)
    assert lease.state is LeaseState.GRANTED
    return lease.id, index_of(jobs, lease.id)


@pytest.fixture(scope="module")
def user() -> Iterator[str]:
    name = job_user()
    yield name
    clean_home(name)


@pytest.mark.parametrize("code", [48, 63, 64, 74, 79, 92, 94, 95])
def test_a_critical_xid_makes_the_gpu_unhealthy(code: int) -> None:
    reason = unhealthy_reason(sample(0, (13, code)))
    assert reason is not None and f"XID {code}:" in reason and "XID 13" not in reason


@pytest.mark.parametrize("xids", [(), None, (13,), (31, 43, 45, 68)])
def test_application_xids_and_quiet_samples_leave_the_gpu_healthy(xids: tuple[int, ...] | None) -> None:
    assert unhealthy_reason(sample(0, xids)) is None
    assert unhealthy_reason(sample(0, xids, problems=("temperature: Not Supported",))) is None


def test_a_gpu_that_fell_off_the_bus_is_unhealthy() -> None:
    lost = sample(1, None, problems=("utilization: GPU is lost", "memory: GPU is lost"))
    assert unhealthy_reason(lost) == "the GPU fell off the bus (NVML: GPU is lost)"


def test_a_gpu_falling_off_the_bus_under_the_nvml_sampler_is_taken_out(tmp_path: Path) -> None:
    fakes = [fake_pynvml.h100_80gb(), fake_pynvml.h100_80gb()]
    sampler = NvmlSampler("dgx", nvml=fake_pynvml.fake_pynvml(fakes))
    sampler.open()
    jobs, keeper = service(tmp_path)
    telemetry = Telemetry(jobs.leases, sampler, interval=0)
    telemetry.add_observer(keeper.observe)
    telemetry.record(sampler.sample(1.0))
    assert keeper.faults == {}
    fakes[1].lost = True
    telemetry.record(sampler.sample(3.0))
    assert jobs.leases.health_of("dgx", 1) is Health.UNHEALTHY and list(keeper.faults) == [("dgx", 1)]
    assert jobs.leases.health_of("dgx", 0) is Health.HEALTHY


def test_a_critical_xid_seen_by_telemetry_takes_the_gpu_out_and_keeps_its_server(tmp_path: Path) -> None:
    jobs, keeper = service(tmp_path)
    telemetry = Telemetry(jobs.leases, make_sampler("simulated", NODES), interval=0)
    telemetry.add_observer(keeper.observe)
    lease_id, index = server_on(jobs)
    telemetry.record(Snapshot(1.0, (sample(index, (79,)), sample(1 - index)), True, "simulated"))
    assert jobs.leases.health_of("dgx", index) is Health.UNHEALTHY
    assert jobs.leases.health_of("dgx", 1 - index) is Health.HEALTHY
    assert jobs.leases.get(lease_id).state is LeaseState.GRANTED  # the server is told, not stopped
    assert "XID 79" in keeper.faults[("dgx", index)].reason
    other = jobs.leases.request_lease("bob", [], "server", "bob", "h100", ONE_GPU)
    assert other.devices[0].gpu_uuid == f"GPU-dgx-{1 - index}"
    third = jobs.leases.request_lease("carol", [], "server", "carol", "h100", ONE_GPU)
    assert third.state is LeaseState.QUEUED  # the unhealthy GPU is never offered, even when it is free
    jobs.leases.release(lease_id)
    assert jobs.leases.get(third.id).state is LeaseState.QUEUED


def test_a_fault_seen_by_telemetry_requeues_the_job_running_there(tmp_path: Path, user: str) -> None:
    jobs, keeper = service(tmp_path)
    job, _ = jobs.submit(user, [], Submission("h100", ["sleep", "30"], retries=1))
    until(jobs, lambda: jobs.get(job.id).pid is not None, "the job to start")
    index = index_of(jobs, job.lease_id)
    keeper.observe(Snapshot(1.0, (sample(index, None, problems=("power: GPU is lost",)),), True, "simulated"))
    keeper.observe(Snapshot(3.0, (sample(index, None, problems=("power: GPU is lost",)),), True, "simulated"))
    until(jobs, lambda: jobs.get(job.id).state is not JobState.RUNNING, "the job to be stopped")
    until(jobs, lambda: jobs.get(job.id).state is JobState.RUNNING, "the job to run again")
    again = jobs.get(job.id)
    assert [t.state for t in again.history] == [
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.REQUEUED,
        JobState.RUNNING,
    ]
    assert (
        f"GPU {index} of node dgx was marked unhealthy (the GPU fell off the bus" in again.history[2].reason
    )
    assert index_of(jobs, again.lease_id) == 1 - index
    jobs.cancel(job.id, "the test")
    until(jobs, lambda: jobs.get(job.id).state.finished, "the job to end")


def test_a_drain_survives_a_restart_and_undrain_admits_queued_work(db_url: str) -> None:
    jobs, keeper = service(db_url)
    lease_id, index = server_on(jobs)
    stopped, servers = keeper.drain("dgx", index, "user admin")
    assert stopped == [] and servers == [lease_id]  # servers keep running
    jobs, keeper = service(db_url)  # the service restarts
    assert jobs.leases.health_of("dgx", index) is Health.DRAINED
    assert jobs.leases.get(lease_id).state is LeaseState.GRANTED
    jobs.leases.release(lease_id)
    first = jobs.leases.request_lease("bob", [], "server", "bob", "h100", ONE_GPU)
    queued = jobs.leases.request_lease("carol", [], "server", "carol", "h100", ONE_GPU)
    assert first.devices[0].gpu_uuid == f"GPU-dgx-{1 - index}" and queued.state is LeaseState.QUEUED
    assert keeper.undrain("dgx", index) is Health.HEALTHY
    assert jobs.leases.get(queued.id).devices[0].gpu_uuid == f"GPU-dgx-{index}"
    assert keeper.store.all() == []
    jobs, keeper = service(db_url)
    assert jobs.leases.health_of("dgx", index) is Health.HEALTHY


def test_undraining_a_gpu_that_failed_meanwhile_leaves_it_unhealthy(db_url: str) -> None:
    jobs, keeper = service(db_url)
    keeper.drain("dgx", 0, "user admin")
    keeper.observe(Snapshot(1.0, (sample(0, (48,)),), True, "simulated"))
    assert keeper.undrain("dgx", 0) is Health.UNHEALTHY
    assert jobs.leases.pool.node("dgx").gpu_health[0] is Health.UNHEALTHY


def test_an_admins_fault_survives_a_restart_until_the_gpu_is_repaired(db_url: str) -> None:
    jobs, keeper = service(db_url)
    stopped, servers = keeper.fault("dgx", 0, "user admin")
    assert stopped == [] and servers == []
    jobs, keeper = service(db_url)  # the service restarts: the GPU is still out, and nothing lands on it
    assert jobs.leases.health_of("dgx", 0) is Health.UNHEALTHY
    first = jobs.leases.request_lease("bob", [], "server", "bob", "h100", ONE_GPU)
    queued = jobs.leases.request_lease("carol", [], "server", "carol", "h100", ONE_GPU)
    assert first.devices[0].gpu_uuid == "GPU-dgx-1" and queued.state is LeaseState.QUEUED
    assert keeper.repair("dgx", 0) is Health.HEALTHY
    assert jobs.leases.get(queued.id).devices[0].gpu_uuid == "GPU-dgx-0"  # the repaired GPU takes the queue
    jobs, keeper = service(db_url)
    assert jobs.leases.health_of("dgx", 0) is Health.HEALTHY and keeper.store.all() == []


@pytest.mark.parametrize("mark", ["drain", "fault"])
def test_work_queued_at_a_restart_never_starts_on_a_gpu_still_marked(db_url: str, mark: str) -> None:
    """A failure-and-resume trial: after a restart a queued job started on a GPU still marked unhealthy (or
    drained), since the first admission came before the stored marks were applied."""
    jobs, keeper = service(db_url)
    getattr(keeper, mark)("dgx", 0, "user admin")
    held = jobs.leases.request_lease("bob", [], "server", "bob", "h100", ONE_GPU)  # GPU 1, the only one left
    queued = jobs.leases.request_lease("carol", [], "server", "carol", "h100", ONE_GPU)
    assert queued.state is LeaseState.QUEUED
    jobs, keeper = service(db_url)  # carol waits on: GPU 0 is still out, GPU 1 is bob's
    assert jobs.leases.get(queued.id).state is LeaseState.QUEUED
    jobs.leases.release(held.id)
    assert jobs.leases.get(queued.id).devices[0].gpu_uuid == "GPU-dgx-1"


def test_repair_lifts_a_fault_the_telemetry_found_but_not_a_drain(db_url: str) -> None:
    jobs, keeper = service(db_url)
    keeper.drain("dgx", 1, "user admin")
    keeper.observe(Snapshot(1.0, (sample(0, (48,)), sample(1, (48,))), True, "simulated"))
    assert keeper.repair("dgx", 0) is Health.HEALTHY and keeper.repair("dgx", 1) is Health.DRAINED
    keeper.observe(Snapshot(3.0, (sample(0, (48,)),), True, "simulated"))  # the same XID again: out again
    assert jobs.leases.health_of("dgx", 0) is Health.UNHEALTHY


def test_drains_stored_before_health_marks_are_carried_over(db_url: str) -> None:
    store = LeaseStore(db_url)
    with store.engine.begin() as connection:  # the table as the previous release made it
        connection.exec_driver_sql(
            "CREATE TABLE drains (key VARCHAR(300) PRIMARY KEY, node VARCHAR(253), gpu_index INTEGER, "
            'drained_at FLOAT, "by" VARCHAR(255))'
        )
        connection.exec_driver_sql("INSERT INTO drains VALUES ('dgx/1', 'dgx', 1, 5.0, 'user admin')")
    jobs, keeper = service(db_url)
    assert jobs.leases.health_of("dgx", 1) is Health.DRAINED
    (mark,) = keeper.store.all()
    assert (mark.by, mark.at) == ("user admin", 5.0)


def test_draining_an_unknown_node_or_gpu_names_it_and_stores_nothing(db_url: str) -> None:
    _, keeper = service(db_url)
    with pytest.raises(KeyError, match="nope"):
        keeper.drain("nope", None, "user admin")
    with pytest.raises(KeyError, match="no GPU 7"):
        keeper.drain("dgx", 7, "user admin")
    assert keeper.store.all() == []


@pytest.mark.parametrize(
    ("text", "body"),
    [("dgx-h100-01", {"node": "dgx-h100-01"}), ("dgx-h100-01/3", {"node": "dgx-h100-01", "gpu_index": 3})],
)
def test_node_slash_gpu_is_read_as_a_node_and_a_gpu_index(text: str, body: dict[str, object]) -> None:
    assert parse_device(text) == body


@pytest.mark.parametrize("text", ["", "/3", "dgx/", "dgx/x"])
def test_a_malformed_node_slash_gpu_is_refused(text: str) -> None:
    with pytest.raises(GpupoolError, match="NODE"):
        parse_device(text)


def test_a_stored_drain_of_a_gpu_or_node_now_gone_is_logged_in_one_plain_sentence(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A trial shrank a node after draining its GPU 2 and read "node … has no GPU 2 is not in the pool"."""
    _, keeper = service(tmp_path)
    for where, index in (("dgx", 5), ("gone", None)):  # as an earlier pool file's drains stay stored
        keeper.store.add(StoredMark(where, index, Health.DRAINED, "drained by ops", "ops", 0.0))
    with caplog.at_level("WARNING"):
        service(tmp_path)
    said = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert sorted(said) == [
        "drained of dgx/5 not applied, kept for when it is back: node dgx has no GPU 5",
        "drained of gone not applied, kept for when it is back: node gone is not in the pool",
    ]
