"""The simulated backend: pool files become the same nodes every time, and every mistake is named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpupool.spawner.backends.simulated import (
    DEMO_POOL,
    PoolFileError,
    load_pool_file,
    parse_pool,
)
from gpupool.spawner.pool.devices import (
    BACKEND_LABEL,
    SIMULATED_LABEL,
    GpuMode,
    Health,
    Node,
    pool_is_simulated,
)
from gpupool.spawner.pool.mig import GEOMETRIES, Placement, layout_problem
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import Allocation, PoolState

POOLS = Path(__file__).parent / "pools"
NODE = "nodes:\n  - name: gpu-a\n    cpu: 8\n    memory: 64GiB\n"
H100_NODE = NODE + "    gpus: {product: H100-80GB, count: 8}\n"


def parse(text: str) -> tuple[Node, ...]:
    data: object = yaml.safe_load(text)
    return parse_pool(data, "pool.yaml")


def problem(text: str) -> str:
    with pytest.raises(PoolFileError) as caught:
        parse(text)
    return str(caught.value)


def by_name(nodes: tuple[Node, ...]) -> dict[str, Node]:
    return {node.name: node for node in nodes}


# ---- the demo pool -------------------------------------------------------------------------------------


def test_demo_pool_ships_inside_the_package_and_holds_a_mixed_pool() -> None:
    nodes = by_name(load_pool_file(DEMO_POOL))
    assert DEMO_POOL.name == "demo.yaml" and DEMO_POOL.is_file()
    dgx, a100, l4, cpu = nodes["dgx-h100-01"], nodes["a100-01"], nodes["l4-01"], nodes["cpu-01"]
    assert [g.mode for g in dgx.gpus] == [GpuMode.WHOLE] * 6 + [GpuMode.MIG] * 2
    assert {g.nvlink_group for g in dgx.gpus} == {0} and {g.nvlink_group for g in a100.gpus} == {0}
    assert [str(Placement(m.start, m.profile)) for m in dgx.gpus[6].mig_instances] == [
        "3g.40gb@0",
        "3g.40gb@4",
    ]
    assert len(dgx.gpus[7].mig_instances) == 4
    assert a100.products == {"A100-40GB"} and len(a100.gpus) == 4
    assert [(g.mode, g.max_shares) for g in l4.gpus] == [(GpuMode.SHARED, 4)] * 4
    assert cpu.gpus == ()


def test_every_demo_node_says_it_is_simulated() -> None:
    nodes = load_pool_file(DEMO_POOL)
    assert all(node.labels[BACKEND_LABEL] == "simulated" and node.simulated for node in nodes)
    assert pool_is_simulated(nodes)


def test_demo_pool_places_a_whole_h100_a_3g_slice_an_l4_share_and_cpu_only_work() -> None:
    pool = PoolState(load_pool_file(DEMO_POOL))
    asks = {
        "whole": Request(4000, 32768, WholeGpus(1, frozenset({"H100-80GB"}))),
        "mig": Request(2000, 16384, MigSlice(profile="3g.40gb")),
        "share": Request(1000, 8192, GpuShare(250, products=frozenset({"L4-24GB"}))),
        "cpu": Request(1000, 4096),
    }
    placed = {owner: pool.place(request, owner) for owner, request in asks.items()}
    assert all(isinstance(a, Allocation) for a in placed.values()), placed
    allocations = {owner: a for owner, a in placed.items() if isinstance(a, Allocation)}
    assert allocations["whole"].node == "dgx-h100-01"
    assert allocations["whole"].grants[0].kind == "gpu"
    assert allocations["mig"].grants[0].label.startswith("3g.40gb on H100-80GB")
    assert allocations["mig"].visible_devices.startswith("MIG-")
    assert allocations["share"].node == "l4-01" and allocations["share"].grants[0].kind == "share"
    assert allocations["cpu"].grants == ()
    assert pool.check_invariants() == []


def test_an_l4_takes_at_most_four_holders_at_once() -> None:
    pool = PoolState(n for n in load_pool_file(DEMO_POOL) if n.name == "l4-01")
    ask = Request(100, 256, GpuShare(100))
    allocations = [pool.place(ask, f"user{i}") for i in range(17)]
    assert sum(isinstance(a, Allocation) for a in allocations) == 16


# ---- what a good file builds ------------------------------------------------------------------------


def test_uuids_are_the_same_on_every_load() -> None:
    first, second = load_pool_file(DEMO_POOL), load_pool_file(str(DEMO_POOL))
    assert first == second
    uuids = [g.uuid for n in first for g in n.gpus] + [
        m.uuid for n in first for g in n.gpus for m in g.mig_instances
    ]
    assert len(set(uuids)) == len(uuids)


def test_uuids_look_like_nvml_uuids() -> None:
    shape = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    dgx = by_name(load_pool_file(DEMO_POOL))["dgx-h100-01"]
    assert all(re.fullmatch(f"GPU-{shape}", g.uuid) for g in dgx.gpus)
    instances = [m for g in dgx.gpus for m in g.mig_instances]
    assert instances and all(re.fullmatch(f"MIG-{shape}", m.uuid) for m in instances)
    assert all(m.parent_uuid == dgx.gpus[6].uuid for m in dgx.gpus[6].mig_instances)


def test_the_same_gpu_index_on_two_nodes_gets_two_uuids() -> None:
    text = (
        NODE
        + "    gpus: {product: T4, count: 1}\n"
        + "  - {name: gpu-b, cpu: 8, memory: 64GiB, gpus: {product: T4, count: 1}}\n"
    )
    a, b = parse(text)
    assert a.gpus[0].uuid != b.gpus[0].uuid


def test_mig_instances_without_a_start_are_placed_legally() -> None:
    node = by_name(load_pool_file(POOLS / "small.yaml"))["a100-80-01"]
    gpu = node.gpus[1]
    layout = [Placement(m.start, m.profile) for m in gpu.mig_instances]
    assert sorted(p.profile for p in layout) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert layout_problem(GEOMETRIES["A100-80GB"], layout) is None
    assert [m.start for m in gpu.mig_instances] == sorted(m.start for m in gpu.mig_instances)


def test_mig_instance_memory_comes_from_the_profile_name() -> None:
    dgx = by_name(load_pool_file(DEMO_POOL))["dgx-h100-01"]
    assert [m.memory_mib for m in dgx.gpus[7].mig_instances] == [20480, 20480, 20480, 10240]


def test_product_spellings_become_canonical_and_gpu_memory_comes_from_the_product() -> None:
    nodes = by_name(load_pool_file(POOLS / "small.yaml"))
    a100, t4 = nodes["a100-80-01"].gpus[0], nodes["t4-01.example.org"].gpus[0]
    assert (a100.product, a100.memory_mib, a100.compute_capability) == ("A100-80GB", 81920, "8.0")
    assert (t4.product, t4.memory_mib, t4.compute_capability, t4.driver_version) == (
        "T4-16GB",
        16384,
        "7.5",
        "535",
    )


def test_cpu_memory_labels_and_health_are_read_in_every_documented_form() -> None:
    nodes = by_name(load_pool_file(POOLS / "small.yaml"))
    a100, t4, cpu = nodes["a100-80-01"], nodes["t4-01.example.org"], nodes["cpu-01"]
    assert (a100.cpu_milli, a100.memory_mib) == (16500, 131072)
    assert (t4.memory_mib, cpu.memory_mib) == (32768, 16384)
    assert a100.labels == {"zone": "1", "spot": "true", BACKEND_LABEL: "simulated", SIMULATED_LABEL: "true"}
    assert t4.health is Health.DRAINED and cpu.health is Health.HEALTHY


def test_a_shared_index_overrides_all_and_unhealthy_marks_single_gpus() -> None:
    t4 = by_name(load_pool_file(POOLS / "small.yaml"))["t4-01.example.org"]
    assert [g.max_shares for g in t4.gpus] == [2, 8]
    assert [g.health for g in t4.gpus] == [Health.UNHEALTHY, Health.HEALTHY]


def test_nvlink_index_lists_make_one_group_each() -> None:
    (node,) = parse(NODE + "    gpus: {product: A100-40GB, count: 4, nvlink: [[0, 1], [2, 3]]}\n")
    assert [g.nvlink_group for g in node.gpus] == [0, 0, 1, 1]
    (unlinked,) = parse(NODE + "    gpus: {product: A100-40GB, count: 2}\n")
    assert [g.nvlink_group for g in unlinked.gpus] == [None, None]


def test_a_node_without_gpus_is_cpu_only() -> None:
    (node,) = parse(NODE)
    assert node.gpus == () and node.cpu_milli == 8000 and node.memory_mib == 65536


# ---- what a bad file says ---------------------------------------------------------------------------


def test_mig_instance_at_an_illegal_slot_names_node_gpu_and_legal_starts() -> None:
    message = problem(H100_NODE + "    mig: {2: [3g.40gb@2]}\n")
    expected = "3g.40gb cannot start at slot 2 on H100-80GB; legal starts are 0 and 4"
    assert message == f"pool.yaml: node gpu-a, gpu 2: {expected}"


def test_a_missing_name_names_the_node_by_position() -> None:
    text = NODE + "  - {name: gpu-b, cpu: 1, memory: 1GiB}\n  - {cpu: 1, memory: 1GiB}\n"
    assert problem(text) == "pool.yaml: node 3: missing required field 'name'"


def test_unreadable_memory_says_what_is_expected() -> None:
    assert problem(NODE.replace("64GiB", "lots")) == (
        "pool.yaml: node gpu-a: memory must be like 512GiB or an integer of MiB, got 'lots'"
    )


@pytest.mark.parametrize(
    ("gpus", "said"),
    [
        (
            '{product: A100-80GB, count: 1, compute_capability: "7.0"}',
            "gpus.compute_capability: a A100-80GB has 8.0, not 7.0 (leave it out for 8.0)",
        ),
        (
            '{product: H100, count: 1, driver_version: "550.54.15", cuda_version: "99.9"}',
            "gpus.cuda_version: driver 550.54.15 runs CUDA up to 12.4, not 99.9",
        ),
    ],
)
def test_a_gpu_the_pool_file_describes_impossibly_is_refused(gpus: str, said: str) -> None:
    """A trial's A100 at compute capability 7.0, and CUDA 99.9 on driver 550, were taken as written."""
    assert problem(NODE + f"    gpus: {gpus}\n") == f"pool.yaml: node gpu-a: {said}"


def test_memory_in_tib_is_read() -> None:
    """A trial's ``memory: 512TiB`` was refused as "must be like 512GiB"."""
    assert parse(NODE.replace("64GiB", "2TiB"))[0].memory_mib == 2 * 1024 * 1024


def test_an_unknown_product_lists_the_known_ones() -> None:
    message = problem(NODE + "    gpus: {product: X9000, count: 2}\n")
    assert message.startswith("pool.yaml: node gpu-a: gpus.product: unknown GPU product 'X9000'")
    assert "H100-80GB" in message and "L4-24GB" in message


def test_mig_on_a_product_without_mig_is_refused() -> None:
    message = problem(NODE + "    gpus: {product: L4, count: 2}\n    mig: {1: [1g.10gb]}\n")
    assert message.startswith(
        "pool.yaml: node gpu-a, gpu 1: L4-24GB does not support MIG; MIG-capable products are"
    )


@pytest.mark.parametrize("field", ["mig: {8: [1g.10gb]}", "shared: {9: 2}", "unhealthy: [8]"])
def test_a_gpu_index_out_of_range_names_the_range(field: str) -> None:
    message = problem(H100_NODE + f"    {field}\n")
    assert message.startswith("pool.yaml: node gpu-a: ")
    assert "is out of range; the node has 8, indices 0-7" in message


def test_an_nvlink_index_out_of_range_is_refused() -> None:
    message = problem(NODE + "    gpus: {product: A100-40GB, count: 2, nvlink: [[0, 2]]}\n")
    assert message == "pool.yaml: node gpu-a: gpus.nvlink: gpu 2 is out of range; the node has 2, indices 0-1"


def test_duplicate_node_names_are_refused() -> None:
    assert (
        problem(NODE + NODE[7:])
        == "pool.yaml: node gpu-a: name is used by nodes 1 and 2; node names must be unique"
    )


def test_an_unknown_field_is_named_with_a_suggestion_and_the_allowed_ones() -> None:
    message = problem(NODE + "    gpu: {product: H100, count: 8}\n")
    assert message.startswith(
        "pool.yaml: node gpu-a: unknown field 'gpu' (did you mean 'gpus'?); allowed fields are"
    )
    assert "mig, shared, unhealthy" in message


def test_an_unknown_gpus_field_is_named() -> None:
    message = problem(NODE + "    gpus: {product: H100, count: 8, nvlnk: true}\n")
    assert (
        "unknown field 'nvlnk' in gpus (did you mean 'nvlink'?); allowed fields are product, count" in message
    )


def test_a_yaml_syntax_error_gives_the_line() -> None:
    with pytest.raises(PoolFileError, match=r"syntax-error\.yaml: line 5, column 4: invalid YAML: "):
        load_pool_file(POOLS / "syntax-error.yaml")


def test_a_duplicate_yaml_key_is_refused_with_its_line() -> None:
    with pytest.raises(
        PoolFileError, match=r"duplicate-key\.yaml: line 8, column 7: invalid YAML: duplicate key 6"
    ):
        load_pool_file(POOLS / "duplicate-key.yaml")


@pytest.mark.parametrize(
    ("text", "got"),
    [("", "nothing"), ("- a\n- b\n", "a list"), ("pool: {}\n", "a mapping"), ("42\n", "int 42")],
    ids=["empty", "list", "no-nodes", "number"],
)
def test_a_file_that_is_not_a_mapping_with_nodes_is_refused(text: str, got: str) -> None:
    assert problem(text) == f"pool.yaml: expected a mapping with a 'nodes' list at the top, got {got}"


def test_an_empty_node_list_and_extra_top_level_fields_are_refused() -> None:
    assert problem("nodes: []\n") == "pool.yaml: 'nodes' must be a non-empty list of nodes, got an empty list"
    assert "unknown field 'node' at the top (did you mean 'nodes'?)" in problem(NODE + "node: 1\n")


def test_a_missing_file_is_a_pool_file_error(tmp_path: Path) -> None:
    with pytest.raises(PoolFileError, match=r"missing\.yaml: cannot read the pool file: No such file"):
        load_pool_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("    mig: {2: [3g.40gb@0, 4g.40gb@0]}\n", "gpu 2: 4g.40gb@0 overlaps 3g.40gb@0 at memory slice 0"),
        (
            "    mig: {2: [3g.40gb, 3g.40gb, 3g.40gb]}\n",
            "gpu 2: cannot place 3g.40gb, 3g.40gb, 3g.40gb on one",
        ),
        (
            "    mig: {2: [4g.40gb@0, 2g.20gb, 2g.20gb]}\n",
            "next to 4g.40gb@0 on one H100-80GB: they need 8 compute",
        ),
        (
            "    mig: {2: [5g.40gb]}\n",
            "gpu 2: H100-80GB has no MIG profile '5g.40gb'; its profiles are 1g.10gb",
        ),
        ("    mig: {2: [3g.40gb@left]}\n", "gpu 2: MIG instances are written 'profile@start'"),
        ("    mig: {2: []}\n", "gpu 2: mig needs a non-empty list of instances"),
        ("    shared: {1: 2}\n    mig: {1: [7g.80gb]}\n", "gpu 1: a GPU cannot be both MIG and shared"),
        (
            "    shared: {all: 1}\n",
            "node gpu-a: shared must be a whole number of holders from 2 to 1000 (a thousandth of the GPU each), "
            "got 1",
        ),
        # an admin's trial: more holders than a GPU has thousandths, and a GPU marked unhealthy twice, loaded
        (
            "    shared: {0: 5000}\n",
            "node gpu-a: shared for gpu 0 must be a whole number of holders from 2 to 1000",
        ),
        ("    unhealthy: [1, 1]\n", "node gpu-a: unhealthy: gpu 1 is listed twice; name each GPU once"),
    ],
    ids=[
        "overlap",
        "too-many",
        "compute",
        "unknown-profile",
        "bad-start",
        "empty",
        "mig-and-shared",
        "one-holder",
        "too-many-holders",
        "unhealthy-twice",
    ],
)
def test_bad_mig_and_sharing_layouts_are_explained(extra: str, expected: str) -> None:
    message = problem(H100_NODE + extra)
    assert message.startswith("pool.yaml: node gpu-a") and expected in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (NODE.replace("gpu-a", "GPU_A"), "node 1: name must be a lowercase DNS name such as gpu-a"),
        (NODE.replace("    cpu: 8\n", ""), "node gpu-a: missing required field 'cpu'"),
        (NODE.replace("cpu: 8", "cpu: lots"), "node gpu-a: cpu must be a positive number of cores"),
        (NODE.replace("cpu: 8", "cpu: true"), "node gpu-a: cpu must be a positive number of cores"),
        (NODE.replace("64GiB", "64GB"), "node gpu-a: memory must be like 512GiB"),
        (NODE + "    health: sick\n", "health must be one of healthy, unhealthy, drained, got 'sick'"),
        (NODE + "    labels: [a]\n", "node gpu-a: labels must be a mapping"),
        (NODE + f"    labels: {{{BACKEND_LABEL}: real}}\n", "is set by the simulated backend"),
        (NODE + f"    labels: {{{SIMULATED_LABEL}: 'false'}}\n", "is set by the simulated backend"),
        (NODE + "    gpus: {count: 2}\n", "node gpu-a: missing required field 'gpus.product'"),
        (NODE + "    gpus: {product: T4, count: 0}\n", "gpus.count must be a whole number from 1 to 64, got 0"),
        (NODE + "    gpus: {product: T4, count: 1000000}\n", "gpus.count must be a whole number from 1 to 64"),
        (NODE + "    gpus: {product: T4, count: 2, driver_version: 535.10}\n", "must be a quoted version"),
        (NODE + "    gpus: {product: T4, count: 2, nvlink: [[0, 1], [1]]}\n", "gpu 1: gpus.nvlink puts"),
        (NODE + "    mig: {0: [1g.10gb]}\n", "node gpu-a: mig needs gpus, and this node declares none"),
        ("nodes: [gpu-a]\n", "node 1: expected a mapping with name, cpu and memory, got str 'gpu-a'"),
    ],
    ids=[
        "bad-name", "no-cpu", "cpu-text", "cpu-bool", "memory-unit", "health", "labels", "reserved-label",
        "simulated-label", "no-product", "zero-gpus", "a-million-gpus", "float-driver", "nvlink-twice", "mig-without-gpus", "node-not-mapping",
    ],
)  # fmt: skip
def test_other_field_mistakes_are_named(text: str, expected: str) -> None:
    message = problem(text)
    assert message.startswith("pool.yaml: ") and expected in message


def test_a_pool_file_has_documented_limits_and_says_which(tmp_path: Path) -> None:
    # a file declaring a million GPUs once ran past 60 s and 644 MB before the service could start
    many = "nodes:\n" + "".join(f"  - {{name: n{i}, cpu: 1, memory: 1GiB}}\n" for i in range(10_001))
    assert problem(many) == "pool.yaml: 'nodes' lists 10001 nodes; a pool file holds at most 10000"
    huge = tmp_path / "huge.yaml"
    huge.write_text(NODE + "# " + "x" * (4 * 2**20) + "\n")
    with pytest.raises(PoolFileError, match=r"huge.yaml: the pool file is larger than 4 MiB, the most read"):
        load_pool_file(huge)


def test_a_bad_last_node_is_reported_though_the_first_ones_are_fine() -> None:
    # Whole-or-nothing loading over many random files is in test_pool_file_properties.py.
    with pytest.raises(PoolFileError, match=r"node gpu-c, gpu 2: 4g.40gb cannot start at slot 4"):
        load_pool_file(POOLS / "bad-last-node.yaml")


def test_shared_all_leaves_mig_gpus_alone() -> None:
    nodes = parse_pool(
        {
            "nodes": [
                {
                    "name": "mixed",
                    "cpu": 32,
                    "memory": "256GiB",
                    "gpus": {"product": "H100-80GB", "count": 2},
                    "mig": {1: ["7g.80gb@0"]},
                    "shared": {"all": 4},
                }
            ]
        },
        "pool.yaml",
    )
    assert [g.mode for g in nodes[0].gpus] == [GpuMode.SHARED, GpuMode.MIG]


def test_infinite_cpu_is_a_pool_file_error() -> None:
    with pytest.raises(PoolFileError, match="node a: cpu must be a positive number of cores"):
        parse_pool({"nodes": [{"name": "a", "cpu": float("inf"), "memory": "1GiB"}]}, "pool.yaml")
