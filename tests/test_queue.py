"""The admission queue: order, positions, what a waiting user reads, and who is admitted when devices free."""

from __future__ import annotations

import itertools

import pytest
from builders import gpu, node
from hypothesis import given
from hypothesis import strategies as st

from gpupool.spawner.pool.devices import GpuMode
from gpupool.spawner.pool.queue import AdmissionQueue, AlreadyQueued, NotQueued, QueuedRequest, competes
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import Allocation, PoolState

CPU_MEM = {"cpu_milli": 2000, "memory_mib": 8192}
H100 = frozenset({"H100-80GB"})
L4 = frozenset({"L4-24GB"})


def whole(count: int = 1, products: frozenset[str] = H100) -> Request:
    return Request(**CPU_MEM, gpu=WholeGpus(count, products))


def mig(profile: str = "1g.10gb") -> Request:
    return Request(**CPU_MEM, gpu=MigSlice(profile))


def share(milli: int = 250, products: frozenset[str] = L4) -> Request:
    return Request(**CPU_MEM, gpu=GpuShare(milli, products=products))


CPU_ONLY = Request(**CPU_MEM)
_ids = itertools.count()


def entry(request: Request, priority: int = 0, at: float = 0.0, id: str | None = None) -> QueuedRequest:
    name = id or f"q{next(_ids)}"
    return QueuedRequest(name, f"server:{name}", "alice", request, priority, at)


def ids(entries: list[QueuedRequest]) -> list[str]:
    return [e.id for e in entries]


def test_higher_priority_goes_first_then_earlier_arrival() -> None:
    queue = AdmissionQueue(
        [entry(whole(), 0, 1.0, "late"), entry(whole(), 0, 0.5, "early"), entry(whole(), 5, 9.0, "urgent")]
    )
    assert ids(queue.entries()) == ["urgent", "early", "late"]
    assert [queue.position(i) for i in ("urgent", "early", "late")] == [0, 1, 2]


def test_entries_that_arrive_at_the_same_time_keep_the_order_they_were_added() -> None:
    queue = AdmissionQueue([entry(whole(), 0, 1.0, "first"), entry(whole(), 0, 1.0, "second")])
    assert ids(queue.entries()) == ["first", "second"]


def test_an_entry_restored_after_a_restart_takes_its_place_by_submission_time() -> None:
    queue = AdmissionQueue([entry(whole(), 0, 20.0, "new")])
    queue.add(entry(whole(), 0, 10.0, "restored"))
    assert queue.position("restored") == 0


def test_the_same_id_cannot_be_queued_twice() -> None:
    queue = AdmissionQueue([entry(whole(), id="a")])
    with pytest.raises(AlreadyQueued):
        queue.add(entry(mig(), id="a"))


def test_an_unknown_id_has_no_position_and_cannot_be_removed() -> None:
    queue = AdmissionQueue()
    with pytest.raises(NotQueued):
        queue.position("ghost")
    with pytest.raises(NotQueued):
        queue.remove("ghost")


def test_a_submission_time_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(ValueError, match="submitted_at"):
        entry(whole(), at=float("nan"))


def test_a_waiting_user_reads_what_they_wait_for_and_how_many_are_ahead() -> None:
    queue = AdmissionQueue([entry(whole(), at=t, id=f"h{t}") for t in range(3)])
    queue.add(entry(mig(), at=0.5, id="m"))
    assert queue.waiting_message("h2", "H100-80GB") == "Waiting for a free H100-80GB: 2 ahead of you"
    assert queue.waiting_message("h1", "H100-80GB") == "Waiting for a free H100-80GB: 1 ahead of you"
    assert (
        queue.waiting_message("m", "1g.10gb MIG slice")
        == "Waiting for a free 1g.10gb MIG slice: you are next"
    )


def test_only_entries_waiting_for_the_same_kind_of_device_count_as_ahead() -> None:
    queue = AdmissionQueue([entry(mig(), id="m"), entry(share(), id="s"), entry(whole(), id="w")])
    assert queue.position("w") == 2
    assert queue.ahead_of("w") == []


def test_a_blocked_head_holds_back_smaller_requests_for_the_same_devices() -> None:
    queue = AdmissionQueue([entry(whole(2), id="pair"), entry(whole(1), id="single")])
    tried: list[str] = []

    def only_one_gpu_free(e: QueuedRequest) -> bool:
        tried.append(e.id)
        return isinstance(e.request.gpu, WholeGpus) and e.request.gpu.count == 1

    assert queue.admit(only_one_gpu_free) == []
    assert tried == ["pair"]  # the single GPU is kept for the pair, which would otherwise starve


def test_a_blocked_head_holds_back_lower_priority_requests_for_the_same_devices() -> None:
    queue = AdmissionQueue([entry(whole(2), 9, id="urgent"), entry(whole(1), 0, id="batch")])
    assert queue.admit(lambda e: e.id == "batch") == []


def test_a_request_for_a_different_free_device_kind_passes_a_blocked_head() -> None:
    queue = AdmissionQueue(
        [
            entry(whole(2), id="pair"),
            entry(mig(), id="slice"),
            entry(share(), id="l4"),
            entry(CPU_ONLY, id="cpu"),
        ]
    )
    admitted = queue.admit(lambda e: e.id != "pair")
    assert ids(admitted) == ["slice", "l4", "cpu"]
    assert ids(queue.entries()) == ["pair"]


def test_a_request_for_other_products_passes_a_blocked_head() -> None:
    queue = AdmissionQueue([entry(whole(2, H100), id="h100"), entry(whole(1, L4), id="l4")])
    assert ids(queue.admit(lambda e: e.id == "l4")) == ["l4"]


def test_a_request_for_any_product_waits_behind_a_blocked_request_for_one_product() -> None:
    queue = AdmissionQueue([entry(whole(2, H100), id="h100"), entry(whole(1, frozenset()), id="any")])
    assert queue.admit(lambda e: e.id == "any") == []


def test_slices_of_different_mig_profiles_do_not_hold_each_other_back() -> None:
    assert not competes(MigSlice("3g.40gb"), MigSlice("1g.10gb"))
    assert competes(MigSlice("3g.40gb"), MigSlice(min_memory_gb=20))
    assert competes(MigSlice("3g.40gb"), MigSlice("3g.40gb"))


def test_admitted_entries_leave_the_queue_and_the_rest_keep_their_order() -> None:
    queue = AdmissionQueue([entry(mig(), at=t, id=f"m{t}") for t in range(4)])
    assert ids(queue.admit(lambda e: e.id in {"m0", "m1"})) == ["m0", "m1"]
    assert ids(queue.entries()) == ["m2", "m3"]
    assert queue.position("m2") == 0


def test_queued_requests_are_admitted_into_a_real_pool_as_devices_free() -> None:
    pool = PoolState(
        [
            node("dgx", [gpu("dgx", 0), gpu("dgx", 1)]),
            node("l4", [gpu("l4", 0, "L4-24GB", mode=GpuMode.SHARED)]),
        ]
    )
    assert isinstance(pool.place(whole(2), "holder"), Allocation)
    queue = AdmissionQueue([entry(whole(1), id="waiting"), entry(share(), id="share")])

    def try_place(e: QueuedRequest) -> bool:
        return isinstance(pool.place(e.request, e.owner), Allocation)

    assert ids(queue.admit(try_place)) == ["share"]
    pool.release("holder")
    assert ids(queue.admit(try_place)) == ["waiting"]
    assert pool.allocation("server:waiting") is not None
    assert pool.check_invariants() == []


# ---- properties -------------------------------------------------------------------------------------------

requests = st.sampled_from(
    [CPU_ONLY, whole(1), whole(2), whole(1, L4), whole(1, frozenset()), mig(), mig("3g.40gb"), share()]
)
queued = st.lists(
    st.tuples(requests, st.integers(-2, 2), st.sampled_from([0.0, 1.0, 2.5, 3.0])), max_size=25
).map(lambda rows: [QueuedRequest(f"e{i}", f"o{i}", "u", r, p, t) for i, (r, p, t) in enumerate(rows)])


def in_order(entries: list[QueuedRequest]) -> bool:
    keys = [(-e.priority, e.submitted_at) for e in entries]
    return keys == sorted(keys)


@given(queued)
def test_queue_order_is_always_priority_then_arrival(entries: list[QueuedRequest]) -> None:
    queue = AdmissionQueue(entries)
    assert in_order(queue.entries())
    assert sorted(ids(queue.entries())) == sorted(ids(entries))


@given(queued)
def test_positions_are_a_permutation_of_zero_to_n(entries: list[QueuedRequest]) -> None:
    queue = AdmissionQueue(entries)
    positions = [queue.position(e.id) for e in entries]
    assert sorted(positions) == list(range(len(entries)))
    for e in entries:
        assert queue.entries()[queue.position(e.id)] == e


@given(queued, st.data())
def test_removing_an_entry_never_reorders_the_rest(entries: list[QueuedRequest], data: st.DataObject) -> None:
    queue = AdmissionQueue(entries)
    for gone in data.draw(st.lists(st.sampled_from(ids(entries)), unique=True)) if entries else []:
        before = ids(queue.entries())
        queue.remove(gone)
        assert ids(queue.entries()) == [i for i in before if i != gone]


@given(queued, st.sets(st.integers(0, 30)))
def test_admit_never_admits_what_try_place_refused_and_never_skips_a_waiting_competitor(
    entries: list[QueuedRequest], placeable: set[int]
) -> None:
    queue = AdmissionQueue(entries)
    order = ids(queue.entries())
    tried: dict[str, bool] = {}

    def try_place(e: QueuedRequest) -> bool:
        tried[e.id] = int(e.id[1:]) in placeable
        return tried[e.id]

    admitted = queue.admit(try_place)
    assert all(tried[e.id] for e in admitted)
    assert {i for i, ok in tried.items() if ok} == set(ids(admitted))
    assert ids(admitted) == [i for i in order if i in set(ids(admitted))]  # admitted in queue order
    remaining = queue.entries()
    assert in_order(remaining) and len(remaining) + len(admitted) == len(entries)
    for a in admitted:
        for w in remaining:
            if order.index(w.id) < order.index(a.id):
                assert not competes(w.request.gpu, a.request.gpu), (w, a)
