"""Tasks that can run on any GPU leave the models that model-constrained tasks need (``gpupool`` policy)."""

from __future__ import annotations

import pytest
from builders import gpu, node

from gpupool.spawner.pool.fragmentation import TaskShape
from gpupool.spawner.pool.model_pressure import model_pressure
from gpupool.spawner.pool.policies import policy_by_name
from gpupool.spawner.pool.requests import Request, WholeGpus
from gpupool.spawner.pool.state import Allocation, PoolState


def shape(products: frozenset[str] = frozenset(), weight: float = 0.5, gpus: int = 1) -> TaskShape:
    return TaskShape(
        cpu_milli=12_000, gpu_milli=1000, gpu_count=gpus, products=products, weight=weight, memory_mib=65_536
    )


ANY = shape()
L4_ONLY = shape(frozenset({"L4-24GB"}))


def test_a_model_only_constrained_tasks_can_use_is_priced_by_how_much_of_it_they_need() -> None:
    # Half the demand must run on L4s, which are 2 of the pool's 10 GPUs: 0.5 of demand on 0.2 of supply.
    assert model_pressure([ANY, L4_ONLY], {"H100-80GB": 8, "L4-24GB": 2}) == {"L4-24GB": pytest.approx(2.5)}
    assert model_pressure([ANY], {"H100-80GB": 8, "L4-24GB": 2}) == {}, "no constraint, no pressure"
    assert model_pressure([ANY, shape(frozenset({"T4-16GB"}))], {"H100-80GB": 8}) == {}, "no T4s to protect"
    # A shape allowing two models spreads its demand over them by supply: the same pressure on each.
    either = model_pressure([ANY, shape(frozenset({"L4-24GB", "H100-80GB"}))], {"H100-80GB": 8, "L4-24GB": 2})
    assert either == {"L4-24GB": pytest.approx(0.5), "H100-80GB": pytest.approx(0.5)}
    assert model_pressure([], {"L4-24GB": 2}) == {} and model_pressure([L4_ONLY], {}) == {}


def where_it_goes(shapes: list[TaskShape], request: Request) -> str:
    """The node ``request`` lands on beside two 8-GPU H100 nodes (96 cores each) and one CPU-rich L4 node
    (104 cores for 2 GPUs) that ranks first."""
    policy = policy_by_name("gpupool")
    policy.set_workload(shapes)
    nodes = [
        node("l4", [gpu("l4", i, "L4-24GB") for i in range(2)], cpu=104, memory_gib=1024),
        *(node(f"h100-{n}", [gpu(f"h100-{n}", i) for i in range(8)], cpu=96) for n in (1, 2)),
    ]
    outcome = PoolState(nodes, policy, ranks=[0, 1, 2]).place(request, "someone")
    assert isinstance(outcome, Allocation), outcome
    return outcome.node


def test_a_task_that_runs_anywhere_leaves_the_l4s_to_tasks_that_run_only_there() -> None:
    # 40 cores on an H100 node leave 56: four of its seven free GPUs can still be fed, so the feeding measure
    # alone sends the task to the L4 node, whose cores are plenty. L4-only tasks make that L4 dear.
    hungry = Request(cpu_milli=40_000, memory_mib=65_536, gpu=WholeGpus(1))
    assert where_it_goes([ANY], hungry) == "l4"
    assert where_it_goes([ANY, L4_ONLY], hungry).startswith("h100")


def test_a_task_that_runs_only_on_l4s_still_gets_one() -> None:
    only_l4 = Request(cpu_milli=40_000, memory_mib=65_536, gpu=WholeGpus(1, frozenset({"L4-24GB"})))
    assert where_it_goes([ANY, L4_ONLY], only_l4) == "l4"
