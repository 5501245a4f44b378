"""Each hub user's own system account, made as root: a hostile-user trial became another user (their token read
from ``/proc/<pid>/environ``, since every server and job ran as one account) and, racing the service's
``chown`` of a fresh home with a symbolic link, had root hand it a folder of root's."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from gpupool.spawner.user_accounts import (
    AccountError,
    account_name,
    ensure_user_account,
    make_private_home,
    prepare_homes,
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
    make_private_home(str(home), 4343, 4343)
    for path in (home, home / "notebooks", home / "notebooks" / "a.ipynb", home / "link"):
        assert path.lstat().st_uid == 4343, path
    assert roots.stat().st_uid == 0


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
