"""Whatever a pool file holds, loading it gives a whole pool or a PoolFileError: never a crash, never half."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yaml_damage import yaml_values

from gpupool.spawner.backends.simulated import DEMO_POOL, PoolFileError, load_pool_file, parse_pool
from gpupool.spawner.pool.state import PoolState

DEMO = yaml.safe_load(DEMO_POOL.read_text())
values = yaml_values(
    ["3g.40gb@2", "9g.1gb", "H100-80GB", "L4-24GB", "all", "512GiB", "lots", "@", "7g.80gb@0"],
    ["name", "cpu", "memory", "gpus", "mig", "shared", "product", "count", "nvlink", 6, "all"],
    largest=200,
)


@st.composite
def damaged_demo(draw: st.DrawFn) -> object:
    """The demo pool with one field somewhere replaced by something random."""
    data = yaml.safe_load(DEMO_POOL.read_text())
    node = draw(st.sampled_from(data["nodes"]))
    target: dict[object, object] = node
    if "gpus" in node and draw(st.booleans()):
        target = node["gpus"]
    key = draw(st.sampled_from([*target.keys(), "extra"]))
    target[key] = draw(values)
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_demo())
def test_a_damaged_pool_file_loads_whole_or_raises_a_pool_file_error(data: object) -> None:
    try:
        nodes = parse_pool(data, "demo.yaml")
    except PoolFileError as error:
        assert str(error).startswith("demo.yaml: ")
        return
    assert len(nodes) == len(DEMO["nodes"])
    assert PoolState(nodes).check_invariants() == []


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_bytes_are_a_pool_file_error(tmp_path_factory: object, content: bytes) -> None:
    path = Path(str(tmp_path_factory.mktemp("pool"))) / "pool.yaml"  # type: ignore[attr-defined]
    path.write_bytes(content)
    try:
        nodes = load_pool_file(path)
    except PoolFileError as error:
        assert str(path) in str(error) or "pool.yaml" in str(error)
    else:
        assert nodes, "a file that loads must hold nodes"
