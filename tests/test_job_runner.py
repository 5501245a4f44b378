"""The local runner with real processes: identity, environment, process groups, logs; and submission checks."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from job_user import clean_home, job_user, user_dir
from polling import until

from gpupool.spawner.pool.job_states import JobState
from gpupool.spawner.pool.profiles import Profile
from gpupool.spawner.service.jobs import processes
from gpupool.spawner.service.jobs.runner import LocalRunner, Outcome
from gpupool.spawner.service.jobs.submission import InvalidJob, check_submission

RUN = uuid.uuid4().hex[:8]  # job ids unique to this test run: a job directory is never a leftover
PROFILE = Profile("cpu", "CPU", 1000, 1024, max_lifetime=3600)


@pytest.fixture(scope="module")
def identity() -> Iterator[processes.Identity]:
    yield processes.identity_for(job_user())
    clean_home(job_user())


def run(
    identity: processes.Identity, command: list[str], job_id: str, visible: str = ""
) -> tuple[processes.Started, str]:
    job_id = f"{job_id}-{RUN}"
    directory = processes.job_dir(identity, job_id)
    env = processes.job_env(identity, job_id, directory, visible, {"GREETING": "hi"}, attempt=1)
    work = str(user_dir(identity.user))
    return processes.launch(identity, tuple(command), work, directory, 1, env), directory


def test_a_job_runs_as_its_user_never_root_with_its_devices_and_checkpoint_dir_in_its_log(
    identity: processes.Identity,
) -> None:
    script = 'id -u; echo "$CUDA_VISIBLE_DEVICES|$NVIDIA_VISIBLE_DEVICES|$GPUPOOL_JOB_ID|$GREETING"; pwd; echo "$GPUPOOL_CHECKPOINT_DIR"'
    started, directory = run(identity, ["sh", "-c", script], "runner-env", "GPU-a,MIG-b")
    started.process.wait(10)
    until(
        lambda: not processes.group_alive(started.pid, started.start, f"runner-env-{RUN}"),
        "the group to end",
        timeout=10,
    )
    uid, devices, cwd, checkpoints = processes.read_log(directory, identity.uid).decode().split("\n")[:4]
    assert uid == str(os.geteuid() if identity.uid is None else identity.uid) and uid != "0"
    assert devices == f"GPU-a,MIG-b|GPU-a,MIG-b|runner-env-{RUN}|hi"
    assert cwd.startswith(identity.home) and checkpoints == f"{directory}/checkpoint"
    assert Path(checkpoints).is_dir()
    assert processes.exit_status(directory, 1, identity.uid) == 0


def test_a_cpu_only_job_sees_no_gpu_and_its_exit_status_is_recorded(identity: processes.Identity) -> None:
    started, directory = run(
        identity, ["sh", "-c", 'echo "[$CUDA_VISIBLE_DEVICES] $NVIDIA_VISIBLE_DEVICES"; exit 3'], "runner-cpu"
    )
    started.process.wait(10)
    assert processes.read_log(directory, identity.uid) == b"[] void\n"
    assert processes.exit_status(directory, 1, identity.uid) == 3


def test_sigterm_to_the_group_stops_the_command_and_its_children(identity: processes.Identity) -> None:
    started, directory = run(identity, ["sh", "-c", "sleep 30 & sleep 30; wait"], "runner-term")
    until(
        lambda: processes.group_alive(started.pid, started.start, f"runner-term-{RUN}"),
        "the group to start",
        timeout=10,
    )
    assert processes.signal_group(started.pid, started.start, f"runner-term-{RUN}", signal.SIGTERM)
    until(
        lambda: not processes.group_alive(started.pid, started.start, f"runner-term-{RUN}"),
        "the whole group to end",
        timeout=10,
    )
    started.process.wait(5)
    assert processes.exit_status(directory, 1, identity.uid) is None  # killed before it could record one


def test_a_process_with_the_same_pid_but_another_start_time_is_not_the_job(
    identity: processes.Identity,
) -> None:
    started, _ = run(identity, ["sleep", "30"], "runner-identity")
    try:
        until(lambda: processes.start_time(started.pid) is not None, "the job to start", timeout=10)
        assert processes.group_alive(started.pid, started.start, f"runner-identity-{RUN}")
        assert not processes.group_alive(started.pid, started.start + 1, "another-job")
        assert not processes.signal_group(started.pid, started.start + 1, "another-job", signal.SIGKILL)
        assert processes.find_leader(f"runner-identity-{RUN}", 1, _uid(identity)) == (
            started.pid,
            started.start,
        )
    finally:
        os.killpg(started.pid, signal.SIGKILL)
        started.process.wait(5)


def test_a_job_whose_env_spells_another_jobs_id_is_never_taken_for_that_job(
    identity: processes.Identity,
) -> None:
    """A hostile-user trial: the service knew a job's processes by ``GPUPOOL_JOB_ID=<id>`` anywhere in their
    environment, so a job submitted with ``env {"A": "GPUPOOL_JOB_ID=<another job's id>"}`` would be taken
    for that job (signalled, or found as its run after a restart)."""
    job_id, victim = f"runner-spoof-{RUN}", f"runner-victim-{RUN}"
    directory = processes.job_dir(identity, job_id)
    spelled = {"A": f"GPUPOOL_JOB_ID={victim}", "B": "GPUPOOL_JOB_ATTEMPT=1"}
    env = processes.job_env(identity, job_id, directory, "", spelled, attempt=1)
    started = processes.launch(identity, ("sleep", "30"), str(user_dir(identity.user)), directory, 1, env)
    try:
        until(lambda: processes.start_time(started.pid) is not None, "the job to start", timeout=10)
        assert processes.find_leader(job_id, 1, _uid(identity)) == (started.pid, started.start)
        assert processes.find_leader(victim, 1, _uid(identity)) is None
        assert not processes.group_alive(started.pid, started.start + 1, victim)
    finally:
        os.killpg(started.pid, signal.SIGKILL)
        started.process.wait(5)


def test_a_process_of_another_account_that_sets_a_jobs_variables_is_never_taken_for_it(
    identity: processes.Identity,
) -> None:
    """From a review: after a restart the service finds a run it could not record by the run's variables, and
    any user may start a process that sets them. Only a process of the job's own account is its run."""
    job_id = f"runner-impostor-{RUN}"
    variables = {**os.environ, "GPUPOOL_JOB_ID": job_id, "GPUPOOL_JOB_ATTEMPT": "1"}
    impostor = subprocess.Popen(["sleep", "30"], env=variables, start_new_session=True)
    try:
        until(lambda: processes.start_time(impostor.pid) is not None, "the process to start", timeout=10)
        mine = (impostor.pid, processes.start_time(impostor.pid))
        assert processes.find_leader(job_id, 1, os.geteuid()) == mine  # the variables alone would match
        assert processes.find_leader(job_id, 1, _another_uid()) is None
    finally:
        impostor.kill()
        impostor.wait(5)


def _uid(identity: processes.Identity) -> int:
    return os.geteuid() if identity.uid is None else identity.uid


def _another_uid() -> int:
    """A uid no process of this test runs as."""
    return next(uid for uid in range(60_000, 65_000) if uid != os.geteuid())


def test_a_log_replaced_by_a_symlink_is_never_read(identity: processes.Identity, tmp_path: Path) -> None:
    started, directory = run(identity, ["true"], "runner-symlink")
    started.process.wait(10)
    secret = tmp_path / "secret"
    secret.write_text("root's secret")
    log = Path(directory, processes.LOG_NAME)
    log.unlink()
    log.symlink_to(secret)
    assert processes.read_log(directory, identity.uid) == b""


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: the service then runs jobs as system accounts")
def test_as_root_a_user_without_a_system_account_or_a_root_account_is_refused() -> None:
    with pytest.raises(processes.NoSystemAccount, match="no system account"):
        processes.identity_for("no-such-user-gpupool")
    with pytest.raises(processes.NoSystemAccount, match="never run as root"):
        processes.identity_for("root")


def test_without_root_jobs_run_as_the_service_user_in_homes_under_the_home_root() -> None:
    simple = processes.identity_for("alice", home_root="/srv/homes", euid=1000)
    assert simple == processes.Identity("alice", "/srv/homes/alice")


def test_a_deleted_users_filed_away_name_has_no_identity(tmp_path: Path) -> None:
    """An admin reading a deleted user's filed-away job log ("grace/deleted …") made the folder
    ``<home_root>/grace/deleted …`` inside the home a new grace would get (from the review)."""
    for euid in (0, 1000):
        with pytest.raises(processes.NoSystemAccount, match="is a deleted hub user"):
            processes.identity_for("grace/deleted 2026-12-07 17:40:03", home_root=str(tmp_path), euid=euid)
    assert list(tmp_path.iterdir()) == []


def test_with_one_account_every_users_jobs_run_as_it_in_homes_under_the_home_root() -> None:
    account = pwd.getpwnam(job_user())
    shared = processes.identity_for("alice", home_root="/srv/homes", account=account.pw_name, euid=0)
    assert (shared.user, shared.home, shared.uid, shared.gid) == (
        "alice",
        "/srv/homes/alice",
        account.pw_uid,
        account.pw_gid,
    )
    with pytest.raises(processes.NoSystemAccount, match="never run as root"):
        processes.identity_for("alice", account="root", euid=0)


def test_a_users_first_job_gets_the_home_a_first_server_would_have_made(tmp_path: Path) -> None:
    # As root with one job account (gpupool up as root), or as the service's user with a home root.
    root = os.geteuid() == 0
    runner = LocalRunner(home_root=str(tmp_path), account=job_user() if root else None)
    identity = runner.identity("newcomer")
    home = Path(identity.home)
    assert home == tmp_path / "newcomer" and home.is_dir()
    assert home.stat().st_mode & 0o777 == 0o700
    assert home.stat().st_uid == (pwd.getpwnam(job_user()).pw_uid if root else os.geteuid())
    checked = check_submission(
        identity=identity,
        profile=PROFILE,
        command=["sh", "-c", "true"],
        working_dir=None,
        env={},
        max_runtime=None,
        priority_class="batch",
        name=None,
        is_admin=False,
    )
    assert checked.working_dir == identity.home


# ---- submission checks ----------------------------------------------------------------------------------


def check(identity: processes.Identity, **changes: object) -> object:
    ask: dict[str, object] = {
        "identity": identity,
        "profile": PROFILE,
        "command": ["sh", "-c", "true"],
        "working_dir": None,
        "env": {},
        "max_runtime": None,
        "priority_class": "batch",
        "name": None,
        "is_admin": False,
    }
    return check_submission(**(ask | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"command": []}, "command", "non-empty list"),
        ({"command": ["no-such-program-gpupool"]}, "command", "not an executable"),
        ({"working_dir": "relative/dir"}, "working_dir", "absolute path"),
        ({"working_dir": "/etc"}, "working_dir", "outside your home"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES", "from the job's lease"),
        ({"env": {"1BAD": "x"}}, "env.1BAD", "variable name"),
        (
            {"max_runtime": 2592000.0},
            "max_runtime",
            r"30d is over profile \S+ limit of 1h \(2592000 s against 3600 s\)",
        ),
        # a hostile-user trial: 1e308 was said in 300-digit figures
        (
            {"max_runtime": 1e308},
            "max_runtime",
            r"max_runtime: 1e\+308 s is over profile \S+ limit of 1h \(1e\+308 s against",
        ),
        ({"priority_class": "interactive"}, "priority_class", "for servers and administrators"),
        # a hostile-user trial: these passed as a name, and an admin's pages and terminal printed them
        ({"name": "run\u061c1"}, "name", r"holds U\+061C \(ARABIC LETTER MARK\)"),
        ({"name": "run\u20281"}, "name", r"holds U\+2028 \(LINE SEPARATOR\)"),
        ({"name": "run\u200b1"}, "name", r"holds U\+200B \(ZERO WIDTH SPACE\)"),
    ],
)
def test_a_bad_submission_names_the_field(
    identity: processes.Identity, changes: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(InvalidJob, match=words) as refused:
        check(identity, **changes)
    assert refused.value.field == field and str(refused.value).startswith(f"{field}:")


def test_a_name_in_any_script_with_the_joiners_it_needs_is_accepted(identity: processes.Identity) -> None:
    for name in ("训练 run 3", "\U0001f469\u200d\U0001f52c lab", "می\u200cخواهم", "Ünïcødé"):
        assert check(identity, name=name).name == name


def test_a_working_dir_that_escapes_the_home_by_dots_or_symlink_is_refused(
    identity: processes.Identity,
) -> None:
    inside = user_dir(identity.user)
    (inside / "out").symlink_to("/etc")
    for escape in (f"{inside}/../../..", f"{inside}/out"):
        with pytest.raises(InvalidJob, match="outside your home") as refused:
            check(identity, working_dir=escape)
        assert refused.value.field == "working_dir"
    ok = check(identity, working_dir=str(inside))
    assert ok.working_dir == str(inside.resolve())
    assert ok.max_runtime == 3600  # the profile's limit is the default


def test_an_unknown_command_is_refused_without_showing_the_services_path(
    identity: processes.Identity,
) -> None:
    with pytest.raises(InvalidJob) as refused:
        check(identity, command=["no-such-program-gpupool"])
    assert os.environ["PATH"] not in str(refused.value) and "full path" in str(refused.value)


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder every account may enter (pytest's own temporary folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-open-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.skipif(
    os.geteuid() != 0, reason="as root only: the service then checks commands for the job's account"
)
def test_whether_a_command_exists_in_a_folder_closed_to_the_job_is_not_told(
    identity: processes.Identity, open_folder: Path
) -> None:
    """A trial found the check ran as the service's root: a program in a root-only folder was accepted (then
    failed with 126) while a missing one was refused, telling a user which files exist there."""
    closed = open_folder / "closed"
    closed.mkdir(mode=0o700)
    (closed / "tool").write_text("#!/bin/sh\necho hi\n")
    (closed / "tool").chmod(0o755)
    answers = []
    for command in (str(closed / "tool"), str(closed / "missing")):
        with pytest.raises(InvalidJob) as refused:
            check(identity, command=[command])
        answers.append(str(refused.value).replace(command, "X"))
    assert answers[0] == answers[1] == "command: 'X' is not an executable file that the job's account may run"
    closed.chmod(0o755)  # opened to everyone: the same program is accepted
    assert check(identity, command=[str(closed / "tool")]).command == (str(closed / "tool"),)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"command": ["true", "x" * (128 * 1024 + 1)]}, "command.1"),  # execve would fail with E2BIG
        ({"command": ["true"] * 1025}, "command"),
        ({"env": {f"V{i}": "x" for i in range(257)}}, "env"),
        ({"env": {"BIG": "x" * (32 * 1024 + 1)}}, "env.BIG"),
        ({"command": ["true", *["y" * 30_000] * 3]}, "command"),  # each fits, not all together
        # a hostile-user trial stored 896 KiB jobs, whose every listing slowed everyone's requests
        ({"command": ["true"], "env": {f"V{i}": "x" * 30_000 for i in range(3)}}, "command"),
    ],
)
def test_a_submission_over_the_size_limits_is_refused_naming_the_field(
    identity: processes.Identity, changes: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidJob) as refused:
        check(identity, **changes)
    assert refused.value.field == field and "at most" in str(refused.value)


def test_an_exit_status_past_128_says_which_signal_killed_the_command() -> None:
    assert Outcome(137).end(None) == (JobState.FAILED, "the command was killed by SIGKILL (exit status 137)")
    assert Outcome(3).end(None) == (JobState.FAILED, "the command exited with status 3")
