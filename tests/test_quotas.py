"""Quotas per user and per group: what a user may hold at once, and the refusal they read when over it."""

from __future__ import annotations

import builders
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.spawner.pool.devices import Gpu, Node
from gpupool.spawner.pool.quotas import (
    InvalidQuota,
    Limit,
    Quota,
    QuotaExceeded,
    QuotaPolicy,
    default_policy,
    describe_quota,
    group_limits_above_user,
    standing_in_words,
    usage,
)
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus

CPU_MEM = {"cpu_milli": 2000, "memory_mib": 8192}


def whole(count: int = 1) -> Request:
    return Request(**CPU_MEM, gpu=WholeGpus(count))


def mig(profile: str = "1g.10gb") -> Request:
    return Request(**CPU_MEM, gpu=MigSlice(profile))


def share(milli: int = 250) -> Request:
    return Request(**CPU_MEM, gpu=GpuShare(milli))


CPU_ONLY = Request(**CPU_MEM)
HOUSE = QuotaPolicy(per_user=Quota(whole_gpus=2, mig_slices=4))


def test_a_user_under_every_limit_is_let_through() -> None:
    assert HOUSE.check("alice", [], whole(1), [whole(1), mig()]) is None


def test_a_user_over_the_whole_gpu_quota_is_told_which_limit_and_the_numbers() -> None:
    refusal = HOUSE.check("alice", [], whole(1), [whole(2)])
    assert isinstance(refusal, QuotaExceeded)
    assert (
        str(refusal)
        == "alice's quota allows 2 whole GPUs at once; 2 are held or queued and 1 more was asked for"
    )
    assert refusal.limit == Limit("whole_gpus", "user", "alice", 2)
    assert (refusal.held, refusal.asked) == (2, 1)


def test_a_user_over_the_mig_quota_is_told_which_limit() -> None:
    refusal = HOUSE.check("alice", [], mig(), [mig(), mig("3g.40gb"), mig(), mig()])
    assert (
        str(refusal)
        == "alice's quota allows 4 MIG slices at once; 4 are held or queued and 1 more was asked for"
    )


def test_one_request_bigger_than_the_limit_is_refused_with_nothing_held() -> None:
    refusal = HOUSE.check("alice", [], whole(3), [])
    assert (
        str(refusal)
        == "alice's quota allows 2 whole GPUs at once; 0 are held or queued and 3 more were asked for"
    )


def test_a_zero_limit_reads_as_none_allowed() -> None:
    policy = QuotaPolicy(per_user=Quota(whole_gpus=0))
    assert str(policy.check("bob", [], whole(1), [])).startswith("bob's quota allows no whole GPUs at once")


def test_servers_and_jobs_count_together_whatever_held_them() -> None:
    server, job = whole(1), whole(1)  # the caller passes every held request, servers and jobs alike
    assert isinstance(HOUSE.check("alice", [], whole(1), [server, job]), QuotaExceeded)


def test_a_group_limit_names_the_group_and_applies_to_each_member() -> None:
    policy = QuotaPolicy(per_group={"students": Quota(mig_slices=4)})
    refusal = policy.check("carol", ["students"], mig(), [mig()] * 4)
    assert str(refusal) == (
        "members of group students may each hold 4 MIG slices at once; 4 are held or queued and 1 more was asked for"
    )
    assert policy.check("dave", ["students"], mig(), [mig()] * 3) is None


def test_in_several_groups_the_most_generous_group_limit_applies() -> None:
    policy = QuotaPolicy(per_group={"students": Quota(whole_gpus=1), "lab": Quota(whole_gpus=4)})
    assert policy.check("erin", ["students", "lab"], whole(1), [whole(2)]) is None
    refusal = policy.check("erin", ["students", "lab"], whole(1), [whole(4)])
    assert refusal is not None and refusal.limit == Limit("whole_gpus", "group", "lab", 4)


def test_a_group_that_leaves_a_resource_unlimited_lifts_the_group_limit_on_it() -> None:
    policy = QuotaPolicy(per_group={"students": Quota(mig_slices=2), "staff": Quota(whole_gpus=8)})
    assert policy.check("fay", ["students", "staff"], mig(), [mig()] * 5) is None
    assert policy.check("gil", ["students"], mig(), [mig()] * 2) is not None


def test_groups_without_a_quota_are_ignored() -> None:
    policy = QuotaPolicy(per_group={"students": Quota(mig_slices=1)})
    assert policy.check("hal", ["students", "jupyterhub-users"], mig(), [mig()]) is not None


def test_the_per_user_limit_applies_even_when_a_group_allows_more() -> None:
    policy = QuotaPolicy(per_user=Quota(whole_gpus=1), per_group={"lab": Quota(whole_gpus=8)})
    refusal = policy.check("ivy", ["lab"], whole(1), [whole(1)])
    assert refusal is not None and refusal.limit.scope == "user"


def test_when_several_limits_break_the_tightest_is_named() -> None:
    policy = QuotaPolicy(per_user=Quota(whole_gpus=3), per_group={"students": Quota(whole_gpus=1)})
    refusal = policy.check("jo", ["students"], whole(1), [whole(1)])
    assert refusal is not None and refusal.limit == Limit("whole_gpus", "group", "students", 1)


def test_a_user_override_replaces_the_default_quota() -> None:
    policy = QuotaPolicy(per_user=Quota(whole_gpus=1), user_overrides={"kim": Quota(whole_gpus=4)})
    assert policy.check("kim", [], whole(2), [whole(1)]) is None
    assert policy.check("lee", [], whole(1), [whole(1)]) is not None


def test_gpu_milli_bounds_whole_gpus_and_shares_together() -> None:
    policy = QuotaPolicy(per_user=Quota(gpu_milli=1500))
    assert policy.check("max", [], share(500), [whole(1)]) is None
    refusal = policy.check("max", [], share(750), [whole(1)])
    assert str(refusal) == (
        "max's quota allows 1.5 GPUs of whole GPUs and shares at once; 1 is held or queued and 0.75 more were asked for"
    )


def test_a_share_count_limit_counts_shares_not_their_size() -> None:
    policy = QuotaPolicy(per_user=Quota(gpu_shares=1))
    assert str(policy.check("ned", [], share(100), [share(100)])).startswith(
        "ned's quota allows 1 GPU share at once; 1 is held or queued and 1 more was asked for"
    )


def test_a_request_without_the_limited_resource_is_never_refused_for_it() -> None:
    tightened = QuotaPolicy(per_user=Quota(whole_gpus=0, mig_slices=0))
    assert tightened.check("ola", [], CPU_ONLY, [whole(2), mig()]) is None
    assert tightened.check("ola", [], share(), [whole(2)]) is None


def test_a_negative_limit_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidQuota, match="mig_slices"):
        Quota(mig_slices=-1)


def test_usage_adds_up_each_resource() -> None:
    held = [whole(2), mig(), share(300), CPU_ONLY]
    assert usage(held) == {
        "whole_gpus": 2,
        "mig_slices": 1,
        "gpu_shares": 1,
        "gpu_milli": 2300,
        "cpu_milli": 8000,
        "memory_mib": 32768,
    }


def test_cpu_only_leases_count_against_the_cpu_and_memory_quota() -> None:
    # one user's CPU-only leases once filled the pool: nothing limited them
    cpus = QuotaPolicy(per_user=Quota(cpu_milli=4000))
    assert cpus.check("eve", [], CPU_ONLY, [CPU_ONLY]) is None
    refusal = cpus.check("eve", [], CPU_ONLY, [CPU_ONLY, CPU_ONLY])
    assert str(refusal) == "eve's quota allows 4 CPUs at once; 4 are held or queued and 2 more were asked for"
    memory = QuotaPolicy(per_user=Quota(memory_mib=12288))
    refusal = memory.check("eve", [], whole(1), [CPU_ONLY])
    assert (
        str(refusal)
        == "eve's quota allows 12 GiB of memory at once; 8 are held or queued and 8 more were asked for"
    )


NODES = [
    Node(
        "big",
        cpu_milli=64000,
        memory_mib=512 * 1024,
        gpus=tuple(Gpu(f"G{i}", i, "H100-80GB", 81559) for i in range(4)),
    ),
    Node("small", cpu_milli=16000, memory_mib=128 * 1024),
]


def test_without_a_quotas_file_each_user_may_hold_half_the_pool() -> None:
    policy = default_policy(NODES, [CPU_ONLY, whole(1)])
    assert policy.per_user == Quota(gpu_milli=2000, cpu_milli=40000, memory_mib=320 * 1024)
    assert describe_quota(policy.per_user) == "2 GPUs of whole GPUs and shares, 40 CPUs, 320 GiB of memory"
    refusal = policy.check("eve", [], CPU_ONLY, [CPU_ONLY] * 20)
    assert (
        str(refusal) == "eve's quota allows 40 CPUs at once; 40 are held or queued and 2 more were asked for"
    )


def test_without_a_quotas_file_one_user_cannot_take_every_mig_slice() -> None:
    """A trial found the default quota left MIG slices out: one user could hold all of them."""
    sliced = builders.node(
        "a100", [builders.gpu("a100", 0, "A100-80GB", layout=[f"1g.10gb@{i}" for i in range(7)])]
    )
    policy = default_policy([*NODES, sliced], [CPU_ONLY, mig()])
    assert policy.per_user.mig_slices == 4  # half of 7, rounded up
    assert "4 MIG slices" in describe_quota(policy.per_user)
    refusal = policy.check("eve", [], mig(), [mig()] * 4)
    assert str(refusal).startswith("eve's quota allows 4 MIG slices at once")
    assert default_policy(NODES, [CPU_ONLY]).per_user.mig_slices is None  # no MIG here: nothing to limit


def test_the_default_quota_still_lets_the_largest_profile_start() -> None:
    everything = Request(cpu_milli=64000, memory_mib=512 * 1024, gpu=WholeGpus(4))
    policy = default_policy(NODES, [CPU_ONLY, everything])
    assert policy.per_user == Quota(gpu_milli=4000, cpu_milli=64000, memory_mib=512 * 1024)
    assert policy.check("eve", [], everything, []) is None


requests = st.one_of(
    st.just(CPU_ONLY),
    st.integers(1, 4).map(whole),
    st.sampled_from(["1g.10gb", "3g.40gb"]).map(mig),
    st.integers(1, 999).map(share),
)
limits = st.none() | st.integers(0, 6)
quotas = st.builds(
    Quota,
    whole_gpus=limits,
    mig_slices=limits,
    gpu_shares=limits,
    gpu_milli=limits.map(lambda v: None if v is None else v * 500),
    cpu_milli=limits.map(lambda v: None if v is None else v * 2000),
    memory_mib=limits.map(lambda v: None if v is None else v * 8192),
)


@given(
    per_user=quotas,
    per_group=st.dictionaries(st.sampled_from(["a", "b", "c"]), quotas, max_size=3),
    groups=st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=4),
    held=st.lists(requests, max_size=6),
    asked=requests,
)
def test_a_passed_check_never_lets_held_plus_asked_exceed_a_limit(
    per_user: Quota,
    per_group: dict[str, Quota],
    groups: list[str],
    held: list[Request],
    asked: Request,
) -> None:
    policy = QuotaPolicy(per_user=per_user, per_group=per_group)
    refusal = policy.check("u", groups, asked, held)
    before, after = usage(held), usage([*held, asked])
    configured = [per_group[g] for g in set(groups) if g in per_group]
    broken = set()
    for name in before:
        if after[name] == before[name]:
            continue  # asks for none of it: never refused for it
        group_values = [getattr(q, name) for q in configured]
        group_limit = max(group_values) if group_values and None not in group_values else None
        if any(lim is not None and after[name] > lim for lim in (getattr(per_user, name), group_limit)):
            broken.add(name)
    if refusal is None:
        assert not broken
    else:
        assert refusal.limit.resource in broken
        assert refusal.held == before[refusal.limit.resource]
        assert refusal.held + refusal.asked > refusal.limit.value


def test_the_summary_names_the_limit_that_binds_once_per_resource_and_whose_it_is() -> None:
    """A course's trial: "Your quota: 1 whole GPU, 0 held · 0 whole GPUs, 0 held · …" listed the user's and the
    group's limit of each resource side by side, unlabelled, and looked self-contradictory."""
    policy = QuotaPolicy(
        per_user=Quota(whole_gpus=1, mig_slices=1, gpu_shares=2),
        per_group={"students": Quota(whole_gpus=0, mig_slices=4, gpu_shares=0)},
    )
    limits = policy.limits_for("stu1", ["students"])
    held = usage([Request(1000, 1024, MigSlice("1g.10gb"))])
    assert standing_in_words(limits, held) == (
        "Your quota: no whole GPUs (group students) · 1 MIG slice, 1 held or queued · no GPU shares (group students)"
    )
    assert standing_in_words(policy.limits_for("ta1", []), held) == (
        "Your quota: 1 whole GPU, 0 held or queued · 1 MIG slice, 1 held or queued · 2 GPU shares, 0 held or queued"
    )


def test_a_group_limit_above_the_per_user_limit_is_named_since_it_cannot_lift_it() -> None:
    """A course's trial gave TAs ``whole_gpus: 1`` under ``per_user: whole_gpus: 0``; the TA was still
    refused, since both apply, and nothing had said so."""
    policy = QuotaPolicy(
        per_user=Quota(whole_gpus=0, mig_slices=1),
        per_group={"tas": Quota(whole_gpus=1, mig_slices=1), "students": Quota(whole_gpus=0)},
    )
    (said,) = group_limits_above_user(policy)
    assert said.startswith("per_group.tas.whole_gpus is 1, above per_user.whole_gpus (0): both apply"), said
    assert "raise per_user.whole_gpus" in said
    assert (
        group_limits_above_user(QuotaPolicy(per_user=Quota(), per_group={"tas": Quota(whole_gpus=4)})) == []
    )
