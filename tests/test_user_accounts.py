"""Each hub user's own system account, made as root: a hostile-user trial became another user (their token read
from ``/proc/<pid>/environ``, since every server and job ran as one account) and, racing the service's
``chown`` of a fresh home with a symbolic link, had root hand it a folder of root's."""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from builders import gpu, node

from gpupool.spawner.pool.profiles import Profile
from gpupool.spawner.service.jobs.job_manager import JobManager, Submission
from gpupool.spawner.service.jobs.runner import LocalRunner
from gpupool.spawner.service.jobs.submission import InvalidJob
from gpupool.spawner.service.leasing.lease_manager import LeaseManager
from gpupool.spawner.service.store.job_store import JobStore
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url
from gpupool.spawner.user_accounts import (
    AccountError,
    account_name,
    ensure_user_account,
    make_private_home,
    prepare_homes,
    retire_user_account,
)

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="as root only: the test makes system accounts")
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw")


def test_two_hub_users_never_share_an_account_and_names_stay_readable() -> None:
    assert account_name("ada") == "gp-ada"
    odd = ["Ada", "ada.lovelace@example.org", "x" * 40, "ünï", "-ada", "ada lovelace"]
    names = [account_name(user) for user in ["ada", *odd]]
    assert len(set(names)) == len(names)
    assert all(len(name) <= 32 and name.startswith("gp-") for name in names)
    assert account_name("ada.lovelace@example.org").startswith("gp-ada-lovelace-")
    # a second trial took "h2x.y"'s account first by logging in as the plain name it mapped to
    taken = account_name("h2x.y")
    assert account_name(taken.removeprefix("gp-")) != taken and "." in taken


@as_root
def test_a_user_gets_an_account_of_their_own_and_a_home_no_one_else_enters(tmp_path: Path) -> None:
    homes = tmp_path / "homes"
    prepare_homes(str(homes))
    assert (homes.stat().st_uid, homes.stat().st_mode & 0o777) == (0, 0o711)
    first = ensure_user_account(f"ua-first-{WORKER}", str(homes))
    second = ensure_user_account(f"ua-second-{WORKER}", str(homes))
    assert first.uid != second.uid and 0 not in (first.uid, second.uid)
    for account in (first, second):
        home = Path(account.home)
        assert (home.stat().st_uid, home.stat().st_mode & 0o777) == (account.uid, 0o700)
        assert pwd.getpwnam(account.name).pw_shell.endswith(("nologin", "false"))
    assert ensure_user_account(f"ua-first-{WORKER}", str(homes)) == first  # the same, the next time
    secret = Path(first.home, "secret.txt")
    secret.write_text("only mine")
    os.chown(secret, first.uid, first.gid)
    peek = subprocess.run(["cat", str(secret)], user=second.uid, group=second.gid, capture_output=True)
    assert peek.returncode != 0 and b"Permission denied" in peek.stderr


@as_root
def test_an_account_gpupool_did_not_make_is_never_run_as(tmp_path: Path) -> None:
    user = f"ua-lookalike-{WORKER}"
    name = account_name(user)
    if not _exists(name):
        subprocess.run(["useradd", "--system", "--no-create-home", name], check=True, capture_output=True)
    with pytest.raises(
        AccountError, match=f"{name} exists and was not made by gpupool for the hub user {user}"
    ):
        ensure_user_account(user, str(tmp_path))


def test_a_user_name_that_is_a_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AccountError, match="cannot be a path"):
        ensure_user_account("../etc", str(tmp_path))


@as_root
def test_a_link_put_in_place_of_a_home_is_refused_and_its_target_keeps_its_owner(tmp_path: Path) -> None:
    target = tmp_path / "roots-folder"
    target.mkdir()
    home = tmp_path / "homes" / "mallory"
    home.parent.mkdir()
    home.symlink_to(target)  # what a racing job did between the service's mkdir and chown
    with pytest.raises(AccountError, match="is not a folder gpupool can use as a home"):
        make_private_home(str(home), 4242, 4242)
    assert target.stat().st_uid == 0


@as_root
def test_a_home_an_earlier_shared_account_kept_is_handed_over_without_following_links(tmp_path: Path) -> None:
    home = tmp_path / "ada"
    (home / "notebooks").mkdir(parents=True)
    (home / "notebooks" / "a.ipynb").write_text("{}")
    roots = tmp_path / "roots.txt"
    roots.write_text("root's")
    (home / "link").symlink_to(roots)
    for path in (home, home / "notebooks", home / "notebooks" / "a.ipynb", home / "link"):
        os.chown(path, 4242, 4242, follow_symlinks=False)
    others = tmp_path / "bob" / "notes.txt"  # another user's private file, hard-linked into ada's home
    others.parent.mkdir()
    others.write_text("bob's")
    os.chown(others, 4242, 4242)
    os.link(others, home / "innocent.txt")
    make_private_home(str(home), 4343, 4343)
    for path in (home, home / "notebooks", home / "notebooks" / "a.ipynb", home / "link"):
        assert path.lstat().st_uid == 4343, path
    assert roots.stat().st_uid == 0
    assert others.stat().st_uid == 4242  # not handed to ada through its second name


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@as_root
def test_a_deleted_users_name_given_again_starts_with_nothing_of_theirs(tmp_path: Path) -> None:
    """A second trial deleted a hub user; a newcomer let in under the same name read the old one's files. A
    hostile-user trial then found the old uid given again: ``userdel`` freed it and the next account took it,
    with what the old user had left outside their home (in ``/tmp``), and a job still running as the old
    account kept the account, and the name, for whoever came next under it."""
    homes, user = str(tmp_path / "homes"), f"ua-gone-{WORKER}"
    first = ensure_user_account(user, homes)
    Path(first.home, "private.txt").write_text("the old user's")
    left = tmp_path / "left-in-tmp.txt"
    left.write_text("the old user's, outside their home")
    os.chown(left, first.uid, first.gid)
    still_running = subprocess.Popen(["sleep", "300"], user=first.uid, group=first.gid)
    made = [first.uid]
    try:
        assert retire_user_account(user, homes) is None
        assert still_running.wait(timeout=10) == -9  # killed: nothing of a deleted user runs on
        assert not _exists(first.name)
        retired = pwd.getpwuid(first.uid)  # the uid stays taken, by an account nothing runs as
        assert retired.pw_name == f"gp-retired.{first.uid}" and "retired" in retired.pw_gecos
        again = ensure_user_account(user, homes)
        made.append(again.uid)
        assert (again.name, os.listdir(again.home)) == (first.name, [])
        assert again.uid != first.uid and left.stat().st_uid == first.uid
        attic = Path(homes, ".deleted")
        assert (attic.stat().st_uid, attic.stat().st_mode & 0o777) == (0, 0o700)  # kept, for root alone
        (kept,) = attic.iterdir()
        assert (kept / "private.txt").read_text() == "the old user's"
        assert retire_user_account(user, homes) is None
    finally:
        still_running.kill()
        retire_user_account(user, homes)
        for uid in made:
            _remove_retired(uid)


def _remove_retired(uid: int) -> None:
    """The tests' own clean-up: a retired test account is removed, so test runs do not use up system uids."""
    with contextlib.suppress(KeyError):
        name = pwd.getpwuid(uid).pw_name
        if name.startswith("gp-retired."):
            subprocess.run(["userdel", name], capture_output=True)
            subprocess.run(["groupdel", name], capture_output=True)


@as_root
def test_a_refused_job_makes_no_account(tmp_path: Path) -> None:
    """A second trial's refused submissions (an empty command) each made a system account and a home first:
    a cheap way to use up the host's system user ids."""
    store = LeaseStore(sqlite_url(str(tmp_path / "gpupool.sqlite")))
    leases = LeaseManager([node("box", [gpu("box", 0)])], store)
    runner = LocalRunner(str(tmp_path / "homes"), account_per_user=True)
    cpu = Profile("cpu", "CPU only", 1000, 1024, None, max_lifetime=600)
    jobs = JobManager(leases, JobStore(store.engine), [cpu], job_runner=runner)
    user = f"ua-refused-{WORKER}"
    for bad in ([""], ["true", "\0"]):
        with pytest.raises(InvalidJob):
            jobs.submit(user, [], Submission(profile="cpu", command=bad))
    assert not _exists(account_name(user)) and not (tmp_path / "homes" / user).exists()
    store.close()


@as_root
def test_reading_a_deleted_users_job_makes_no_account_again(tmp_path: Path) -> None:
    """A review: reading the log or the end of a job whose user was deleted made their account again, for a
    name the hub had just given up."""
    store = LeaseStore(sqlite_url(str(tmp_path / "gpupool.sqlite")))
    leases = LeaseManager([node("box", [gpu("box", 0)])], store)
    homes = str(tmp_path / "homes")
    runner = LocalRunner(homes, account_per_user=True)
    cpu = Profile("cpu", "CPU only", 1000, 1024, None, max_lifetime=600)
    jobs = JobManager(leases, JobStore(store.engine), [cpu], job_runner=runner)
    user = f"ua-deleted-{WORKER}"
    job, _ = jobs.submit(user, [], Submission(profile="cpu", command=["true"]))
    uid = pwd.getpwnam(account_name(user)).pw_uid
    try:
        assert retire_user_account(user, homes) is None
        assert jobs.read_log(job) == b"" and runner.outcome(job).exit_code is None
        assert not _exists(account_name(user)) and not Path(homes, user).exists()
    finally:
        retire_user_account(user, homes)
        _remove_retired(uid)
        store.close()


@pytest.fixture(autouse=True)
def _remove_test_accounts() -> Iterator[None]:
    """The accounts these tests make go when they end (a trial found earlier runs' accounts left behind)."""
    yield
    if os.geteuid() == 0:
        for user in (
            f"ua-{kind}-{WORKER}" for kind in ("first", "second", "gone", "lookalike", "refused", "deleted")
        ):
            if _exists(account_name(user)):
                subprocess.run(["userdel", account_name(user)], capture_output=True)
