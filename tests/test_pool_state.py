"""Placing and releasing through the pool: what a user or admin would notice."""

from __future__ import annotations

import re

import pytest
from builders import gpu, node

from gpupool.spawner.backends.simulated import DEMO_POOL, load_pool_file
from gpupool.spawner.pool.devices import GpuMode, Health
from gpupool.spawner.pool.policies import POLICIES, UnknownPolicy, policy_by_name
from gpupool.spawner.pool.requests import GpuShare, InvalidRequest, MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import Allocation, AlreadyHolding, PoolState, Refusal

CPU_MEM = {"cpu_milli": 4000, "memory_mib": 16384}


def h100_node(name: str = "dgx") -> object:
    gpus = [gpu(name, i, nvlink=0 if i < 4 else 1) for i in range(6)]
    gpus.append(gpu(name, 6, layout=["3g.40gb@0", "3g.40gb@4"]))
    gpus.append(gpu(name, 7, layout=["2g.20gb@0", "2g.20gb@2", "2g.20gb@4", "1g.10gb@6"]))
    return node(name, gpus, cpu=112, memory_gib=2048)


def l4_node(name: str = "l4") -> object:
    return node(name, [gpu(name, i, "L4-24GB", mode=GpuMode.SHARED, max_shares=4) for i in range(2)], cpu=32)


def place(state: PoolState, request: Request, owner: str) -> Allocation:
    outcome = state.place(request, owner)
    assert isinstance(outcome, Allocation), outcome
    return outcome


def test_two_users_never_share_a_mig_slice() -> None:
    state = PoolState([h100_node()])
    request = Request(gpu=MigSlice("3g.40gb"), **CPU_MEM)
    alice = place(state, request, "alice")
    bob = place(state, request, "bob")
    assert alice.visible_devices != bob.visible_devices
    assert {alice.visible_devices, bob.visible_devices} == {"MIG-dgx-6-0", "MIG-dgx-6-4"}
    refusal = state.place(request, "carol")
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "no 3g.40gb slice is free now (2 of 2 in use)"
    assert not refusal.never_fits


def test_released_devices_serve_the_next_user() -> None:
    state = PoolState([h100_node()])
    request = Request(gpu=MigSlice("3g.40gb"), **CPU_MEM)
    place(state, request, "alice")
    place(state, request, "bob")
    released = state.release("alice")
    assert released is not None
    carol = place(state, request, "carol")
    assert carol.visible_devices == released.visible_devices
    assert state.release("nobody") is None


def test_mig_by_memory_takes_the_smallest_slice_that_is_enough() -> None:
    state = PoolState([h100_node()])
    allocation = place(state, Request(gpu=MigSlice(min_memory_gb=15), **CPU_MEM), "alice")
    assert allocation.grants[0].label == "2g.20gb on H100-80GB #7"


def test_two_gpus_come_from_one_nvlink_group() -> None:
    state = PoolState([h100_node()])
    place(state, Request(gpu=WholeGpus(3), **CPU_MEM), "alice")
    bob = place(state, Request(gpu=WholeGpus(2), **CPU_MEM), "bob")
    groups = {g.uuid: g.nvlink_group for g in state.node("dgx").gpus}
    assert len({groups[grant.uuid] for grant in bob.grants}) == 1


def test_whole_gpu_request_is_pinned_to_gpu_uuids() -> None:
    state = PoolState([h100_node()])
    allocation = place(state, Request(gpu=WholeGpus(2), **CPU_MEM), "alice")
    assert allocation.visible_devices.count("GPU-") == 2
    assert all(g.kind == "gpu" for g in allocation.grants)


def test_shares_never_exceed_a_whole_gpu() -> None:
    state = PoolState([l4_node()])
    for owner in ("a", "b", "c"):
        place(state, Request(gpu=GpuShare(300), **CPU_MEM), owner)
    fourth = place(state, Request(gpu=GpuShare(300), **CPU_MEM), "d")
    assert fourth.grants[0].label.endswith("L4-24GB #1"), (
        "three 30% shares fill GPU 0; the fourth needs GPU 1"
    )
    used = [g for a in state.allocations.values() for g in a.grants]
    per_gpu: dict[str, int] = {}
    for grant in used:
        per_gpu[grant.gpu_uuid] = per_gpu.get(grant.gpu_uuid, 0) + grant.milli
    assert max(per_gpu.values()) <= 1000
    assert state.check_invariants() == []


def test_a_shared_gpu_with_holders_is_not_given_whole() -> None:
    state = PoolState([l4_node()])
    place(state, Request(gpu=GpuShare(250), **CPU_MEM), "a")
    whole = place(state, Request(gpu=WholeGpus(1), **CPU_MEM), "b")
    share_gpu = state.allocation("a").grants[0].gpu_uuid  # type: ignore[union-attr]
    assert whole.grants[0].uuid != share_gpu
    refusal = state.place(Request(gpu=WholeGpus(1), **CPU_MEM), "c")
    assert isinstance(refusal, Refusal)


def test_max_shares_limits_holders_per_gpu() -> None:
    state = PoolState([node("l4", [gpu("l4", 0, "L4-24GB", mode=GpuMode.SHARED, max_shares=2)])])
    place(state, Request(gpu=GpuShare(100), **CPU_MEM), "a")
    place(state, Request(gpu=GpuShare(100), **CPU_MEM), "b")
    assert isinstance(state.place(Request(gpu=GpuShare(100), **CPU_MEM), "c"), Refusal)


def test_unhealthy_gpu_and_drained_node_are_never_chosen() -> None:
    state = PoolState([h100_node("a"), h100_node("b")])
    state.set_health("a", Health.DRAINED)
    state.set_health("b", Health.UNHEALTHY, gpu_index=0)
    chosen = {place(state, Request(gpu=WholeGpus(1), **CPU_MEM), f"u{i}").grants[0].uuid for i in range(5)}
    assert all(uuid.startswith("GPU-b-") for uuid in chosen)
    assert "GPU-b-0" not in chosen
    refusal = state.place(Request(gpu=WholeGpus(1), **CPU_MEM), "late")
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "no GPU is free now (5 of 12 in use, 6 on drained nodes, 1 unhealthy)"


def test_a_failed_node_keeps_its_holders_until_they_are_released() -> None:
    state = PoolState([h100_node("a")])
    place(state, Request(gpu=WholeGpus(1), **CPU_MEM), "alice")
    state.set_health("a", Health.UNHEALTHY)
    assert state.allocation("alice") is not None
    assert state.check_invariants() == []
    state.set_health("a", Health.HEALTHY)
    assert isinstance(state.place(Request(gpu=WholeGpus(1), **CPU_MEM), "bob"), Allocation)


def test_request_that_can_never_fit_says_so() -> None:
    state = PoolState([h100_node()])
    refusal = state.place(Request(gpu=WholeGpus(8, frozenset({"H100-80GB"})), **CPU_MEM), "alice")
    assert isinstance(refusal, Refusal)
    assert refusal.never_fits
    assert refusal.reason == "this pool has at most 6 H100-80GB on one node; 8 were asked for"
    missing = state.place(Request(gpu=MigSlice("3g.20gb"), **CPU_MEM), "bob")
    assert isinstance(missing, Refusal) and missing.never_fits
    too_big = state.place(Request(cpu_milli=500_000, memory_mib=1024), "carol")
    assert isinstance(too_big, Refusal)
    assert too_big.reason == "no node in this pool has 500 CPUs (at most 112)"


def test_free_gpus_on_a_node_without_cpu_are_explained() -> None:
    state = PoolState([h100_node()])
    place(state, Request(cpu_milli=110_000, memory_mib=1024), "cpu-hog")
    refusal = state.place(Request(gpu=WholeGpus(1), **CPU_MEM), "alice")
    assert isinstance(refusal, Refusal)
    assert "6 free but on nodes without 4 CPUs and 16 GiB of memory left" in refusal.reason


def test_an_owner_holds_one_allocation_at_a_time() -> None:
    state = PoolState([h100_node()])
    place(state, Request(gpu=WholeGpus(1), **CPU_MEM), "alice")
    with pytest.raises(AlreadyHolding, match="alice already holds devices on dgx"):
        state.place(Request(gpu=WholeGpus(1), **CPU_MEM), "alice")


def test_cpu_only_work_takes_no_gpu() -> None:
    state = PoolState([h100_node()])
    allocation = place(state, Request(cpu_milli=2000, memory_mib=4096), "alice")
    assert allocation.grants == ()
    assert allocation.visible_devices == ""


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: WholeGpus(0), "gpus.count"),
        (lambda: GpuShare(1000), "share.milli"),
        (lambda: MigSlice(), "mig.profile or mig.min_memory_gb"),
        (lambda: Request(cpu_milli=-1, memory_mib=0), "cpu_milli"),
    ],
)
def test_invalid_requests_name_the_field(make: object, field: str) -> None:
    with pytest.raises(InvalidRequest, match=field):
        make()  # type: ignore[operator]


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(
        UnknownPolicy, match="choose one of first-fit, spread, best-fit, random, fgd, gpupool"
    ):
        policy_by_name("fastest")


def test_duplicate_node_names_are_refused() -> None:
    with pytest.raises(ValueError, match="node 'dgx' appears more than once"):
        PoolState([h100_node(), h100_node()])


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_places_every_kind_of_request(policy: str) -> None:
    state = PoolState([h100_node(), l4_node()], policy_by_name(policy))
    requests = [
        Request(gpu=WholeGpus(2, frozenset({"H100-80GB"})), **CPU_MEM),
        Request(gpu=MigSlice("3g.40gb"), **CPU_MEM),
        Request(gpu=MigSlice(min_memory_gb=10), **CPU_MEM),
        Request(gpu=GpuShare(250, 4096), **CPU_MEM),
        Request(**CPU_MEM),
    ]
    for i, request in enumerate(requests):
        place(state, request, f"owner-{i}")
    assert state.check_invariants() == []


def test_best_fit_packs_shares_onto_the_fullest_gpu() -> None:
    state = PoolState([l4_node()], "best-fit")
    first = place(state, Request(gpu=GpuShare(500), **CPU_MEM), "a")
    second = place(state, Request(gpu=GpuShare(250), **CPU_MEM), "b")
    assert first.grants[0].gpu_uuid == second.grants[0].gpu_uuid


def test_spread_puts_work_on_the_least_loaded_node() -> None:
    state = PoolState([h100_node("a"), h100_node("b")], "spread")
    first = place(state, Request(gpu=WholeGpus(1), **CPU_MEM), "x")
    second = place(state, Request(gpu=WholeGpus(1), **CPU_MEM), "y")
    assert first.node != second.node


def test_requests_match_products_however_they_are_spelled() -> None:
    state = PoolState([h100_node()])
    for i, spelling in enumerate(["NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "h100-80gb"]):
        allocation = place(state, Request(gpu=WholeGpus(1, frozenset({spelling})), **CPU_MEM), f"u{i}")
        assert allocation.grants[0].label.startswith("H100-80GB")
    slice_ = place(state, Request(gpu=MigSlice("3g.40GB"), **CPU_MEM), "mig-user")
    assert slice_.grants[0].label == "3g.40gb on H100-80GB #6"


def test_a_reused_policy_never_remembers_another_pools_devices() -> None:
    policy = policy_by_name("first-fit")
    first = PoolState([h100_node()], policy)
    place(first, Request(gpu=WholeGpus(1), **CPU_MEM), "alice")
    second = PoolState([h100_node()], policy)
    second.set_health("dgx", Health.UNHEALTHY, gpu_index=0)
    allocation = place(second, Request(gpu=WholeGpus(1), **CPU_MEM), "bob")
    assert allocation.grants[0].uuid != "GPU-dgx-0"


def test_refusals_say_which_limit_a_shared_gpu_hit() -> None:
    state = PoolState([node("l4", [gpu("l4", 0, "L4-24GB", mode=GpuMode.SHARED, max_shares=2)])])
    place(state, Request(gpu=GpuShare(100), **CPU_MEM), "a")
    place(state, Request(gpu=GpuShare(100), **CPU_MEM), "b")
    refusal = state.place(Request(gpu=GpuShare(100), **CPU_MEM), "c")
    assert isinstance(refusal, Refusal)
    assert (
        refusal.reason
        == "no shared GPU with 10% left is free now (0 of 1 in use, 1 at its limit of 2 holders)"
    )
    too_much_memory = state.place(Request(gpu=GpuShare(100, 64 * 1024), **CPU_MEM), "d")
    assert isinstance(too_much_memory, Refusal) and too_much_memory.never_fits


def test_the_pool_text_names_who_holds_a_shared_gpu() -> None:
    """An admin's trial read "GPU 0 L4-24GB 24 GiB shared 75% free, up to 4 holders" without whose."""
    from gpupool.spawner.inventory import describe_pool, render_pool

    state = PoolState([node("l4", [gpu("l4", 0, "L4-24GB", mode=GpuMode.SHARED, max_shares=4)])])
    place(state, Request(gpu=GpuShare(250), **CPU_MEM), "L1")
    text = render_pool(describe_pool(state, "simulated", "test"), {"L1": "grace's server (L1)"})
    assert "75% free, up to 4 holders; held by grace's server (L1)" in text, text


def test_inventory_shows_drained_nodes_and_failed_gpus() -> None:
    from gpupool.spawner.inventory import describe_pool

    state = PoolState([h100_node("a"), h100_node("b")])
    state.set_health("a", Health.DRAINED)
    state.set_health("b", Health.UNHEALTHY, gpu_index=3)
    description = describe_pool(state, "simulated", "test")
    assert description["nodes"][0]["health"] == "drained"
    assert description["nodes"][1]["gpus"][3]["health"] == "unhealthy"
    assert description["summary"]["unhealthy"] == ["a", "b/gpu3"]


def test_the_pool_text_never_calls_a_gpu_of_a_failed_node_free() -> None:
    """A failure trial read "[unhealthy]" on a node and "whole free" on each of its GPUs."""
    from gpupool.spawner.inventory import describe_pool, render_pool

    state = PoolState([h100_node("a"), h100_node("b")])
    place(state, Request(gpu=WholeGpus(1), **CPU_MEM), "L1")
    state.set_health("a", Health.UNHEALTHY)
    text = render_pool(describe_pool(state, "simulated", "test"), {"L1": "ada's job"})
    on_a, on_b = (section.splitlines()[1:] for section in text.split("\n\n")[1:])
    assert len(on_a) == 14 and all("  unhealthy" in line and "free" not in line for line in on_a), on_a
    assert sum("  unhealthy; held by ada's job  " in line for line in on_a) == 1, on_a
    assert all("  free  " in line for line in on_b if " whole " in line), on_b  # a healthy node's are free


def test_a_failed_gpu_on_a_drained_node_reads_failed_and_its_neighbours_drained_never_free() -> None:
    """From a review: the admin's page still called a drained node's GPUs free, and a failed GPU there read
    "drained" (the node's mark taken first), telling its researcher to restart "when you can"."""
    from gpupool.spawner.inventory import describe_pool
    from gpupool.spawner.service.api.page_html import pool_tree

    state = PoolState([h100_node("b")])
    state.set_health("b", Health.DRAINED)
    state.set_health("b", Health.UNHEALTHY, gpu_index=3)
    description = describe_pool(state, "simulated", "test")
    assert [g["out"] for g in description["nodes"][0]["gpus"]][:4] == ["drained"] * 3 + ["unhealthy"]
    cells = re.findall(r'<div class="dev[^"]*"[^>]*>(.*?)</div>', pool_tree(description, {}, {}))
    assert cells and not any(">free<" in cell for cell in cells), cells


def test_cpu_only_servers_go_to_the_node_without_gpus_while_it_has_room() -> None:
    """A Kubernetes trial's CPU-only servers all landed on the A100 node beside an empty CPU node; on the demo
    pool, on the DGX: FGD's gradient ties for work that takes no GPU, and the tie went to the node's rank."""
    state = PoolState(load_pool_file(DEMO_POOL), "gpupool")
    request = Request(gpu=None, cpu_milli=4000, memory_mib=16384)
    nodes = [place(state, request, f"user{i}").node for i in range(9)]
    assert nodes[:8] == ["cpu-01"] * 8  # its 32 cores, 4 a server
    assert nodes[8] != "cpu-01"  # then a GPU node: what fits runs
