"""Training jobs end to end: a real JupyterHub and proxy, the gpupool service as its managed service (as root,
so jobs run as a system account), and real job processes on the simulated demo pool.

One hub for the module. The job user is a system account the tests create if missing (``job_user``); ``bob``
is a hub user without one. The service restart test runs last: it kills the managed service.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from hub_harness import ADMIN_SCOPES, RunningHub, free_ports, write_hub_config
from job_user import clean_home, job_user, python_with_numpy, train_script, user_dir
from nbclient import NotebookClient
from polling import until

from gpupool.spawner.backends.simulated import DEMO_POOL

ADMIN_TOKEN = "test-admin-token-jobs-0123456789abcdef"
HUB_CLIENT_TOKEN = "test-hub-client-token-jobs-0123456789"
GRACE = 1.5
Hub = RunningHub


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("jobs-hub")
    ports = free_ports()
    user = job_user()
    quotas = tmp / "quotas.yaml"
    quotas.write_text(f"users:\n  {user}: {{whole_gpus: 2}}\n")
    service_env = {
        "GPUPOOL_POOL": str(DEMO_POOL),
        "GPUPOOL_DB_URL": f"sqlite:///{tmp}/gpupool.sqlite",
        "GPUPOOL_QUOTAS": str(quotas),
        "GPUPOOL_JOB_GRACE_SECONDS": str(GRACE),
    }
    write_hub_config(
        tmp,
        ports,
        admin_token=ADMIN_TOKEN,
        pool_file=DEMO_POOL,
        hub_client_token=HUB_CLIENT_TOKEN,
        service_env=service_env,
        admin_scopes=(*ADMIN_SCOPES, "admin:groups"),  # a test puts the job user in a group for a while
    )
    with RunningHub(tmp, ports, ADMIN_TOKEN, service_env=service_env, fail=pytest.fail) as hub:
        for name in (user, "bob"):
            hub.create_user(name)
            hub.token_for(name)
        hub.tokens["me"] = hub.tokens[user]
        yield hub
    clean_home(user)


def submit(client: httpx.Client, command: list[str], profile: str = "h100", **body: Any) -> dict[str, Any]:
    response = client.post("/jobs", json={"command": command, "profile": profile} | body)
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def state_of(client: httpx.Client, job_id: str) -> str:
    state: str = client.get(f"/jobs/{job_id}").json()["state"]
    return state


def gpu_free(client: httpx.Client, uuid: str) -> bool:
    gpus = [g for n in client.get("/pool").json()["nodes"] for g in n["gpus"] if g["uuid"] == uuid]
    return bool(gpus) and gpus[0]["free_milli"] == 1000


def test_a_job_runs_with_its_lease_devices_streams_its_log_and_succeeds(hub: Hub) -> None:
    with hub.as_user("me") as me:
        job = submit(
            me,
            ["sh", "-c", 'echo "start $CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES"; sleep 0.5; echo end'],
        )
        assert job["state"] in ("queued", "running")
        with me.stream("GET", f"/jobs/{job['id']}/logs", params={"follow": "true"}, timeout=30) as stream:
            assert stream.status_code == 200
            lines = [line for line in stream.iter_lines() if line]  # ends when the job has ended
        done = me.get(f"/jobs/{job['id']}").json()
        assert done["state"] == "succeeded" and done["exit_code"] == 0, done
        lease = me.get(f"/leases/{done['lease_id']}").json()
        (device,) = lease["devices"]
        assert lines == [f"start {device['uuid']} {device['uuid']}", "end"]
        assert lease["state"] == "released" and gpu_free(me, device["uuid"])
        assert [t["state"] for t in done["history"]] == ["queued", "running", "succeeded"]
        assert me.get(f"/jobs/{job['id']}/logs").text == "\n".join(lines) + "\n"


def test_cancel_and_max_runtime_stop_a_job_within_the_grace_period_and_free_its_devices(hub: Hub) -> None:
    with hub.as_user("me") as me:
        stubborn = submit(me, ["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.1; done"])
        timed = submit(me, ["sleep", "60"], max_runtime=1)
        until(lambda: "up" in me.get(f"/jobs/{stubborn['id']}/logs").text, "the job to start")
        devices = me.get(f"/jobs/{stubborn['id']}").json()["devices"]
        asked = time.monotonic()
        cancelled = me.delete(f"/jobs/{stubborn['id']}")
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled", cancelled.text
        assert time.monotonic() - asked < GRACE + 1.5  # SIGKILL once the grace period ran out
        assert cancelled.json()["reason"] == f"cancelled by user {job_user()}"
        assert gpu_free(me, devices[0]["uuid"])
        until(lambda: state_of(me, timed["id"]) == "timed-out", "the job past its maximum runtime to stop")
        assert "maximum runtime of 1 s" in me.get(f"/jobs/{timed['id']}").json()["reason"]


def test_an_admin_requeues_a_running_job_without_using_a_retry_and_a_user_may_not(hub: Hub) -> None:
    """The admin console's Requeue button: what preemption does, by hand."""
    with hub.as_user("me") as me, hub.admin() as admin:
        job = submit(me, ["sh", "-c", "echo up; sleep 60"], retries=0)
        until(lambda: "up" in me.get(f"/jobs/{job['id']}/logs").text, "the job to start")
        refused = me.post(f"/jobs/{job['id']}/requeue")
        assert refused.status_code == 403 and "needs custom:gpupool:admin" in refused.text
        requeued = admin.post(f"{hub.service_api}/jobs/{job['id']}/requeue")
        assert requeued.status_code == 200, requeued.text
        until(lambda: me.get(f"/jobs/{job['id']}").json()["attempts"] == 2, "the job to run again")
        history = me.get(f"/jobs/{job['id']}").json()["history"]
        assert [t["state"] for t in history][:4] == ["queued", "running", "requeued", "running"], history
        assert history[2]["reason"].startswith("preempted by "), history  # retries=0, yet requeued
        assert me.delete(f"/jobs/{job['id']}").json()["state"] == "cancelled"
        again = admin.post(f"{hub.service_api}/jobs/{job['id']}/requeue")
        assert again.status_code == 409 and "only a running job is requeued" in again.text


def test_a_quota_refusal_says_which_limit(hub: Hub) -> None:
    with hub.as_user("me") as me:
        held = [submit(me, ["sleep", "30"]) for _ in range(2)]
        refused = me.post("/jobs", json={"command": ["sleep", "30"], "profile": "h100"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "quota_exceeded"
        assert f"{job_user()}'s quota allows 2 whole GPUs at once" in refused.json()["detail"]
        for job in held:
            assert me.delete(f"/jobs/{job['id']}").json()["state"] == "cancelled"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command": []}, "command"),
        ({"command": [""]}, "command"),
        ({"command": ["no-such-program-gpupool"]}, "command"),
        ({"working_dir": "relative/dir"}, "working_dir"),
        ({"working_dir": "/home/../etc"}, "working_dir"),
        ({"profile": "no-such-profile"}, "profile"),
        ({"max_runtime": 10**7}, "max_runtime"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES"),
        # a hostile-user trial: a NUL in working_dir was a 500 that dropped the connection, and a name with
        # terminal escapes and line breaks reached the admin's `gpupool jobs` as they were
        ({"working_dir": "/tmp/x\u0000y"}, "working_dir"),
        ({"name": "\u202egnp.exe\u001b[31mred\r\nX-Inject: 1"}, "name"),
        ({"name": "two\nlines"}, "name"),
    ],
)
def test_a_bad_submission_is_a_400_naming_the_field(hub: Hub, body: dict[str, Any], field: str) -> None:
    with hub.as_user("me") as me:
        response = me.post("/jobs", json={"command": ["true"], "profile": "cpu"} | body)
    assert response.status_code == 400, response.text
    assert response.json()["fields"] == [field] and field in response.json()["detail"]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('"command": ["true", "\\ud800"]', "command.1"),
        ('"command": ["true"], "env": {"A": "\\udfff"}', "env.A"),
    ],
)
def test_an_unpaired_surrogate_is_a_400_naming_the_field_not_a_500(hub: Hub, raw: str, field: str) -> None:
    """JSON may spell a lone surrogate (``\\ud800``), which has no UTF-8: it was a 500 that dropped the
    connection, and the next request on it got the proxy's 503."""
    with hub.as_user("me") as me:
        body = '{"profile": "cpu", ' + raw + "}"
        response = me.post("/jobs", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        assert response.json()["fields"] == [field] and "unpaired surrogate" in response.json()["detail"]
        assert me.get("/jobs").status_code == 200  # the same connection still answers


def test_a_body_sent_in_chunks_meets_the_same_size_limit_as_one_with_a_length(hub: Hub) -> None:
    """Over real HTTP, through the proxy: without ``Content-Length`` the service once read and parsed a
    100 MB body whole before refusing it. Refused either way, the client's connection stays usable: the
    request after a 413 on the same connection once failed with a reset."""
    body = json.dumps({"command": ["echo", *["x" * 100_000] * 30], "profile": "cpu"}).encode()  # 3 MB

    def in_chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    json_type = {"Content-Type": "application/json"}
    with hub.as_user("me") as me:
        before = len(me.get("/jobs").json())
        for _ in range(3):
            refused = me.post("/jobs", content=in_chunks(), headers=json_type)
            assert refused.request.headers.get("transfer-encoding") == "chunked"
            assert refused.status_code == 413 and refused.json()["fields"] == ["body"], refused.text
            assert me.get("/jobs").status_code == 200  # the next request, on the same connection
            declared = me.post("/jobs", content=body, headers=json_type)
            assert declared.status_code == 413 and "got 3" in declared.json()["detail"], declared.text
            assert me.get("/jobs").status_code == 200
        small = json.dumps({"command": ["true"], "profile": "cpu"}).encode()
        accepted = me.post("/jobs", content=iter([small[:10], small[10:]]), headers=json_type)
        assert accepted.status_code == 201, accepted.text  # a chunked body within the limit is read as sent
        assert len(me.get("/jobs").json()) == before + 1


def test_a_submission_id_never_starts_the_same_job_twice(hub: Hub) -> None:
    with hub.as_user("me") as me:
        body = {"command": ["true"], "profile": "cpu", "submission_id": "nightly-7"}
        first, again = me.post("/jobs", json=body), me.post("/jobs", json=body)
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json()["id"] == again.json()["id"]
        assert [j["submission_id"] for j in me.get("/jobs").json()].count("nightly-7") == 1


def test_another_user_never_sees_follows_or_cancels_a_job_and_needs_an_account_to_submit(hub: Hub) -> None:
    with hub.as_user("me") as me, hub.as_user("bob") as bob, hub.as_user("admin") as admin:
        job = submit(me, ["sleep", "30"], profile="cpu")
        for refused in (
            bob.get(f"/jobs/{job['id']}"),
            bob.get(f"/jobs/{job['id']}/logs", params={"follow": "true"}),
            bob.delete(f"/jobs/{job['id']}"),
        ):
            assert refused.status_code == 403, refused.text
            assert job_user() not in refused.text
        assert job["id"] not in {j["id"] for j in bob.get("/jobs").json()}
        assert job["id"] in {j["id"] for j in admin.get("/jobs").json()}
        assert bob.get("/jobs/no-such-job").status_code == 404
        no_account = bob.post("/jobs", json={"command": ["true"], "profile": "cpu"})
        assert no_account.status_code == 403 and "bob has no system account" in no_account.json()["detail"]
        assert me.delete(f"/jobs/{job['id']}").json()["state"] == "cancelled"


def test_get_jobs_lists_the_newest_jobs_oldest_first(hub: Hub) -> None:
    """A hostile-user trial's pile of finished jobs made each listing (the job panel's, every few seconds) slower
    for everyone: GET jobs answers the newest 200, or ``limit``."""
    with hub.as_user("me") as me:
        long_run = submit(me, ["sleep", "60"], profile="cpu", name="three-days")["id"]
        ids = [submit(me, ["true"], profile="cpu", name=f"listed-{i}")["id"] for i in range(3)]
        for job_id in ids:
            until(lambda job_id=job_id: state_of(me, job_id) == "succeeded", f"job {job_id} to end")
        listed = me.get("/jobs", params={"limit": 2})
        # the unfinished one stays listed, however many finished after it (from the review)
        assert [j["id"] for j in listed.json()] == [long_run, *ids[1:]], listed.text
        assert ids[0] in {j["id"] for j in me.get("/jobs").json()}
        assert me.delete(f"/jobs/{long_run}").json()["state"] == "cancelled"
        refused = me.get("/jobs", params={"limit": 0})
        assert refused.status_code == 400 and refused.json()["fields"] == ["limit"], refused.text


def test_a_job_in_an_environment_no_gpu_of_its_profile_can_run_is_refused_naming_the_environment(
    hub: Hub,
) -> None:
    """The demo's A100s run driver 535 (CUDA 12.2). A job asking for a100-pair's CUDA 12.4 environment was
    refused as if the profile were at fault (409 on ``profile``: "never fits"), where POST leases named the
    environment and the ones that can run (from the review of the environments change)."""
    member = hub.api("POST", "groups/gpu-users", json={"users": [job_user()]})
    assert member.status_code == 201, member.text
    try:
        with hub.as_user("me") as me:
            body = {"command": ["sleep", "30"], "profile": "a100-pair"}
            refused = me.post("/jobs", json=body | {"environment": "cuda-12-4"})
            assert refused.status_code == 409 and refused.json()["fields"] == ["environment"], refused.text
            assert "profile a100-pair's GPUs can run lab, not 'cuda-12-4': needs CUDA 12.4" in refused.text
            job = submit(me, body["command"], profile="a100-pair", environment="lab")
            assert me.delete(f"/jobs/{job['id']}").json()["state"] == "cancelled"
    finally:
        assert hub.api("DELETE", "groups/gpu-users").status_code == 204


def test_an_injected_gpu_fault_requeues_the_training_job_which_resumes_from_its_checkpoint(hub: Hub) -> None:
    python, env = python_with_numpy()
    every = 10
    args = ["--steps", "60", "--checkpoint-every", str(every), "--step-seconds", "0.03"]
    work = str(user_dir(job_user()))
    with hub.as_user("me") as me, hub.as_user("admin") as admin:
        job = submit(me, [*python, train_script(), *args], env=env, working_dir=work, retries=1)
        until(lambda: "step 25/" in me.get(f"/jobs/{job['id']}/logs").text, "training to pass step 25")
        (device,) = me.get(f"/jobs/{job['id']}").json()["devices"]
        gpu = next(
            g for n in me.get("/pool").json()["nodes"] for g in n["gpus"] if g["uuid"] == device["uuid"]
        )
        fault = {"node": "dgx-h100-01", "gpu_index": gpu["index"]}
        assert me.post("/admin/faults", json=fault).status_code == 403  # users cannot break the pool
        injected = admin.post("/admin/faults", json=fault)
        assert injected.status_code == 200 and injected.json()["stopped_jobs"] == [job["id"]], injected.text
        until(lambda: state_of(me, job["id"]) == "succeeded", "the requeued job to finish", timeout=40)
        done = me.get(f"/jobs/{job['id']}").json()
    assert [t["state"] for t in done["history"]] == ["queued", "running", "requeued", "running", "succeeded"]
    assert f"GPU {gpu['index']} of node dgx-h100-01 was marked unhealthy" in done["history"][2]["reason"]
    log = me_log(hub, job["id"])
    before, after = log.split("resumed at step ")
    last_before = max(int(n) for n in re.findall(r"step (\d+)/", before))
    resumed = int(after.split()[0])
    assert resumed % every == 0 and 0 <= last_before - resumed <= every, log  # at most one interval lost
    assert "done: 60 steps" in after


def me_log(hub: Hub, job_id: str) -> str:
    with hub.as_user("me") as me:
        return me.get(f"/jobs/{job_id}/logs").text


NOTEBOOK = """
from gpupool.widgets import my_jobs, submit
job = submit(["sh", "-c", "echo hello from $GPUPOOL_JOB_ID"], profile="cpu", name="from-a-notebook")
final = job.wait(timeout=60, poll=0.2)
print(final)
print(job.logs(), end="")
print(job.id in {j.id for j in my_jobs()})
from gpupool.widgets import job as job_by_id
try:  # a first-day trial's job("NOSUCH") gave a handle; the error came at its first use
    job_by_id("NOSUCH")
except Exception as error:
    print(type(error).__name__, error)
"""


def test_a_notebook_submits_a_job_with_submit_and_reads_its_finished_log(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real kernel runs the notebook, with what a spawned server's environment gives it: the service's URL
    and a token acting as the user."""
    monkeypatch.setenv("GPUPOOL_SERVICE_URL", f"{hub.url}/services/gpupool/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.tokens["me"])
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(NOTEBOOK)])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    output = "".join(o.get("text", "") for o in notebook.cells[0].outputs if o.get("name") == "stdout")
    state, hello, listed, unknown = output.splitlines()
    assert state == "succeeded"
    assert re.fullmatch(r"hello from \S+", hello), output
    assert listed == "True"
    assert unknown == "GpupoolError no job 'NOSUCH'", output


def _gpupool(hub: Hub, *args: str) -> subprocess.CompletedProcess[str]:
    connection = ["--url", f"{hub.url}/services/gpupool/", "--token", hub.tokens["me"]]
    command, rest = args[0], list(args[1:])
    split = rest.index("--") if "--" in rest else len(rest)
    argv = [command, *rest[:split], *connection, *rest[split:]]
    return subprocess.run(
        [sys.executable, "-m", "gpupool.spawner.cli", *argv], capture_output=True, text=True, timeout=60
    )


def test_the_shell_commands_submit_follow_list_and_refuse_bad_input(hub: Hub) -> None:
    submitted = _gpupool(
        hub, "submit", "--profile", "cpu", "--max-runtime", "10m", "--", "sh", "-c", "echo cli job"
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split("\t")[0]
    followed = _gpupool(hub, "logs", job_id, "-f")
    assert followed.returncode == 0 and followed.stdout == "cli job\n", followed.stderr
    assert f"job {job_id} succeeded" in followed.stderr, followed.stderr
    listed = _gpupool(hub, "jobs")
    (row,) = [line.split("\t") for line in listed.stdout.splitlines() if line.startswith(job_id)]
    assert row[3:5] == ["cpu", "succeeded"]
    with hub.as_user("me") as me:
        model = me.get(f"/jobs/{job_id}").json()
        assert model["max_runtime"] == 600
    assert row[1] == model["user"]  # whose: an admin's list holds everyone's
    # a first-day trial read "by USER" in the README and tried --user: "unrecognized arguments"
    only_mine = _gpupool(hub, "jobs", "--user", model["user"], "--limit", "1")
    assert [line.split("\t")[0] for line in only_mine.stdout.splitlines()[1:]] == [job_id], only_mine.stderr
    others = _gpupool(hub, "jobs", "--user", "bob")
    assert others.returncode == 1 and "may list only their own jobs" in others.stderr, others.stderr
    too_late = _gpupool(hub, "cancel", job_id)
    assert (
        too_late.returncode == 0
        and too_late.stdout == f"{job_id} had already ended (succeeded): nothing to cancel\n"
    )
    bad = _gpupool(hub, "submit", "--profile", "cpu", "--max-runtime", "2x", "--", "true")
    assert bad.returncode == 1 and "--max-runtime: " in bad.stderr and "2h" in bad.stderr, bad.stderr
    # the options' own names, and a negative duration said as such (a trial read "working_dir: …" and
    # "expected seconds or a duration" for -5m)
    backwards = _gpupool(hub, "submit", "--profile", "cpu", "--max-runtime=-5m", "--", "true")
    assert "--max-runtime: must be more than 0 seconds, got -5m" in backwards.stderr, backwards.stderr
    elsewhere = _gpupool(hub, "submit", "--profile", "cpu", "--workdir", "/etc", "--", "true")
    assert elsewhere.returncode == 1 and "gpupool: --workdir: /etc is outside your home" in elsewhere.stderr
    negative = _gpupool(hub, "submit", "--profile", "cpu", "--retries", "-1", "--", "true")
    assert negative.returncode == 2 and "--retries: a whole number from 0 to 20, got -1" in negative.stderr
    unknown = _gpupool(hub, "submit", "--profile", "h200", "--", "true")
    assert unknown.returncode == 1 and "unknown profile 'h200'" in unknown.stderr, unknown.stderr


def test_gpupool_usage_reads_the_usage_api_since_a_date_and_names_a_bad_one(hub: Hub) -> None:
    """An admin's trial summed `GET usage` rows by hand to tell who held GPUs idle last week."""
    with hub.as_user("me") as me:
        for _attempt in range(5):  # the same rows before and after: no minute of use was written between
            rows = me.get("/usage", params={"since": "2026-01-01"}).json()
            listed = _gpupool(hub, "usage", "--since", "2026-01-01")
            as_json = _gpupool(hub, "usage", "--since", "2026-01-01", "--json")
            if me.get("/usage", params={"since": "2026-01-01"}).json() == rows:
                break
    assert listed.returncode == 0, listed.stderr
    said = "(since 2026-01-01 to now; a simulated pool: these GPUs are not real; minutes are counted whole)"
    if rows:
        header, *lines, total, span = listed.stdout.splitlines()
        assert header.split("\t") == ["USER", "PROFILE", "HELD", "USED", "UNKNOWN", "IDLE"]
        assert len(lines) == len(rows) and total.startswith("total\t") and span == said
    else:
        assert listed.stdout == f"no GPU-hours held in this span\n{said}\n"
    assert json.loads(as_json.stdout) == rows
    typo = _gpupool(hub, "usage", "--since", "2026-13-01")
    assert typo.returncode == 1 and typo.stderr.startswith("gpupool: since: "), typo.stderr
    # a first-day trial's guess was told "Input should be a valid datetime or date, input is too short"
    guess = _gpupool(hub, "usage", "--since", "yesterday")
    assert guess.stderr.startswith("gpupool: since: expected a date such as 2026-12-01, "), guess.stderr
    assert "got 'yesterday'" in guess.stderr


def test_following_a_queued_job_says_where_it_waits_then_streams_its_log(hub: Hub) -> None:
    """A trial's ``gpupool logs ID -f`` on a queued job printed nothing at all while it waited."""
    with hub.as_user("me") as me:  # the demo pool's one 1g.10gb slice, held by a job of theirs first
        blocker = submit(me, ["sleep", "60"], "mig-1g")
        until(lambda: state_of(me, blocker["id"]) == "running", "the first job to hold the slice", timeout=30)
        submitted = _gpupool(hub, "submit", "--profile", "mig-1g", "--", "sh", "-c", "echo after the wait")
        assert submitted.returncode == 0 and "#1 in the queue" in submitted.stdout, submitted.stderr
        job_id = submitted.stdout.split("\t")[0]
        listed = [line.split("\t") for line in _gpupool(hub, "jobs").stdout.splitlines()]
        (row,) = [row for row in listed if row[0] == job_id]
        assert row[4].startswith("queued (#1 in the queue"), row
        connection = ["--url", f"{hub.url}/services/gpupool/", "--token", hub.tokens["me"]]
        command = [sys.executable, "-m", "gpupool.spawner.cli", "logs", job_id, "-f", *connection]
        said = hub.tmp / "follower.err"
        with (
            said.open("w") as err_file,
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err_file) as follower,
        ):
            # the follower says the job waits before the slice is freed (a fixed sleep lost that race on CI's
            # two busy cores: the follower's first look came after the job had started)
            until(
                lambda: f"job {job_id} is #1 in the queue" in said.read_text(),
                "the follower's wait",
                timeout=60,
            )
            assert me.delete(f"/jobs/{blocker['id']}").json()["state"] == "cancelled"
            out = follower.communicate(timeout=60)[0].decode()
    err = said.read_text()
    assert f"job {job_id} is #1 in the queue" in err and "its log follows once it starts" in err, err
    assert out == "after the wait\n" and f"job {job_id} succeeded" in err, (out, err)


def test_a_job_keeps_running_and_logging_across_a_service_restart(hub: Hub) -> None:
    """Runs last: it kills the managed service and starts one by hand. The job logs while the service is
    down and then waits for the test's go-ahead, so a slow restart cannot see it finish first."""
    ticks = 40
    go = Path(tempfile.gettempdir(), f"gpupool-go-{uuid.uuid4().hex}")  # /tmp: the job's account sees it
    script = (
        f"i=0; while [ $i -lt {ticks // 2} ]; do echo tick $i; i=$((i+1)); sleep 0.1; done; "
        f"while [ ! -e {go} ]; do sleep 0.1; done; "
        f"while [ $i -lt {ticks} ]; do echo tick $i; i=$((i+1)); done"
    )
    with hub.as_user("me") as me:
        job = submit(me, ["sh", "-c", script], profile="cpu")
        until(lambda: "tick 3" in me.get(f"/jobs/{job['id']}/logs").text, "the job to log")
    hub.kill_service()
    hub.start_service()
    with hub.as_user("me") as me:
        again = me.get(f"/jobs/{job['id']}").json()
        assert again["state"] == "running" and again["attempts"] == 1, again  # adopted, not started again
        go.touch()
        with me.stream("GET", f"/jobs/{job['id']}/logs", params={"follow": "true"}, timeout=30) as stream:
            lines = [line for line in stream.iter_lines() if line]
        assert lines == [f"tick {i}" for i in range(ticks)]  # nothing lost while the service was down
        assert state_of(me, job["id"]) == "succeeded"
    go.unlink()


def test_a_service_token_is_told_where_a_users_token_comes_from(hub: Hub) -> None:
    """A Kubernetes trial ran `gpupool submit --state-dir …` (the spawners' service token) and read only "jobs
    run as a user; submit with a user's token", with no word on where one comes from."""
    with hub.as_user("admin") as service:
        refused = service.post("/jobs", json={"command": ["true"], "profile": "cpu"})
    assert refused.status_code == 403
    assert "/hub/token" in refused.json()["detail"] and "JUPYTERHUB_API_TOKEN" in refused.json()["detail"]
