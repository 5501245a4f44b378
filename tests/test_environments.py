"""Environments within a profile: a choice of software (a Python environment on one host, an image on
Kubernetes), in the form, REST spawns and jobs; unknown choices are refused listing the valid ones.

Finding 3 of the researcher's-day review: profiles offered no choice of environment (KubeSpawner's
``profile_options``), and a job could not ask for the same environment as its notebook.
"""

from __future__ import annotations

import os
import sys
from html import escape
from pathlib import Path

import pytest
import yaml
from test_job_runner import check

from gpupool.spawner.backends.simulated import DEMO_POOL, load_pool_file
from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES, load_profiles, parse_profiles
from gpupool.spawner.hub.form import ProfileChoice, choices_for, lease_options, profile_list, render_form
from gpupool.spawner.hub.spawner import _profile_from_formdata
from gpupool.spawner.pool.environments import UnknownEnvironment, UnrunnableEnvironment
from gpupool.spawner.pool.profiles import ProfileError, environments_never_fit, fits_pool, refuse_environment
from gpupool.spawner.service.jobs.processes import Identity
from gpupool.spawner.service.jobs.submission import CheckedJob, InvalidJob
from gpupool.widgets.jobs import submission

PROFILES = load_profiles(EXAMPLE_PROFILES)
A100_PAIR = next(p for p in PROFILES if p.slug == "a100-pair")
BIN = str(Path(sys.executable).parent)


def profile_with(environments: str) -> object:
    return yaml.safe_load(
        "profiles:\n  - {slug: p, display_name: P, cpu: 2, memory: 8GiB, gpus: {count: 1}, "
        f"environments: {environments}}}\n"
    )


def test_the_form_offers_each_profiles_environments_and_reads_back_the_chosen_profiles_one() -> None:
    html = render_form([ProfileChoice(p, 1, 0) for p in PROFILES], simulated=True)
    assert '<select name="environment-a100-pair"' in html
    assert "Code built for CUDA 12.4 (needs CUDA 12.4)" in html
    chosen = _profile_from_formdata(
        {"profile": ["a100-pair"], "environment-a100-pair": ["cuda-12-4"], "environment-other": ["x"]}
    )
    assert chosen == {"profile": "a100-pair", "environment": "cuda-12-4"}
    assert lease_options(chosen, A100_PAIR) == {"walltime": None, "environment": "cuda-12-4"}
    assert lease_options({}, A100_PAIR)["environment"] == "lab"  # the default one
    (row,) = [r for r in profile_list([ProfileChoice(A100_PAIR, 1, 0)]) if r["slug"] == "a100-pair"]
    assert row["profile_options"] == {  # KubeSpawner's vocabulary
        "environment": {
            "display_name": "Environment",
            "choices": {
                "lab": {"display_name": "JupyterLab with NumPy (this hub's Python)", "default": True},
                "cuda-12-4": {"display_name": "Code built for CUDA 12.4 (needs CUDA 12.4)", "default": False},
            },
        }
    }


def test_an_environment_no_gpu_can_run_is_shown_disabled_saying_why_and_left_out_on_kubernetes() -> None:
    """A Kubernetes trial: the form offered the demo's CUDA 12.4 environment on A100s whose driver 535 runs CUDA
    12.2, and picking it ended in a 409 after Start. Both forms now say why before anyone presses Start, in the
    words of the service's refusal (the one rule: placement on the pool's nodes)."""
    closed = {p.slug: environments_never_fit(p, load_pool_file(DEMO_POOL)) for p in PROFILES}
    why = "needs CUDA 12.4; the A100-40GB's driver 535.104.05 supports up to 12.2 (on a100-01)"
    assert {slug: found for slug, found in closed.items() if found} == {"a100-pair": {"cuda-12-4": why}}
    choices = choices_for(
        PROFILES, ["gpu-users"], False, {"a100-pair": (1, 0)}, {}, environments_never_fit=closed
    )
    html = render_form(choices, simulated=True)  # LocalGPUSpawner's
    assert '<option value="lab" selected>' in html
    said = escape(f"Code built for CUDA 12.4 — cannot run on this profile's GPUs: {why}")
    assert f'<option value="cuda-12-4" disabled title="{escape(why)}">{said}</option>' in html
    (row,) = [r for r in profile_list(choices) if r["slug"] == "a100-pair"]  # KubeGPUSpawner's
    assert row["profile_options"] == {
        "environment": {
            "display_name": "Environment",
            "choices": {
                "lab": {"display_name": "JupyterLab with NumPy (this hub's Python)", "default": True}
            },
        }
    }
    assert f"Code built for CUDA 12.4 not offered: {why} · 1 can start now" in str(row["description"])
    with pytest.raises(UnrunnableEnvironment) as refused:  # what POST leases says to a spawn naming it anyway
        refuse_environment(A100_PAIR, "cuda-12-4", closed["a100-pair"])
    assert str(refused.value) == f"environment: profile a100-pair's GPUs can run lab, not 'cuda-12-4': {why}"


def test_a_profile_no_gpu_can_serve_is_refused_for_itself_not_for_its_environment() -> None:
    """On a pool without A100s every environment of a100-pair "never fits"; the hub always names one, so
    POST leases blamed the environment ("can run none of its environments, not 'lab'") where the profile
    is what the pool cannot serve (from the review)."""
    without_a100s = [n for n in load_pool_file(DEMO_POOL) if "A100-40GB" not in n.products]
    assert fits_pool(A100_PAIR, without_a100s) is not None  # the profile's own refusal stands
    assert environments_never_fit(A100_PAIR, without_a100s) == {}
    refuse_environment(
        A100_PAIR, "lab", environments_never_fit(A100_PAIR, without_a100s)
    )  # left to placement


def test_an_unknown_environment_is_refused_listing_the_profiles_ones() -> None:
    with pytest.raises(
        UnknownEnvironment, match=r"environment: profile a100-pair offers lab, cuda-12-4; got 'tf'"
    ):
        lease_options({"environment": "tf"}, A100_PAIR)
    cpu = next(p for p in PROFILES if p.slug == "cpu")
    with pytest.raises(UnknownEnvironment, match=r"profile cpu offers no environments, got 'lab'"):
        lease_options({"environment": "lab"}, cpu)


def test_an_environments_cuda_need_reaches_the_request() -> None:
    assert A100_PAIR.request(None, "cuda-12-4").gpu.software.min_cuda == "12.4"  # type: ignore[union-attr]
    assert not A100_PAIR.request(None, "lab").gpu.software  # type: ignore[union-attr]


def test_mistakes_in_environments_name_the_profile_and_the_field() -> None:
    cases = {
        "[{slug: a, display_name: A, bin: relative/bin}]": "environments a: bin must be an absolute folder",
        "[{slug: a, display_name: A}, {slug: a, display_name: B}]": "environments: a is listed twice",
        "[{slug: a, display_name: A, colour: red}]": "unknown field 'colour' in environments item 1",
        "[{slug: a, display_name: A, min_cuda: soon}]": "environments a.min_cuda must be a version such as 12.4",
    }
    for text, expected in cases.items():
        with pytest.raises(ProfileError, match=r"profiles.yaml: profile p: ") as caught:
            parse_profiles(profile_with(text), "profiles.yaml")
        assert expected in str(caught.value), (text, str(caught.value))


def test_a_job_in_an_environment_runs_with_its_bin_first_and_names_it(tmp_path: Path) -> None:
    (profile,) = parse_profiles(
        profile_with(f"[{{slug: venv, display_name: This venv, bin: {BIN}, default: true}}]"), "p"
    )
    identity = Identity(os.environ.get("USER", "root"), str(tmp_path))
    checked = check(identity, profile=profile, command=["python", "-c", "pass"])
    assert isinstance(checked, CheckedJob)
    assert checked.env["PATH"].startswith(f"{BIN}:") and checked.env["GPUPOOL_ENVIRONMENT"] == "venv"
    with pytest.raises(InvalidJob, match=r"environment: profile p offers venv; got 'conda'"):
        check(identity, profile=profile, command=["python"], environment="conda")


def test_submit_environment_notebook_names_the_notebook_servers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_ENVIRONMENT", "lab")
    assert submission(["python", "train.py"], "a100-pair", environment="notebook")["environment"] == "lab"
    monkeypatch.delenv("GPUPOOL_ENVIRONMENT")
    with pytest.raises(ValueError, match="environment: this notebook's server runs in no named environment"):
        submission(["python", "train.py"], "a100-pair", environment="notebook")
