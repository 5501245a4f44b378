"""Groups from the system: on one lab server, a profile for ``gpu-users`` admits the members of that system
group, as the spawner and the service count a user's system groups beside their JupyterHub groups.

As root only (a test group is made with ``groupadd``; CI runs as root).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from job_user import job_user
from jupyterhub.services.auth import HubAuth
from token_hub import token_hub

from gpupool.spawner.hub.compat import SpawnException
from gpupool.spawner.hub.spawner import LocalGPUSpawner
from gpupool.spawner.service.api.auth import Authenticator
from gpupool.spawner.system_groups import system_groups

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="as root only: the test makes a system group")

GROUP = "gpupool-test-gpu"
PROFILES = f"""
profiles:
  - {{slug: everyone, display_name: Everyone, cpu: 1, memory: 1GiB, default: true}}
  - {{slug: gpu-users-only, display_name: For {GROUP}, cpu: 1, memory: 1GiB, groups: [{GROUP}]}}
"""


@pytest.fixture(scope="module")
def member() -> str:
    """The test account, made a member of the system group ``GROUP``."""
    user = job_user()
    subprocess.run(["groupadd", "--force", GROUP], check=True, capture_output=True)
    subprocess.run(["usermod", "--append", "--groups", GROUP, user], check=True, capture_output=True)
    return user


def test_a_users_system_groups_are_listed_by_name(member: str) -> None:
    assert GROUP in system_groups(member)
    assert system_groups("no-such-user-gpupool") == frozenset()


def test_a_profile_for_a_system_group_admits_its_members_and_no_one_else(member: str, tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(PROFILES)
    member_spawner = _spawner(member, profiles)
    assert member_spawner.resolve_profile({"profile": "gpu-users-only"}).slug == "gpu-users-only"
    assert GROUP in member_spawner.user_groups  # what the spawner sends the service with the lease

    with pytest.raises(SpawnException) as refused:  # the same user, JupyterHub groups only
        _spawner(member, profiles, system_groups=False).resolve_profile({"profile": "gpu-users-only"})
    assert refused.value.status_code == 403
    with pytest.raises(SpawnException):  # an account outside the group
        _spawner("nobody", profiles).resolve_profile({"profile": "gpu-users-only"})


def _spawner(user: str, profiles: Path, **config: object) -> LocalGPUSpawner:
    hub_user = SimpleNamespace(name=user, groups=[], admin=False, settings={}, url=f"/user/{user}/")
    return LocalGPUSpawner(
        user=hub_user,
        profiles_file=str(profiles),
        service_api_token="t",
        service_url="http://127.0.0.1:9/services/gpupool/",
        **config,
    )


def test_the_service_counts_a_callers_system_groups_when_told_to(member: str) -> None:
    """What a job's profile and quota see: the service's ``GPUPOOL_SYSTEM_GROUPS`` (the production setting)."""
    model = {"name": member, "kind": "user", "groups": ["training"], "scopes": ["access:services"]}
    with token_hub({"member-token": model}) as api:
        for counted in (True, False):
            auth = Authenticator(
                HubAuth(api_url=api, api_token="unused"), "gpupool", with_system_groups=counted
            )
            caller = asyncio.run(auth.identify("member-token"))
            assert "training" in caller.groups and (GROUP in caller.groups) is counted
