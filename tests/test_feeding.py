"""The default policy keeps free GPUs fed: CPU and memory stay where the GPUs beside them will need them."""

from __future__ import annotations

from builders import gpu, node

from gpupool.spawner.pool.feeding import FeedingMeter
from gpupool.spawner.pool.fragmentation import FragmentMeter, TaskShape, gpu_views, typical_shapes
from gpupool.spawner.pool.node_state import NodeState
from gpupool.spawner.pool.policies import policy_by_name
from gpupool.spawner.pool.requests import Request, WholeGpus
from gpupool.spawner.pool.state import Allocation, PoolState

# The typical task: one whole GPU with 12 cores and 64 GiB beside it.
GPU_TASK = TaskShape(cpu_milli=12_000, gpu_milli=1000, gpu_count=1, products=frozenset(), memory_mib=65_536)


def eight_gpu_node(name: str = "big", cpu: int = 96, memory_gib: int = 512) -> object:
    return node(name, [gpu(name, i) for i in range(8)], cpu=cpu, memory_gib=memory_gib)


def two_gpu_node(name: str = "small") -> object:
    return node(name, [gpu(name, i) for i in range(2)], cpu=104, memory_gib=1024)


def where_it_goes(policy_name: str, request: Request) -> str:
    """The node a request lands on in a pool of a big and a small GPU node; ties prefer the big one."""
    policy = policy_by_name(policy_name)
    policy.set_workload([GPU_TASK])
    state = PoolState([eight_gpu_node(), two_gpu_node()], policy, ranks=[0, 1])
    outcome = state.place(request, "someone")
    assert isinstance(outcome, Allocation), outcome
    return outcome.node


def test_a_cpu_only_task_leaves_the_cores_that_a_nodes_free_gpus_need() -> None:
    # 24 of the big node's 96 cores would leave 72: enough for one more GPU task (all FGD asks), but six of
    # its eight GPUs could then be fed, not eight. The small node has cores to spare beside its two GPUs.
    cpu_task = Request(cpu_milli=24_000, memory_mib=8192)
    assert where_it_goes("fgd", cpu_task) == "big"
    assert where_it_goes("gpupool", cpu_task) == "small"


def test_a_memory_hungry_task_leaves_the_memory_that_a_nodes_free_gpus_need() -> None:
    # Few cores but 256 of the big node's 512 GiB: four GPU tasks' worth of memory would be gone.
    memory_task = Request(cpu_milli=1000, memory_mib=256 * 1024)
    assert where_it_goes("fgd", memory_task) == "big"
    assert where_it_goes("gpupool", memory_task) == "small"


def test_a_gpu_task_still_goes_where_fgd_sends_it_when_cpu_is_plentiful() -> None:
    assert where_it_goes("gpupool", Request(cpu_milli=12_000, memory_mib=65_536, gpu=WholeGpus(1))) == "big"


def test_a_fresh_node_is_not_counted_as_starved_for_tasks_it_could_never_feed() -> None:
    # 18-core tasks: a 96-core node feeds five of its eight GPUs even when empty. That is its shape, not
    # damage, so the empty node measures as FGD does, and a fitting task that keeps the ratio costs nothing.
    heavy = TaskShape(cpu_milli=18_000, gpu_milli=1000, gpu_count=1, products=frozenset())
    state = NodeState(eight_gpu_node(), 0)
    capacity = (state.node.cpu_milli, state.node.memory_mib)
    feeding, fgd = FeedingMeter([heavy]), FragmentMeter([heavy])
    empty = feeding.fragment(capacity, state.cpu_free, state.mem_free, gpu_views(state))
    assert empty == fgd.fragment(state.cpu_free, gpu_views(state)) == 0
    one_used = [0] + [1000] * 7
    after = feeding.fragment(capacity, 96_000 - 18_000, state.mem_free, gpu_views(state, one_used))
    assert after == 0


def test_unfed_gpus_count_half_as_much_as_gpus_too_full_for_the_task() -> None:
    state = NodeState(eight_gpu_node(), 0)
    capacity = (state.node.cpu_milli, state.node.memory_mib)
    meter = FeedingMeter([GPU_TASK])
    # 36 cores feed three of the eight free GPUs; the other five (5,000 milli) count half.
    assert meter.fragment(capacity, 36_000, state.mem_free, gpu_views(state)) == 2500
    # No cores for even one task: every free GPU is fragment, as in FGD.
    assert meter.fragment(capacity, 11_000, state.mem_free, gpu_views(state)) == 8000


def test_typical_shapes_carry_the_median_memory_of_their_tasks() -> None:
    def task(memory_gib: int) -> Request:
        return Request(cpu_milli=8000, memory_mib=memory_gib * 1024, gpu=WholeGpus(1))

    (shape,) = typical_shapes([task(16), task(32), task(32), task(256)])
    assert shape.memory_mib == 32 * 1024
    assert shape.weight == 1.0


def test_a_policy_learning_online_weighs_the_shapes_the_benchmark_measured_it_with() -> None:
    # The service never hands the policy a workload: it learns one from what it places. The benchmark gives the
    # trace's typical shapes (95% of tasks); learning every shape, down to one task in 64 as here, allocated
    # less on the trace than the table said.
    common = Request(cpu_milli=8000, memory_mib=16_384, gpu=WholeGpus(1))
    rare = Request(cpu_milli=120_000, memory_mib=16_384, gpu=WholeGpus(8))
    requests = [common] * 63 + [rare]  # 64: a count at which the policy re-reads what it has seen
    policy = policy_by_name("gpupool")
    state = PoolState([eight_gpu_node(f"n{i}", cpu=128) for i in range(12)], policy)
    for number, request in enumerate(requests):
        assert isinstance(state.place(request, f"task-{number}"), Allocation)
    assert policy.meter.shapes == typical_shapes(requests)
    assert [shape.gpu_count for shape in policy.meter.shapes] == [1]


def test_a_learned_mix_is_read_again_when_it_changes_and_kept_while_it_holds() -> None:
    # Reading the mix again empties the memoised fragments (slow decisions after it), so a mix that holds is
    # kept; a mix that moves must still be followed.
    small = Request(cpu_milli=4000, memory_mib=8192, gpu=WholeGpus(1))
    large = Request(cpu_milli=32_000, memory_mib=65_536, gpu=WholeGpus(1))
    policy = policy_by_name("gpupool")
    state = PoolState([eight_gpu_node(f"n{i}", cpu=128) for i in range(40)], policy)

    placed = iter(range(1_000))

    def place(requests: list[Request]) -> None:
        for request in requests:
            assert isinstance(state.place(request, f"task-{next(placed)}"), Allocation)

    place([small, large] * 32)  # 64 tasks, half and half
    settled = policy.meter
    place([small, large] * 32)  # 128: the same mix
    assert policy.meter is settled
    place([small] * 128)  # 256: three small tasks in four
    assert {(shape.cpu_milli, shape.weight) for shape in policy.meter.shapes} == {
        (4000, 0.75),
        (32_000, 0.25),
    }
