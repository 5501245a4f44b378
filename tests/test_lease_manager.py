"""The lease manager on real SQLite files: grants, queue and releases survive a restart, never doubled."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from builders import gpu, node

from gpupool.spawner.backends.simulated import parse_pool
from gpupool.spawner.pool.devices import GpuMode, Health, Node
from gpupool.spawner.pool.leases import Lease, LeaseState
from gpupool.spawner.pool.quotas import Quota, QuotaExceeded, QuotaPolicy
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import AlreadyHolding, CannotRestore, PoolState
from gpupool.spawner.service.leasing.lease_manager import LeaseManager, NeverFits
from gpupool.spawner.service.store.lease_store import LeaseNotFound, LeaseStore, sqlite_url

H100 = frozenset({"H100-80GB"})
WHOLE = Request(4000, 16384, WholeGpus(1, H100))
PAIR = Request(8000, 32768, WholeGpus(2, H100))
MIG = Request(2000, 8192, MigSlice("3g.40gb"))
SHARE = Request(1000, 4096, GpuShare(500))


class Clock:
    """A clock that moves one second per reading, so every event has its own time."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def pool(whole: int = 2) -> list[Node]:
    gpus = [gpu("dgx", i, nvlink=0) for i in range(whole)]
    gpus.append(gpu("dgx", whole, layout=["3g.40gb@0", "3g.40gb@4"]))
    return [
        node("dgx", gpus, cpu=112, memory_gib=2048),
        node("l4", [gpu("l4", 0, "L4-24GB", mode=GpuMode.SHARED, max_shares=2)], cpu=32),
    ]


def manager(
    tmp_path: Path, nodes: Sequence[Node] | None = None, quotas: QuotaPolicy | None = None
) -> LeaseManager:
    """A manager on the one SQLite file in ``tmp_path``: a second call is the service after a restart."""
    store = LeaseStore(sqlite_url(str(tmp_path / "leases.sqlite")))
    return LeaseManager(pool() if nodes is None else nodes, store, quotas=quotas, clock=Clock())


def ask(m: LeaseManager, user: str, request: Request, priority: int = 0) -> Lease:
    return m.request_lease(user, [], "server", "", "profile", request, priority)


def held_uuids(m: LeaseManager) -> list[str]:
    return [g.uuid for a in m.pool.allocations.values() for g in a.grants]


def test_a_granted_lease_survives_a_restart_with_the_same_devices(tmp_path: Path) -> None:
    first = manager(tmp_path)
    leases = [ask(first, "alice", WHOLE), ask(first, "bob", MIG), ask(first, "carol", SHARE)]
    assert all(lease.state is LeaseState.GRANTED for lease in leases)
    first.store.close()

    second = manager(tmp_path)
    assert second.released_at_start == ()
    for lease in leases:
        assert second.get(lease.id).devices == lease.devices
        allocation = second.pool.allocation(lease.id)
        assert allocation is not None
        assert (allocation.node, allocation.grants) == (lease.node, lease.devices)
    assert second.pool.check_invariants() == []


def test_a_queued_lease_keeps_its_place_across_a_restart_and_is_granted_when_a_device_frees(
    tmp_path: Path,
) -> None:
    first = manager(tmp_path)
    holders = [ask(first, "alice", WHOLE), ask(first, "bob", WHOLE)]
    carol, dave = ask(first, "carol", WHOLE), ask(first, "dave", WHOLE)
    assert (carol.state, carol.position, dave.position) == (LeaseState.QUEUED, 0, 1)
    assert first.waiting_message(dave.id) == (
        "Waiting for a free H100-80GB: 1 ahead of you; "
        "no expected start yet (what it waits for has no time limit, or is drained or failed)"
    )
    first.store.close()

    second = manager(tmp_path)
    assert [second.position(carol.id), second.position(dave.id)] == [0, 1]
    second.release(holders[0].id, "stopped")
    granted = second.get(carol.id)
    assert (granted.state, granted.devices) == (LeaseState.GRANTED, holders[0].devices)
    assert granted.position is None
    assert (second.waiting_message(dave.id) or "").startswith("Waiting for a free H100-80GB: you are next;")
    assert second.waiting_message(carol.id) is None


def test_release_is_exactly_once(tmp_path: Path) -> None:
    m = manager(tmp_path)
    alice, bob = ask(m, "alice", PAIR), ask(m, "bob", WHOLE)
    assert bob.state is LeaseState.QUEUED
    first = m.release(alice.id, "stopped")
    again = m.release(alice.id, "culled")
    assert again == first
    assert (again.release_reason, again.state) == ("stopped", LeaseState.RELEASED)
    assert m.get(bob.id).state is LeaseState.GRANTED  # admitted once, by the first release
    assert m.pool.check_invariants() == []
    assert list(m.pool.allocations) == [bob.id]
    with pytest.raises(LeaseNotFound):
        m.release("no-such-lease")


def test_quota_refusal_stores_nothing_and_names_the_limit(tmp_path: Path) -> None:
    m = manager(tmp_path, quotas=QuotaPolicy(per_user=Quota(whole_gpus=1)))
    held = ask(m, "alice", WHOLE)
    with pytest.raises(QuotaExceeded, match="alice's quota allows 1 whole GPU at once; 1 is held"):
        ask(m, "alice", WHOLE)
    assert m.leases_for("alice") == [held]
    assert m.store.active() == [held]
    assert ask(m, "bob", WHOLE).state is LeaseState.GRANTED


def test_a_request_no_node_could_ever_serve_is_told_so_before_its_quota(tmp_path: Path) -> None:
    """A trial's 8-GPU job on a pool of 6-GPU nodes was refused as over the quota ("8 more were asked for"),
    which no quota would mend."""
    m = manager(tmp_path, quotas=QuotaPolicy(per_user=Quota(whole_gpus=2)))
    eight = Request(1000, 1024, WholeGpus(8, H100))
    with pytest.raises(NeverFits, match="8 were asked for"):
        ask(m, "alice", eight)
    assert m.refusals["never_fits"] == 1 and m.refusals["quota"] == 0


def test_queued_leases_count_against_the_quota(tmp_path: Path) -> None:
    m = manager(tmp_path, nodes=pool(whole=1), quotas=QuotaPolicy(per_user=Quota(whole_gpus=2)))
    ask(m, "alice", WHOLE)
    assert ask(m, "alice", WHOLE).state is LeaseState.QUEUED
    with pytest.raises(QuotaExceeded):
        ask(m, "alice", WHOLE)


def test_two_managers_never_double_grant_after_restart(tmp_path: Path) -> None:
    first = manager(tmp_path)
    before = [ask(first, user, request) for user, request in [("a", WHOLE), ("b", MIG), ("c", SHARE)]]
    first.store.close()

    second = manager(tmp_path)
    after = [ask(second, user, request) for user, request in [("d", WHOLE), ("e", MIG), ("f", SHARE)]]
    assert all(lease.state is LeaseState.GRANTED for lease in before + after)
    uuids = [g.uuid for lease in before + after for g in lease.devices]
    assert len(set(uuids)) == len(uuids) - 1  # only the shared L4 appears twice, as two shares
    assert sorted(held_uuids(second)) == sorted(uuids)
    assert second.pool.check_invariants() == []
    assert ask(second, "g", WHOLE).state is LeaseState.QUEUED  # everything whole is taken


def test_a_pool_file_that_lost_a_node_releases_its_leases_with_a_reason(tmp_path: Path) -> None:
    both = {
        "nodes": [
            {"name": "a100", "cpu": 32, "memory": "256GiB", "gpus": {"product": "A100-80GB", "count": 1}},
            {"name": "t4", "cpu": 8, "memory": "32GiB", "gpus": {"product": "T4", "count": 1}},
        ]
    }
    first = manager(tmp_path, nodes=parse_pool(both, "pool.yaml"))
    on_a100 = ask(first, "alice", Request(1000, 1024, WholeGpus(1, frozenset({"A100-80GB"}))))
    on_t4 = ask(first, "bob", Request(1000, 1024, WholeGpus(1, frozenset({"T4-16GB"}))))
    first.store.close()

    shrunk = {"nodes": both["nodes"][:1]}
    second = manager(tmp_path, nodes=parse_pool(shrunk, "pool.yaml"))
    (gone,) = second.released_at_start
    assert gone.id == on_t4.id
    assert gone.release_reason == "devices gone: node t4 is not in the pool"
    assert second.get(on_t4.id).state is LeaseState.RELEASED
    assert second.get(on_a100.id).state is LeaseState.GRANTED
    assert second.pool.check_invariants() == []


def test_a_changed_mig_layout_releases_the_slices_it_dropped(tmp_path: Path) -> None:
    first = manager(tmp_path)
    kept, dropped = ask(first, "alice", MIG), ask(first, "bob", MIG)
    first.store.close()
    relaid = pool()
    old = relaid[0]
    mig_gpu = gpu("dgx", 2, layout=["3g.40gb@0", "2g.20gb@4"])  # the second 3g.40gb became a 2g.20gb
    relaid[0] = node("dgx", [*old.gpus[:2], mig_gpu], cpu=112, memory_gib=2048)
    second = manager(tmp_path, nodes=relaid)
    uuid = dropped.devices[0].uuid
    assert [g.release_reason for g in second.released_at_start] == [
        f"devices gone: dgx: {uuid} is now a 2g.20gb instance, not what was asked"
    ]
    assert second.get(kept.id).state is LeaseState.GRANTED


def test_a_request_that_never_fits_is_refused_and_not_stored(tmp_path: Path) -> None:
    m = manager(tmp_path)
    with pytest.raises(NeverFits, match="B200"):
        ask(m, "alice", Request(1000, 1024, WholeGpus(1, frozenset({"B200-180GB"}))))
    ask(m, "bob", PAIR)
    ask(m, "carol", PAIR)  # queued: competes with whole-GPU asks from now on
    with pytest.raises(NeverFits):
        ask(m, "alice", Request(1000, 1024, WholeGpus(8)))
    assert m.leases_for("alice") == []


def test_a_small_request_does_not_slip_past_a_bigger_one_waiting_for_the_same_gpus(tmp_path: Path) -> None:
    m = manager(tmp_path, nodes=pool(whole=3))
    ask(m, "alice", WHOLE)
    ask(m, "bob", WHOLE)
    carol = ask(m, "carol", PAIR)
    dave = ask(m, "dave", WHOLE)  # one GPU is free, but carol waits for it first
    assert (carol.state, dave.state, dave.position) == (LeaseState.QUEUED, LeaseState.QUEUED, 1)
    assert ask(m, "erin", MIG).state is LeaseState.GRANTED  # a MIG slice takes nothing carol could use
    urgent = ask(m, "frank", WHOLE, priority=10)  # ahead of carol, so it may take the free GPU
    assert urgent.state is LeaseState.GRANTED


def test_restore_refuses_a_device_another_owner_holds() -> None:
    state = PoolState(pool())
    assert state.restore("a", WHOLE, "dgx", (0,)).visible_devices == "GPU-dgx-0"
    with pytest.raises(CannotRestore, match="H100-80GB #0 is in use"):
        state.restore("b", WHOLE, "dgx", (0,))
    with pytest.raises(AlreadyHolding):
        state.restore("a", WHOLE, "dgx", (1,))
    with pytest.raises(CannotRestore, match="shape"):
        state.restore("c", PAIR, "dgx", (1, 1))
    with pytest.raises(CannotRestore, match=r"H100-80GB #2 \(mig\) cannot serve"):
        state.restore("c", WHOLE, "dgx", (2,))
    with pytest.raises(CannotRestore, match="node gone is not in the pool"):
        state.restore("c", WHOLE, "gone", (0,))
    state.restore("d", SHARE, "l4", (0,))
    with pytest.raises(CannotRestore, match="L4-24GB #0 is in use"):
        state.restore("e", Request(1000, 1024, GpuShare(600)), "l4", (0,))
    state.restore("f", MIG, "dgx", (2, 1))
    with pytest.raises(CannotRestore, match="MIG-dgx-2-4 is in use"):
        state.restore("g", MIG, "dgx", (2, 1))
    placed = [state.place(WHOLE, "h"), state.place(MIG, "i")]  # placement sees what restore took
    assert [getattr(p, "visible_devices", p) for p in placed] == ["GPU-dgx-1", "MIG-dgx-2-0"]
    assert state.check_invariants() == []


def test_availability_counts_what_could_start_now_and_changes_nothing(tmp_path: Path) -> None:
    m = manager(tmp_path)
    asks = {"whole": WHOLE, "pair": PAIR, "mig": MIG}
    assert m.availability(asks) == {"whole": (2, 0), "pair": (1, 0), "mig": (2, 0)}
    assert m.pool.allocations == {} and m.pool.check_invariants() == []

    ask(m, "alice", PAIR)
    queued = m.request_lease("bob", [], "server", "", "whole", WHOLE)
    assert queued.state is LeaseState.QUEUED
    # Whole GPUs are all taken and one waits; MIG slices are untouched by the wait.
    assert m.availability(asks) == {"whole": (0, 1), "pair": (0, 0), "mig": (2, 0)}
    assert len(m.pool.allocations) == 1


def test_all_leases_lists_every_user(tmp_path: Path) -> None:
    m = manager(tmp_path)
    first, second = ask(m, "alice", MIG), ask(m, "bob", MIG)
    m.release(first.id)
    assert [lease.id for lease in m.all_leases()] == [first.id, second.id]
    assert [lease.id for lease in m.all_leases(active_only=True)] == [second.id]


def test_a_wait_never_counts_on_devices_a_drain_keeps_out(tmp_path: Path) -> None:
    """A Kubernetes trial drained the A100 node and asked for two A100s: "expected to start by 20:59 UTC (in
    about 48.0 h)", the holder's time limit, though the drained GPUs would not come back when it ended."""
    m = manager(tmp_path)
    hour = Request(4000, 16384, WholeGpus(1, H100), seconds=3600)
    holders = [ask(m, "alice", hour), ask(m, "bob", replace(hour, seconds=3 * 86400))]
    waiting = ask(m, "carol", hour)
    assert m.expected_start(waiting.id) == holders[0].granted_at + 3600
    alices = next(g.index for g in m.pool.node("dgx").gpus if g.uuid == holders[0].devices[0].gpu_uuid)
    m.set_health("dgx", Health.DRAINED, gpu_index=alices)  # it stays out when she releases it
    assert m.expected_start(waiting.id) == holders[1].granted_at + 3 * 86400  # bob's, three days off
    assert "(in about 3 days)" in (m.waiting_message(waiting.id) or "")
    m.set_health("dgx", Health.DRAINED)
    assert m.expected_start(waiting.id) is None
    assert "no expected start yet (what it waits for has no time limit, or is drained or failed)" in (
        m.waiting_message(waiting.id) or ""
    )


def test_while_placements_are_held_requests_queue_saying_why_and_start_in_order_once_resumed(
    tmp_path: Path,
) -> None:
    """A Kubernetes trial stopped the cluster's API server under a running service: spawns were still granted
    and then failed with "Cannot connect to host". While the backend holds placements nothing is granted, and
    whoever waits reads why instead of an estimate."""
    m = manager(tmp_path)
    running = ask(m, "alice", WHOLE)
    why = "gpupool has lost its watch of the cluster since 22:15 UTC: nothing starts until it is back"
    m.hold_placements(why)
    first, second = ask(m, "bob", MIG), ask(m, "carol", SHARE)
    assert first.state is second.state is LeaseState.QUEUED  # though both would fit
    assert m.availability({"mig": MIG})["mig"][0] == 0
    message = m.waiting_message(first.id) or ""
    assert message.endswith(why) and "expected" not in message, message
    assert m.expected_start_of_new(MIG) is None
    m.release(running.id)  # a release admits no one while held
    assert m.get(first.id).state is LeaseState.QUEUED and held_uuids(m) == []
    with pytest.raises(NeverFits):  # a request no pool could serve is still told so at once
        ask(m, "dan", Request(4000, 16384, WholeGpus(9, H100)))

    m.hold_placements(None)
    assert [m.get(lease.id).state for lease in (first, second)] == [LeaseState.GRANTED] * 2
    assert ask(m, "erin", WHOLE).state is LeaseState.GRANTED
