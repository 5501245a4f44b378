"""Random pools, random requests, random failures: the pool's invariants hold after every step."""

from __future__ import annotations

from builders import gpu, node
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.spawner.pool import mig
from gpupool.spawner.pool.devices import GpuMode, Health, Node
from gpupool.spawner.pool.policies import POLICIES, policy_by_name
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import Allocation, PoolState, Refusal

PRODUCTS = ["H100-80GB", "A100-40GB", "A30-24GB", "L4-24GB"]
LAYOUTS = {p: mig.maximal_layouts(mig.GEOMETRIES[p]) for p in PRODUCTS if p in mig.GEOMETRIES}
PROFILES = sorted({name for p in LAYOUTS for name in mig.GEOMETRIES[p].profiles})


@st.composite
def gpus_of(draw: st.DrawFn, name: str) -> list[object]:
    found = []
    for index in range(draw(st.integers(0, 6))):
        product = draw(st.sampled_from(PRODUCTS))
        kind = draw(
            st.sampled_from(["whole", "shared", "mig"] if product in LAYOUTS else ["whole", "shared"])
        )
        nvlink = draw(st.sampled_from([None, 0, 1]))
        if kind == "mig":
            layout = draw(st.sampled_from(LAYOUTS[product]))
            kept = draw(st.lists(st.sampled_from(layout), min_size=1, unique=True))
            found.append(gpu(name, index, product, layout=[str(p) for p in kept], nvlink=nvlink))
        elif kind == "shared":
            shares = draw(st.sampled_from([None, 2, 4]))
            found.append(gpu(name, index, product, mode=GpuMode.SHARED, max_shares=shares, nvlink=nvlink))
        else:
            found.append(gpu(name, index, product, nvlink=nvlink))
    return found


@st.composite
def pools(draw: st.DrawFn) -> list[Node]:
    count = draw(st.integers(1, 4))
    return [
        node(
            f"n{i}",
            draw(gpus_of(f"n{i}")),  # type: ignore[arg-type]
            cpu=draw(st.integers(8, 128)),
            memory_gib=draw(st.integers(32, 1024)),
        )
        for i in range(count)
    ]


products = st.sampled_from([frozenset(), frozenset({"H100-80GB"}), frozenset({"L4-24GB", "A100-40GB"})])
gpu_needs = st.one_of(
    st.none(),
    st.builds(WholeGpus, st.integers(1, 4), products, st.sampled_from([0, 30_000, 90_000])),
    st.builds(MigSlice, profile=st.sampled_from(PROFILES)),
    st.builds(MigSlice, min_memory_gb=st.integers(1, 100)),
    st.builds(GpuShare, st.integers(1, 999), st.sampled_from([0, 4096, 30_000]), products),
)
requests = st.builds(Request, st.integers(0, 32_000), st.integers(0, 128 * 1024), gpu_needs)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("place"), requests, st.integers(0, 9)),
        st.tuples(st.just("release"), st.integers(0, 9)),
        st.tuples(
            st.just("health"),
            st.integers(0, 3),
            st.one_of(st.none(), st.integers(0, 5)),
            st.sampled_from(list(Health)),
        ),
    ),
    max_size=40,
)


def _healthy_at(state: PoolState, allocation: Allocation) -> bool:
    ns = state.node(allocation.node)
    ok = {g.uuid: ns.gpu_ok[p] for p, g in enumerate(ns.gpus)}
    return ns.healthy and all(ok[grant.gpu_uuid] for grant in allocation.grants)


@settings(max_examples=150, deadline=None)
@given(pool=pools(), ops=operations, policy=st.sampled_from(sorted(POLICIES)))
def test_random_place_release_and_failures_never_break_an_invariant(
    pool: list[Node], ops: list[tuple[object, ...]], policy: str
) -> None:
    state = PoolState(pool, policy_by_name(policy))
    for op in ops:
        if op[0] == "place":
            _, request, who = op
            owner = f"user-{who}"
            if state.allocation(owner) is not None:
                continue
            outcome = state.place(request, owner)  # type: ignore[arg-type]
            if isinstance(outcome, Allocation):
                assert _healthy_at(state, outcome), "placed on an unhealthy node or GPU"
            else:
                assert isinstance(outcome, Refusal) and outcome.reason
        elif op[0] == "release":
            state.release(f"user-{op[1]}")
        else:
            _, node_index, gpu_index, health = op
            target = pool[node_index % len(pool)]
            if gpu_index is not None and target.gpus:
                state.set_health(target.name, health, target.gpus[gpu_index % len(target.gpus)].index)  # type: ignore[arg-type]
            else:
                state.set_health(target.name, health)  # type: ignore[arg-type]
        assert state.check_invariants() == []

    for owner in list(state.allocations):
        state.release(owner)
    for ns in state.nodes:
        assert (ns.cpu_free, ns.mem_free) == (ns.node.cpu_milli, ns.node.memory_mib)
        assert all(free == 1000 for free in ns.free)
        assert all(len(free) == len(g.mig_instances) for free, g in zip(ns.mig_free, ns.gpus, strict=True))


@settings(max_examples=100, deadline=None)
@given(pool=pools(), request=requests)
def test_a_request_said_to_never_fit_fails_on_an_empty_healthy_pool_too(
    pool: list[Node], request: Request
) -> None:
    busy = PoolState(pool)
    for ns in busy.nodes:
        busy.set_health(ns.node.name, Health.UNHEALTHY)
    outcome = busy.place(request, "someone")
    assert isinstance(outcome, Refusal)
    fresh = PoolState(pool).place(request, "someone")
    assert outcome.never_fits == isinstance(fresh, Refusal)
