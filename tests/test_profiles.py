"""Profiles as data: the shipped examples fit the demo pool, each kind asks the pool for the right thing,
and every mistake in a profiles file is named with its file, profile and field."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yaml_damage import yaml_values

from gpupool.spawner.backends.simulated import DEMO_POOL, load_pool_file
from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES, load_profiles, parse_profiles, read_profiles
from gpupool.spawner.pool.devices import GpuMode, Health, Node
from gpupool.spawner.pool.profiles import Profile, ProfileError, UnknownProfile, find_profile, fits_pool
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import Allocation, PoolState

DEMO_NODES = load_pool_file(DEMO_POOL)
PROFILE = "profiles:\n  - slug: p\n    display_name: P\n    cpu: 2\n    memory: 8GiB\n"


def parse(text: str) -> tuple[Profile, ...]:
    data: object = yaml.safe_load(text)
    return parse_profiles(data, "profiles.yaml")


def one(extra: str) -> Profile:
    """The profile ``p`` with ``extra`` (YAML lines of fields) added."""
    (profile,) = parse(PROFILE + extra)
    return profile


def problem(text: str) -> str:
    with pytest.raises(ProfileError) as caught:
        parse(text)
    return str(caught.value)


def by_slug(profiles: tuple[Profile, ...]) -> dict[str, Profile]:
    return {profile.slug: profile for profile in profiles}


# ---- the shipped profiles ------------------------------------------------------------------------------


def test_the_shipped_profiles_load_and_every_one_fits_the_demo_pool() -> None:
    profiles = load_profiles(EXAMPLE_PROFILES)
    assert EXAMPLE_PROFILES.name == "profiles.yaml" and EXAMPLE_PROFILES.is_file()
    assert [p.slug for p in profiles] == [
        "cpu",
        "l4-quarter",
        "mig-1g",
        "mig-3g",
        "h100",
        "a100-pair",
        "h100-x4",
    ]
    assert {p.slug: fits_pool(p, DEMO_NODES) for p in profiles} == dict.fromkeys(by_slug(profiles))


def test_every_shipped_profile_really_places_on_the_demo_pool_at_once() -> None:
    pool = PoolState(DEMO_NODES)
    for profile in load_profiles(EXAMPLE_PROFILES):
        assert isinstance(pool.place(profile.request(), profile.slug), Allocation), profile.slug
    assert pool.check_invariants() == []


def test_the_shipped_cpu_profile_is_the_only_default_and_group_profiles_are_restricted() -> None:
    profiles = by_slug(load_profiles(EXAMPLE_PROFILES))
    assert [p.slug for p in profiles.values() if p.default] == ["cpu"]
    assert profiles["a100-pair"].groups == {"gpu-users"}
    assert profiles["h100-x4"].groups == {"training"}
    assert profiles["h100-x4"].gpu_description() == "4 × H100-80GB"
    assert profiles["cpu"].idle_timeout == 3600 and profiles["cpu"].max_lifetime == 86400


def test_a_title_names_the_gpu_ask_once() -> None:
    # the spawn's first progress line ("Asking gpupool for ...") once said "Half an H100 (MIG 3g.40gb) (MIG 3g.40gb)"
    profiles = by_slug(load_profiles(EXAMPLE_PROFILES))
    assert profiles["mig-3g"].title() == "Half an H100 (MIG 3g.40gb)"
    assert profiles["cpu"].title() == "CPU only"
    assert profiles["h100"].title() == "One H100 (1 × H100-80GB)"


# ---- what each kind asks the pool for ------------------------------------------------------------------


def test_a_cpu_only_profile_asks_for_cpu_and_memory_and_no_gpu() -> None:
    profile = one("    cpu: 0.5\n    memory: 512\n")  # overrides the base cpu and memory
    assert profile.request() == Request(cpu_milli=500, memory_mib=512, gpu=None)
    assert profile.gpu_description() == "CPU only"


def test_a_whole_gpu_profile_asks_for_count_products_and_memory() -> None:
    profile = one("    gpus: {count: 2, products: [A100-40GB, A100-80GB], min_memory_gb: 40}\n")
    assert profile.request() == Request(
        2000,
        8192,
        WholeGpus(2, frozenset({"A100-40GB", "A100-80GB"}), 38147),  # 40 decimal GB in MiB
    )
    assert profile.gpu_description() == "2 × A100-40GB or A100-80GB with at least 40 GB"
    assert one("    gpus: {count: 1}\n").gpu_description() == "1 × any GPU"


def test_a_mig_profile_asks_for_a_named_slice_or_the_memory_it_needs() -> None:
    named = one("    mig: {profile: 3g.40GB}\n")
    assert named.request().gpu == MigSlice("3g.40gb")
    assert named.gpu_description() == "MIG 3g.40gb"
    sized = one("    mig: {min_memory_gb: 20, products: H100-80GB}\n")
    assert sized.request().gpu == MigSlice(min_memory_gb=20, products=frozenset({"H100-80GB"}))
    assert sized.gpu_description() == "MIG slice of at least 20 GB on H100-80GB"


def test_a_share_profile_asks_for_milli_and_a_memory_cap_however_the_fraction_is_written() -> None:
    by_fraction = one("    share: {fraction: 0.25, memory_gb: 6, products: [L4]}\n")
    by_milli = one("    share: {milli: 250, memory_gb: 6, products: [NVIDIA L4]}\n")
    expected = GpuShare(250, 6144, frozenset({"L4-24GB"}))
    assert by_fraction.request().gpu == by_milli.request().gpu == expected
    assert by_fraction.gpu_description() == "25% of a shared L4-24GB (6 GB memory)"
    assert one("    share: {fraction: 0.5}\n").gpu_description() == "50% of a shared GPU"


@pytest.mark.parametrize(
    "spelling", ["H100-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "h100", "NVIDIA H100"]
)
def test_products_spelled_differently_ask_for_the_same_gpu_and_place_on_it(spelling: str) -> None:
    profile = one(f"    gpus: {{count: 1, products: [{spelling}]}}\n")
    assert profile.request().gpu == WholeGpus(1, frozenset({"H100-80GB"}))
    allocation = PoolState(DEMO_NODES).place(profile.request(), "ada")
    assert isinstance(allocation, Allocation) and allocation.node == "dgx-h100-01"


def test_a_site_label_that_is_no_known_product_is_kept_as_written() -> None:
    assert one("    gpus: {count: 1, products: [acme-x1]}\n").request().gpu == WholeGpus(
        1, frozenset({"acme-x1"})
    )


@pytest.mark.parametrize(
    ("ask", "said"),
    [
        (
            "gpus: {count: 1, products: [A100-90GB]}",
            "gpus.products: unknown GPU product 'A100-90GB': A100 comes in 40 GB and 80 GB, not 90 GB",
        ),
        (
            "share: {fraction: 0.5, products: [L4-48GB]}",
            "share.products: unknown GPU product 'L4-48GB': L4 comes in 24 GB",
        ),
        ("mig: {profile: 1g.10gb, products: [A100]}", "mig.products: GPU product 'A100' is ambiguous"),
    ],
)
def test_a_known_gpu_in_a_size_it_does_not_come_in_is_refused_naming_the_field(ask: str, said: str) -> None:
    """A trial's ``products: [A100-90GB]`` was accepted, and the profile could never start: a pool file's
    same typo is refused. Names of no known family stay allowed (site labels, above)."""
    with pytest.raises(ProfileError) as refused:
        one(f"    {ask}\n")
    assert said in str(refused.value), refused.value


# ---- who may use a profile -----------------------------------------------------------------------------


def test_a_profile_without_groups_is_visible_to_everyone() -> None:
    profile = one("")
    assert profile.visible_to([], is_admin=False)
    assert profile.visible_to(["anything"], is_admin=False)


def test_a_group_profile_is_visible_to_members_and_admins_only() -> None:
    profile = one("    groups: [training, gpu-users]\n")
    assert profile.visible_to(["students", "training"], is_admin=False)
    assert profile.visible_to(iter(["gpu-users"]), is_admin=False)  # any iterable, read once
    assert not profile.visible_to(["students"], is_admin=False)
    assert not profile.visible_to([], is_admin=False)
    assert profile.visible_to([], is_admin=True)


def test_a_single_group_may_be_written_without_a_list() -> None:
    assert one("    groups: training\n").groups == {"training"}


# ---- finding a profile by slug -------------------------------------------------------------------------


def test_find_profile_returns_the_profile_with_that_slug() -> None:
    profiles = load_profiles(EXAMPLE_PROFILES)
    assert find_profile(profiles, "mig-3g").display_name == "Half an H100 (MIG 3g.40gb)"


def test_an_unknown_slug_lists_the_valid_ones() -> None:
    profiles = parse(
        "profiles:\n"
        + "".join(
            f"  - {{slug: {slug}, display_name: {slug}, cpu: 1, memory: 1GiB}}\n"
            for slug in ("mig-3g", "cpu", "h100-whole")
        )
    )
    with pytest.raises(UnknownProfile) as caught:
        find_profile(profiles, "h200")
    assert str(caught.value) == "unknown profile 'h200'; choose one of cpu, h100-whole, mig-3g"
    with pytest.raises(UnknownProfile, match="no profiles are configured"):
        find_profile((), "cpu")
    with pytest.raises(UnknownProfile, match=r"choose one of cpu$"):
        find_profile(profiles, "h200", offered=[profiles[1]])  # what the caller may use, no more
    with pytest.raises(UnknownProfile, match=r"none \(no profile is open to you\)"):
        find_profile(profiles, "h200", offered=[])


# ---- durations -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "seconds"),
    [("90s", 90), ("30m", 1800), ("8h", 28800), ("2d", 172800), ("1h30m", 5400), (" 1h 30m ", 5400),
     ("1d12h", 129600), (3600, 3600), ("3600", 3600), ("1.5h", 5400), ("0.5d", 43200), ("2.5m", 150)],
)  # fmt: skip
def test_durations_are_written_with_units_or_as_seconds(written: object, seconds: int) -> None:
    value = repr(written) if isinstance(written, str) else written
    profile = one(f"    idle_timeout: {value}\n    max_lifetime: {value}\n    gpus: {{count: 1}}\n"
                  f"    gpu_idle_timeout: {value}\n    queue_wait: {value}\n")  # fmt: skip
    assert profile.idle_timeout == profile.max_lifetime == profile.gpu_idle_timeout == seconds
    assert profile.queue_wait == seconds


def test_durations_left_out_are_none() -> None:
    profile = one("")
    assert (profile.idle_timeout, profile.max_lifetime, profile.gpu_idle_timeout) == (None, None, None)
    assert profile.queue_wait is None


@pytest.mark.parametrize("written", ["'30 minutes'", "1.5", "1.5s", "-5", "true", "'h'", "'30m1h'", "''"])
def test_a_duration_that_is_not_one_says_how_to_write_it(written: str) -> None:
    assert problem(PROFILE + f"    max_lifetime: {written}\n").startswith(
        "profiles.yaml: profile p: max_lifetime must be a duration such as 30m, 8h or 2d, "
        "or a whole number of seconds, got "
    )


def test_a_zero_duration_is_refused() -> None:
    assert problem(PROFILE + "    idle_timeout: 0s\n") == (
        "profiles.yaml: profile p: idle_timeout must be at least 1 second, got 0"
    )


# ---- mistakes, each named ------------------------------------------------------------------------------

ERRORS = [
    ("", "profiles.yaml: expected a mapping with a 'profiles' list at the top, got nothing"),
    ("profiles: []\n", "profiles.yaml: 'profiles' must be a non-empty list of profiles, got an empty list"),
    (PROFILE + "profile: 1\n",
     "profiles.yaml: unknown field 'profile' at the top (did you mean 'profiles'?); allowed fields are profiles"),
    ("profiles: [cpu]\n",
     "profiles.yaml: profile 1: expected a mapping with slug, display_name, cpu and memory, got str 'cpu'"),
    ("profiles:\n  - {display_name: P, cpu: 1, memory: 1GiB}\n",
     "profiles.yaml: profile 1: missing required field 'slug'"),
    ("profiles:\n  - {slug: H100 Whole, display_name: P, cpu: 1, memory: 1GiB}\n",
     "profiles.yaml: profile 1: slug must be a lowercase DNS label such as mig-3g (a-z, 0-9 and '-', "
     "at most 63), got 'H100 Whole'"),
    ("profiles:\n  - {slug: 7, display_name: P, cpu: 1, memory: 1GiB}\n",
     "profiles.yaml: profile 1: slug must be a lowercase DNS label such as mig-3g (a-z, 0-9 and '-', "
     "at most 63), got 7"),
    (PROFILE + "    dispaly_name: Q\n",
     "profiles.yaml: profile p: unknown field 'dispaly_name' (did you mean 'display_name'?); allowed fields "
     "are slug, display_name, description, gpus, mig, share, cpu, memory, groups, idle_timeout, "
     "max_lifetime, gpu_idle_timeout, queue_wait, default, environments"),
    (PROFILE + "    gpus: {cout: 1}\n",
     "profiles.yaml: profile p: unknown field 'cout' in gpus (did you mean 'count'?); allowed fields are "
     "count, products, min_memory_gb, min_cuda, min_compute_capability"),
    ("profiles:\n  - {slug: p, cpu: 1, memory: 1GiB}\n",
     "profiles.yaml: profile p: missing required field 'display_name'"),
    ("profiles:\n  - {slug: p, display_name: '  ', cpu: 1, memory: 1GiB}\n",
     "profiles.yaml: profile p: display_name must be non-empty text, got str '  '"),
    ("profiles:\n  - {slug: p, display_name: P, memory: 1GiB}\n",
     "profiles.yaml: profile p: missing required field 'cpu'"),
    (PROFILE + "    cpu: lots\n", "profiles.yaml: profile p: cpu must be a positive number such as 8 or 0.5, got 'lots'"),
    (PROFILE + "    cpu: .nan\n", "profiles.yaml: profile p: cpu must be a positive number such as 8 or 0.5, got nan"),
    (PROFILE + "    memory: 16GB\n", "profiles.yaml: profile p: memory must be like 16GiB or an integer of MiB, got '16GB'"),
    (PROFILE + "    description: [a]\n", "profiles.yaml: profile p: description must be non-empty text, got a list"),
    (PROFILE + "    default: yes please\n", "profiles.yaml: profile p: default must be true or false, got 'yes please'"),
    (PROFILE + "    groups: {a: 1}\n",
     "profiles.yaml: profile p: groups must be a name or a list of names such as [gpu-users], got {'a': 1}"),
    (PROFILE + "    gpus: {count: 1}\n    mig: {profile: 1g.10gb}\n",
     "profiles.yaml: profile p: a profile asks for at most one of gpus, mig and share; this one has gpus and mig"),
    (PROFILE + "    gpus: one\n", "profiles.yaml: profile p: gpus must be a mapping such as {count: 1}, got str 'one'"),
    (PROFILE + "    gpus: {products: [H100]}\n", "profiles.yaml: profile p: missing required field 'gpus.count'"),
    (PROFILE + "    gpus: {count: 0}\n", "profiles.yaml: profile p: gpus.count must be a whole number of at least 1, got 0"),
    (PROFILE + "    gpus: {count: 1, products: ['']}\n",
     "profiles.yaml: profile p: gpus.products must be a name or a list of names such as [H100-80GB], got ['']"),
    (PROFILE + "    gpus: {count: 1, min_memory_gb: -1}\n",
     "profiles.yaml: profile p: gpus.min_memory_gb must be zero or more such as 40, got -1"),
    (PROFILE + "    mig: {}\n", "profiles.yaml: profile p: mig needs exactly one of mig.profile or mig.min_memory_gb"),
    (PROFILE + "    mig: {profile: 1g.10gb, min_memory_gb: 10}\n",
     "profiles.yaml: profile p: mig needs exactly one of mig.profile or mig.min_memory_gb"),
    (PROFILE + "    mig: {profile: 3g.41gb}\n",
     "profiles.yaml: profile p: mig.profile '3g.41gb' is not a MIG profile of any product; 3g profiles are "
     "3g.20gb, 3g.40gb, 3g.47gb, 3g.48gb, 3g.71gb, 3g.90gb"),
    (PROFILE + "    mig: {profile: 9g.1gb}\n",
     "profiles.yaml: profile p: mig.profile '9g.1gb' is not a MIG profile of any product; names look like "
     "1g.10gb or 3g.40gb"),
    (PROFILE + "    mig: {profile: 3g.20gb, products: [NVIDIA H100 80GB HBM3]}\n",
     "profiles.yaml: profile p: mig.profile: H100-80GB has no MIG profile '3g.20gb'; its profiles are "
     "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
    (PROFILE + "    mig: {profile: 1g.10gb, products: [L4]}\n",
     "profiles.yaml: profile p: mig.products: L4-24GB does not support MIG; MIG-capable products are "
     "A100-40GB, A100-80GB, H100-80GB, H100-NVL-94GB, GH200-96GB, H200-141GB, B200-180GB, A30-24GB"),
    (PROFILE + "    mig: {min_memory_gb: 50, products: [A100-40GB]}\n",
     "profiles.yaml: profile p: mig.min_memory_gb: no MIG profile of A100-40GB has 50 GB; its largest has 40 GB"),
    (PROFILE + "    mig: {min_memory_gb: 500}\n",
     "profiles.yaml: profile p: mig.min_memory_gb: no MIG profile of any product has 500 GB; the largest has 180 GB"),
    (PROFILE + "    mig: {profile: 5}\n",
     "profiles.yaml: profile p: mig.profile must be a MIG profile name such as 3g.40gb, got 5"),
    (PROFILE + "    share: {memory_gb: 6}\n",
     "profiles.yaml: profile p: share needs exactly one of share.fraction (such as 0.25) or share.milli (such as 250)"),
    (PROFILE + "    share: {fraction: 0.25, milli: 250}\n",
     "profiles.yaml: profile p: share needs exactly one of share.fraction (such as 0.25) or share.milli (such as 250)"),
    (PROFILE + "    share: {fraction: 1}\n",
     "profiles.yaml: profile p: share.fraction must be between 0.001 and 0.999 (a whole GPU is gpus), got 1"),
    (PROFILE + "    share: {milli: 1000}\n",
     "profiles.yaml: profile p: share.milli must be between 1 and 999 (a whole GPU is gpus.count), got 1000"),
    (PROFILE + "    share: {fraction: 0.5, memory_gb: 0}\n",
     "profiles.yaml: profile p: share.memory_gb must be a positive number such as 6, got 0"),
    (PROFILE + "    gpu_idle_timeout: 30m\n",
     "profiles.yaml: profile p: gpu_idle_timeout needs a GPU and this profile asks for none; add gpus, mig or "
     "share, or drop it"),
    (PROFILE + "  - {slug: q, display_name: Q, cpu: 1, memory: 1GiB}\n  - {slug: p, display_name: P2, cpu: 1, memory: 1GiB}\n",
     "profiles.yaml: profile p: slug is used by profiles 1 and 3; slugs must be unique"),
    (PROFILE + "    default: true\n  - {slug: q, display_name: Q, cpu: 1, memory: 1GiB, default: true}\n",
     "profiles.yaml: profiles p and q are each marked default: true; at most one may be"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), ERRORS)
def test_every_mistake_names_the_file_the_profile_and_the_field(text: str, message: str) -> None:
    assert problem(text) == message


def test_a_mistake_in_the_last_profile_loads_nothing() -> None:
    good = "".join(f"  - {{slug: p{i}, display_name: P, cpu: 1, memory: 1GiB}}\n" for i in range(5))
    bad = "  - {slug: last, display_name: P, cpu: 1, memory: 1GiB, gpus: {count: 0}}\n"
    assert problem("profiles:\n" + good + bad).startswith("profiles.yaml: profile last: gpus.count")


def test_a_profile_built_in_code_checks_the_same_invariants() -> None:
    with pytest.raises(ProfileError, match="slug must be a lowercase DNS label"):
        Profile("Bad Slug", "Bad", 1000, 1024)
    with pytest.raises(ProfileError, match=r"'9g\.1gb' is not a MIG profile of any product"):
        Profile("mig", "MIG", 1000, 1024, gpu=MigSlice("9g.1gb"))
    with pytest.raises(ProfileError, match="memory must be at least 1 MiB"):
        Profile("p", "P", 1000, 0)
    assert Profile("p", "P", 1000, 1024, gpu=WholeGpus(1)).request() == Request(1000, 1024, WholeGpus(1))


def test_a_file_problem_names_the_file_and_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ProfileError, match=r"missing.yaml: cannot read the profiles file: No such file"):
        load_profiles(missing)
    twice = tmp_path / "twice.yaml"
    twice.write_text(PROFILE + "    cpu: 4\n")
    with pytest.raises(ProfileError) as caught:
        load_profiles(twice)
    assert str(caught.value) == f"{twice}: line 6, column 5: invalid YAML: duplicate key 'cpu'"
    broken = tmp_path / "broken.yaml"
    broken.write_text("profiles: [\n")
    with pytest.raises(ProfileError, match=r"broken.yaml: line 2, column 1: invalid YAML"):
        load_profiles(broken)


# ---- profiles the pool can never serve -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ("    gpus: {count: 8, products: [H100-80GB]}\n", "this pool has at most 6 H100-80GB on one node; 8 were asked for"),
        ("    gpus: {count: 1, products: [B200]}\n", "this pool has no B200-180GB to give whole; it has A100-40GB, H100-80GB, L4-24GB"),
        ("    mig: {profile: 7g.80gb}\n", "this pool has no 7g.80gb slice; its MIG slices are 1g.10gb, 2g.20gb, 3g.40gb"),
        ("    cpu: 200\n", "no node in this pool has 200 CPUs (at most 112)"),
        ("    memory: 4096GiB\n", "no node in this pool has 4096 GiB of memory (at most 2048)"),
        ("    share: {fraction: 0.5, memory_gb: 48, products: [L4]}\n", "a share with 48 GiB is more than any L4-24GB here has (24 GiB at most)"),
    ],
)  # fmt: skip
def test_a_profile_that_can_never_fit_the_demo_pool_says_why(extra: str, why: str) -> None:
    assert fits_pool(one(extra), DEMO_NODES) == why


def test_a_whole_gpu_profile_on_a_pool_whose_gpus_of_that_model_are_all_in_mig_mode_says_so() -> None:
    """A trial read "no H100-80GB to give whole; it has A100-80GB, H100-80GB, L4-24GB" of its MIG-mode H100."""
    dgx = DEMO_NODES[0]
    in_mig = dataclasses.replace(dgx, gpus=tuple(g for g in dgx.gpus if g.mode is GpuMode.MIG))
    assert fits_pool(one("    gpus: {count: 1, products: [H100-80GB]}\n"), (in_mig, *DEMO_NODES[1:])) == (
        "this pool has no H100-80GB to give whole; it has A100-40GB, L4-24GB; "
        "its H100-80GB are in MIG mode, slices only"
    )


def test_a_profile_fits_a_pool_that_is_only_busy_or_unhealthy_now() -> None:
    sick = tuple(dataclasses.replace(node, health=Health.UNHEALTHY) for node in DEMO_NODES)
    assert fits_pool(one("    gpus: {count: 4, products: [H100-80GB]}\n"), sick) is None
    empty: tuple[Node, ...] = ()
    assert fits_pool(one(""), empty) == "the pool has no nodes"


# ---- damaged files -------------------------------------------------------------------------------------

SHIPPED = yaml.safe_load(EXAMPLE_PROFILES.read_text())
values = yaml_values(
    ["3g.40gb", "9g.1gb", "H100", "L4", "8h", "1h30m", "0s", "16GiB", "training", "h100"],
    ["count", "products", "profile", "min_memory_gb", "fraction", "milli", "slug", 1],
    largest=10**15,
)


@st.composite
def damaged_profiles(draw: st.DrawFn) -> object:
    """The shipped profiles with one field somewhere replaced by something random."""
    data = yaml.safe_load(EXAMPLE_PROFILES.read_text())
    profile = draw(st.sampled_from(data["profiles"]))
    target: dict[object, object] = profile
    nested = [key for key in ("gpus", "mig", "share") if key in profile]
    if draw(st.booleans()) and nested:
        target = profile[nested[0]]
    key = draw(st.sampled_from([*target.keys(), "extra", "mig", "share", "gpus", "default"]))
    target[key] = draw(values)
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_profiles())
def test_a_damaged_profiles_file_loads_whole_or_raises_a_profile_error(data: object) -> None:
    try:
        profiles = parse_profiles(data, "profiles.yaml")
    except ProfileError as error:
        assert str(error).startswith("profiles.yaml: ")
        return
    assert len(profiles) == len(SHIPPED["profiles"])
    for profile in profiles:  # whatever loads can be described and checked against a pool
        assert profile.gpu_description()
        why = fits_pool(profile, DEMO_NODES)
        assert why is None or why


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_bytes_are_a_profile_error(tmp_path_factory: pytest.TempPathFactory, content: bytes) -> None:
    path = tmp_path_factory.mktemp("profiles") / "profiles.yaml"
    path.write_bytes(content)
    try:
        profiles = load_profiles(path)
    except ProfileError as error:
        assert str(error).startswith(f"{path}: ")
    else:
        assert profiles, "a file that loads must hold profiles"


def test_min_memory_in_marketed_gb_accepts_the_gpu_that_name_promises() -> None:
    # NVML reports an "80GB" H100 as 81,559 MiB: less than 80 × 1024, more than 80 decimal GB.
    from gpupool.spawner.pool.devices import Gpu, Node

    h100 = Gpu(uuid="GPU-real", index=0, product="H100-80GB", memory_mib=81_559)
    pool = PoolState([Node("real", 64_000, 512 * 1024, (h100,))])
    profile = one("    gpus: {count: 1, min_memory_gb: 80}\n")
    assert isinstance(pool.place(profile.request(), "alice"), Allocation)


def test_a_profiles_file_broken_by_an_edit_keeps_the_profiles_last_read_and_says_why_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lab trial saved a typo (``memroy:``) in the profiles file of a running hub: every user without a server
    got a bare 500 at login, as the spawn form read the file again."""
    path = tmp_path / "profiles.yaml"
    path.write_text("profiles:\n  - {slug: cpu, display_name: CPU, cpu: 1, memory: 1GiB}\n")
    assert [p.slug for p in read_profiles(str(path))] == ["cpu"]
    path.write_text("profiles:\n  - {slug: cpu, display_name: CPU, cpu: 1, memroy: 1GiB}\n")
    os.utime(path, ns=(time.time_ns() + 10**9,) * 2)  # a later save, whatever the file system's clock
    with caplog.at_level(logging.ERROR, logger="gpupool.spawner.files.profiles_file"):
        for _ in range(3):
            assert [p.slug for p in read_profiles(str(path))] == ["cpu"]
    (said,) = [r.getMessage() for r in caplog.records]
    assert "unknown field 'memroy' (did you mean 'memory'?)" in said and "as last read" in said
    fresh = tmp_path / "never-read-well.yaml"
    fresh.write_text(path.read_text())
    with pytest.raises(ProfileError, match="memroy"):  # nothing read well before: the error itself
        read_profiles(str(fresh))
