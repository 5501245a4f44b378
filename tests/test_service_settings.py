"""The service's settings: every ``GPUPOOL_*`` variable feeds a documented trait, a config file and the command
line can set the same, and a bad value stops the service naming the variable."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.service.assembly import assemble, shown_store
from gpupool.spawner.service.settings import ServiceSettings, passed_on, settings_table
from gpupool.spawner.service.store.lease_store import sqlite_url

HUB = {"JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api"}
README = Path(__file__).parent.parent / "README.md"
SOURCES = [Path(__file__).parent.parent / d for d in ("spawner", "widgets", "hub_config")]


def settings(**env: str) -> ServiceSettings:
    return ServiceSettings.from_environment(HUB | env)


@pytest.mark.parametrize(("raw", "seconds"), [(None, 2.0), ("0", 0.0), ("0.5", 0.5)])
def test_the_sample_interval_comes_from_the_environment(raw: str | None, seconds: float) -> None:
    assert settings(**({} if raw is None else {"GPUPOOL_SAMPLE_SECONDS": raw})).sample_seconds == seconds


@pytest.mark.parametrize(
    ("variable", "raw", "said"),
    [
        ("GPUPOOL_SAMPLE_SECONDS", "often", "GPUPOOL_SAMPLE_SECONDS must be a number, got 'often'"),
        ("GPUPOOL_SAMPLE_SECONDS", "0.01", "GPUPOOL_SAMPLE_SECONDS must be 0 (off) or at least 0.1"),
        ("GPUPOOL_SAMPLE_SECONDS", "nan", "GPUPOOL_SAMPLE_SECONDS must be 0 (off) or at least 0.1"),
        ("GPUPOOL_RECONCILE_SECONDS", "-1", "GPUPOOL_RECONCILE_SECONDS must be 0 or more seconds"),
        ("GPUPOOL_GPU_IDLE_THRESHOLD", "100", "GPUPOOL_GPU_IDLE_THRESHOLD must be from 0 to under 100"),
        ("GPUPOOL_MAX_QUEUED_JOBS", "1.5", "GPUPOOL_MAX_QUEUED_JOBS must be a whole number, got '1.5'"),
        ("GPUPOOL_METRICS_PUBLIC", "maybe", "GPUPOOL_METRICS_PUBLIC must be 1 or 0 (true or false)"),
        ("GPUPOOL_BACKEND", "slurm", "GPUPOOL_BACKEND must be local or kubernetes, got 'slurm'"),
        ("GPUPOOL_POLICY", "fastest", "GPUPOOL_POLICY: unknown placement policy 'fastest'"),
        ("GPUPOOL_KUBE_NAMESPACE", "Team A", "GPUPOOL_KUBE_NAMESPACE: expected an RFC 1123 label"),
        ("GPUPOOL_KUBE_SHARED_RESOURCE", "shared", "GPUPOOL_KUBE_SHARED_RESOURCE must be a resource name"),
    ],
)
def test_a_bad_value_stops_the_service_naming_its_variable(variable: str, raw: str, said: str) -> None:
    with pytest.raises(SystemExit, match=re.escape(said)):
        settings(**{variable: raw})


def test_switches_read_the_usual_spellings() -> None:
    assert settings(GPUPOOL_METRICS_PUBLIC="yes").metrics_public
    assert settings(GPUPOOL_STOP_UNLEASED="1").stop_unleased
    assert not settings(GPUPOOL_STOP_UNLEASED="").stop_unleased


def test_a_config_file_overrides_the_environment_and_the_command_line_overrides_both(tmp_path: Path) -> None:
    config = tmp_path / "service_config.py"
    config.write_text("c.ServiceSettings.policy = 'fgd'\nc.ServiceSettings.max_queued_jobs = 7\n")
    env = HUB | {
        "GPUPOOL_CONFIG_FILE": str(config),
        "GPUPOOL_POLICY": "spread",
        "GPUPOOL_MAX_QUEUED_JOBS": "3",
    }
    loaded = ServiceSettings.from_environment(env, ["--ServiceSettings.max_queued_jobs=9"])
    assert loaded.policy == "fgd" and loaded.max_queued_jobs == 9


def test_without_the_hubs_api_the_service_says_how_to_run_it() -> None:
    with pytest.raises(SystemExit, match="JUPYTERHUB_API_URL is not set"):
        ServiceSettings.from_environment({})


def test_every_gpupool_variable_the_service_reads_is_a_documented_setting() -> None:
    traits = ServiceSettings.class_own_traits(config=True)
    variables = {t.metadata["env"] for t in traits.values()}
    assert all(str(t.help).strip() for t in traits.values())
    service = Path(__file__).parent.parent / "spawner" / "service"
    mentioned = {
        name
        for path in service.rglob("*.py")
        for name in re.findall(r"GPUPOOL_[A-Z_]+", path.read_text())
        if not name.startswith(
            (
                "GPUPOOL_JOB_ID",
                "GPUPOOL_LEASE",
                "GPUPOOL_CHECKPOINT",
                "GPUPOOL_JOB_ATTEMPT",
                "GPUPOOL_ENVIRONMENT",
            )
        )
    }  # those left out are what gpupool sets in a job's environment, not settings
    assert mentioned - variables == set()


def test_the_readme_lists_every_setting_as_the_code_defines_it() -> None:
    assert settings_table() in README.read_text()


def test_a_hub_passes_on_the_services_settings_from_its_environment_and_nothing_else() -> None:
    """A lab trial's GPUPOOL_DB_URL and GPUPOOL_POLICY in /etc/gpupool/environment never reached the service:
    JupyterHub starts a managed service with its ``environment`` and little else."""
    hub_environment = {
        "GPUPOOL_DB_URL": "postgresql+psycopg://gpupool:secret@db/gpupool",
        "GPUPOOL_POLICY": "fgd",
        "KUBECONFIG": "/etc/gpupool/kubeconfig",
        "JUPYTERHUB_API_TOKEN": "the hub's own",  # the hub sets these per service
        "GPUPOOL_NOT_A_SETTING": "x",
        "HOME": "/root",
    }
    assert passed_on(hub_environment) == {
        "GPUPOOL_DB_URL": "postgresql+psycopg://gpupool:secret@db/gpupool",
        "GPUPOOL_POLICY": "fgd",
        "KUBECONFIG": "/etc/gpupool/kubeconfig",
    }


def test_with_system_groups_a_group_or_user_the_host_lacks_is_warned_of_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lab trial's ``groups: [visoin]`` and ``users: {adaa: …}`` started without a word: the profile was then
    closed to its intended members, and ada's limits were not hers."""
    (tmp_path / "profiles.yaml").write_text(
        "profiles:\n"
        "  - {slug: cpu, display_name: CPU, cpu: 1, memory: 1GiB, groups: [root]}\n"
        "  - {slug: vision, display_name: Vision, cpu: 1, memory: 1GiB, groups: [visoin]}\n"
    )
    (tmp_path / "quotas.yaml").write_text(
        "per_group:\n  root: {cpu: 8}\nusers:\n  adaa: {cpu: 8}\n  root: {cpu: 8}\n"
    )
    settings = {
        "pool_file": str(DEMO_POOL),
        "profiles_file": str(tmp_path / "profiles.yaml"),
        "quotas_file": str(tmp_path / "quotas.yaml"),
        "db_url": sqlite_url(str(tmp_path / "leases.sqlite")),
        "hub_api_url": "http://127.0.0.1:9/hub/api",
        "reconcile_seconds": 0,
        "sample_seconds": 0,
    }
    with caplog.at_level(logging.WARNING, logger="gpupool.spawner.service.assembly"):
        assemble(ServiceSettings(system_groups=True, **settings)).manager.store.close()
    said = [r.getMessage() for r in caplog.records if "misspelling" in r.getMessage()]
    assert said == [
        "profile vision is kept for group visoin, which is not a group on this host (nor a JupyterHub group "
        "yet?): a misspelling?",
        "the quotas file limits user adaa, who has no account on this host: a misspelling?",
    ]
    caplog.clear()
    (tmp_path / "leases.sqlite").unlink()
    with caplog.at_level(logging.WARNING, logger="gpupool.spawner.service.assembly"):
        assemble(
            ServiceSettings(**settings)
        ).manager.store.close()  # hub groups only: nothing to check against
    assert not any("misspelling" in r.getMessage() for r in caplog.records)


def test_the_lease_store_is_logged_without_its_password_wherever_the_url_holds_it() -> None:
    assert shown_store("sqlite:////var/lib/gpupool/leases-$x.sqlite") == "/var/lib/gpupool/leases-$x.sqlite"
    assert (
        shown_store("postgresql+psycopg://gpupool:s3cret@db/gp") == "postgresql+psycopg://gpupool:***@db/gp"
    )
    shown = shown_store("postgresql+psycopg://gpupool@db/gp?password=s3cret&sslpassword=k3y&sslmode=require")
    assert "s3cret" not in shown and "k3y" not in shown and "sslmode=require" in shown
