"""Reading the pool from Kubernetes objects, without a cluster: GPU Feature Discovery labels and allocatable
resources into nodes (MIG layouts from per-node counts, the three strategies, time-slicing), node health in
words, other workloads' usage from pods, and a lease's grants back into resource limits."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kube_cluster import l4_node, load_fixture

from gpupool.spawner.inventory import describe_pool, render_pool
from gpupool.spawner.kube.gfd import NodeLabelError
from gpupool.spawner.kube.labels import node_problem, parse_node
from gpupool.spawner.kube.local.nodes import node_object, node_resources
from gpupool.spawner.kube.mig_layout import lay_out
from gpupool.spawner.kube.pod_usage import external_usage
from gpupool.spawner.kube.resources import kube_grant, outside_use
from gpupool.spawner.pool.devices import GpuMode, pool_is_simulated
from gpupool.spawner.pool.mig import Placement, geometry, layout_problem
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus
from gpupool.spawner.pool.state import Allocation, OutsideUse, PoolState

H100 = load_fixture("dgx-h100-mixed")
A100 = load_fixture("a100-40gb")


def _with(node: dict[str, Any], labels: dict[str, str] | None = None, **allocatable: str) -> dict[str, Any]:
    changed = copy.deepcopy(node)
    changed["metadata"]["labels"].update(labels or {})
    changed["status"]["allocatable"] = {"cpu": "64", "memory": "512Gi"} | {
        k.replace("__", "/").replace("_", "-"): v for k, v in allocatable.items()
    }
    return changed


def _legal(node: Any) -> None:
    for gpu in node.gpus:
        if gpu.mode is GpuMode.MIG:
            layout = [Placement(m.start, m.profile) for m in gpu.mig_instances]
            assert layout_problem(geometry(gpu.product), layout) is None, layout


def test_the_mixed_h100_node_keeps_six_whole_gpus_and_lays_its_mig_counts_out_legally() -> None:
    kube = parse_node(H100)
    node = kube.node
    assert kube.mig_strategy == "mixed" and kube.problem is None
    assert (node.cpu_milli, node.memory_mib) == (222_000, 2_063_554)
    assert [g.mode for g in node.gpus] == [GpuMode.WHOLE] * 6 + [GpuMode.MIG] * 2
    assert {g.product for g in node.gpus} == {"H100-80GB"} and node.gpus[0].memory_mib == 81559
    assert (node.gpus[0].compute_capability, node.gpus[0].driver_version) == ("9.0", "550.54.15")
    instances = [m for g in node.gpus for m in g.mig_instances]
    assert sorted(m.uuid for m in instances if m.profile == "3g.40gb") == [
        f"k8s-dgx-h100-01-3g.40gb-{n}" for n in range(3)
    ]
    assert sorted(m.profile for m in instances) == ["1g.10gb"] * 2 + ["2g.20gb"] + ["3g.40gb"] * 3
    _legal(node)
    assert parse_node(H100).node == node  # the same labels give the same UUIDs: leases survive restarts


def test_only_the_nodes_gpupool_kube_up_registers_are_listed_as_simulated() -> None:
    """A trial of the Kubernetes demo took its simulated H100s for real ones. gpupool's kubelet marks its nodes
    (``gpupool.io/simulated=true``); a real cluster's, as GPU Feature Discovery labels them, lack the mark."""
    real = [parse_node(H100).node, parse_node(A100).node]
    assert not any(node.simulated for node in real) and not pool_is_simulated(real)
    pooled = l4_node("l4-sim")  # a pool file's node, as gpupool kube up registers it
    registered = node_object(pooled) | {"status": {"allocatable": node_resources(pooled)}}
    stand_in = parse_node(registered).node
    assert stand_in.simulated and stand_in.labels["gpupool.io/backend"] == "kubernetes"
    listed = render_pool(describe_pool(PoolState([*real, stand_in]), "kubernetes", "Kubernetes API"))
    assert listed.startswith("Pool from Kubernetes API (kubernetes, simulated: not real GPUs)\n"), listed
    node_lines = {line.split()[0]: line for line in listed.splitlines() if "  CPU " in line}
    assert "  simulated  " in node_lines["l4-sim"], node_lines
    assert "simulated" not in node_lines["dgx-h100-01"] + node_lines["gpu-a100-01"], node_lines
    assert "simulated" not in render_pool(describe_pool(PoolState(real), "kubernetes", "Kubernetes API"))


def test_all_balanced_on_every_gpu_gives_every_gpu_the_same_layout() -> None:
    counts = {"1g.10gb": 16, "2g.20gb": 8, "3g.40gb": 8}
    node = parse_node(
        _with(
            H100,
            {"nvidia.com/mig.config": "all-balanced"},
            **{f"nvidia.com__mig_{p}": str(n) for p, n in counts.items()},
        )
    ).node
    assert all(g.mode is GpuMode.MIG for g in node.gpus) and len(node.gpus) == 8
    assert len({tuple((m.profile, m.start) for m in g.mig_instances) for g in node.gpus}) == 1
    _legal(node)


def test_counts_that_need_a_search_still_get_legal_layouts_and_impossible_ones_are_refused() -> None:
    geo = geometry("H100-80GB")
    layouts = lay_out(geo, {"3g.40gb": 3, "2g.20gb": 1, "1g.10gb": 2}, 2)  # first-fit alone would fail
    assert layouts is not None and len(layouts) == 2
    assert all(layout_problem(geo, layout) is None for layout in layouts)
    assert lay_out(geo, {"1g.10gb": 15}, 2) is None
    with pytest.raises(NodeLabelError, match=r"node dgx-h100-01: allocatable MIG instances \(3 × 7g.80gb\)"):
        parse_node(_with(H100, {"nvidia.com/gpu.count": "2"}, **{"nvidia.com__mig_7g.80gb": "3"}))


def test_the_single_strategy_splits_every_gpu_alike_and_grants_nvidia_com_gpu() -> None:
    labels = {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
              "nvidia.com/gpu.count": "28", "nvidia.com/gpu.memory": "4864"}  # fmt: skip
    node = parse_node(_with(A100, labels, nvidia__com__gpu="28")).node
    assert len(node.gpus) == 4 and all(len(g.mig_instances) == 7 for g in node.gpus)
    assert node.gpus[0].memory_mib == 40 * 1024  # the label is a slice's memory under this strategy
    _legal(node)
    pool = PoolState([node])
    held = pool.place(Request(0, 0, MigSlice(profile="1g.5gb")), "lease-1")
    assert isinstance(held, Allocation)
    assert kube_grant(node, held.grants).limits == {"nvidia.com/gpu": 1}
    assert outside_use(node, {"nvidia.com/gpu": 3}) == OutsideUse(mig={"*": 3})


def test_grants_become_the_resource_names_the_device_plugin_serves() -> None:
    h100 = parse_node(H100).node
    pool = PoolState([h100])
    whole = pool.place(Request(0, 0, WholeGpus(2)), "two")
    mig = pool.place(Request(0, 0, MigSlice(profile="3g.40gb")), "slice")
    assert isinstance(whole, Allocation) and isinstance(mig, Allocation)
    assert kube_grant(h100, whole.grants).limits == {"nvidia.com/gpu": 2}
    assert kube_grant(h100, mig.grants).limits == {"nvidia.com/mig-3g.40gb": 1}
    assert kube_grant(h100, whole.grants).node == "dgx-h100-01"


def test_a_time_sliced_node_has_shared_gpus_and_grants_the_configured_shared_resource() -> None:
    node = parse_node(
        _with(A100, {"nvidia.com/gpu.replicas": "4"}, **{"example.org__shared-gpu": "16"}),
        shared_resource="example.org/shared-gpu",
    ).node
    assert [(g.mode, g.max_shares) for g in node.gpus] == [(GpuMode.SHARED, 4)] * 4
    share = PoolState([node]).place(Request(0, 0, GpuShare(250)), "share")
    assert isinstance(share, Allocation)
    assert kube_grant(node, share.grants, shared_resource="example.org/shared-gpu").limits == {
        "example.org/shared-gpu": 1
    }


def test_a_me_slice_is_read_from_the_device_plugins_resource_name_and_granted_by_it() -> None:
    """The device plugin serves ``1g.10gb+me`` as ``nvidia.com/mig-1g.10gb.me`` (``+`` is not allowed in a
    resource name): read back as the profile, and asked for by that name."""
    h100 = _with(
        H100,
        {"nvidia.com/mig.config": "custom"},
        **{"nvidia.com__gpu": "7", "nvidia.com__mig-1g.10gb.me": "1", "nvidia.com__mig-3g.40gb": "1"},
    )
    node = parse_node(h100).node
    assert sorted(m.profile for g in node.gpus for m in g.mig_instances) == ["1g.10gb+me", "3g.40gb"]
    _legal(node)
    slice_ = PoolState([node]).place(Request(0, 0, MigSlice(profile="1g.10gb+me")), "me")
    assert isinstance(slice_, Allocation)
    assert kube_grant(node, slice_.grants).limits == {"nvidia.com/mig-1g.10gb.me": 1}
    usage = outside_use(node, {"nvidia.com/mig-1g.10gb.me": 1})
    assert usage.mig == {"1g.10gb+me": 1}


@pytest.mark.parametrize("strategy", ["time-slicing", "mps"])
def test_shared_gpus_that_keep_the_name_nvidia_com_gpu_are_shares_never_whole_gpus(strategy: str) -> None:
    """The device plugin's default (``renameByDefault: false``): 4 GPUs × 4 replicas are served as 16
    ``nvidia.com/gpu`` with GFD's sharing labels and a ``-SHARED`` product; they are 4 shared A100s."""
    labels = {
        "nvidia.com/gpu.sharing-strategy": strategy,
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED",
    }
    node = parse_node(_with(A100, labels, **{"nvidia.com__gpu": "16"})).node
    assert [(g.product, g.mode, g.max_shares) for g in node.gpus] == [("A100-40GB", GpuMode.SHARED, 4)] * 4
    pool = PoolState([node])
    assert not isinstance(pool.place(Request(0, 0, WholeGpus(1)), "whole"), Allocation)
    share = pool.place(Request(0, 0, GpuShare(250)), "share")
    assert isinstance(share, Allocation)
    assert kube_grant(node, share.grants).limits == {"nvidia.com/gpu": 1}  # one replica, by its real name
    assert outside_use(node, {"nvidia.com/gpu": 3}) == OutsideUse(whole_gpus=0, mig={}, shares=3)


@pytest.mark.parametrize("renamed", [False, True])
@pytest.mark.parametrize("strategy", ["time-slicing", "mps"])
def test_a_shares_memory_cap_is_set_under_mps_and_said_to_be_unenforced_under_time_slicing(
    strategy: str, renamed: bool
) -> None:
    """Under MPS a share's profile memory cap becomes the pod's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; time-slicing
    cannot cap memory, so the grant says so; with or without the device plugin's renameByDefault."""
    labels = {"nvidia.com/gpu.sharing-strategy": strategy, "nvidia.com/gpu.replicas": "4"}
    if renamed:
        node = parse_node(_with(A100, labels, **{"nvidia.com__gpu.shared": "16"})).node
    else:
        labels["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-40GB-SHARED"
        node = parse_node(_with(A100, labels, **{"nvidia.com__gpu": "16"})).node
    pool = PoolState([node])
    capped = pool.place(Request(0, 0, GpuShare(250, memory_mib=6144)), "capped")
    uncapped = pool.place(Request(0, 0, GpuShare(250)), "uncapped")
    assert isinstance(capped, Allocation) and isinstance(uncapped, Allocation)
    grant = kube_grant(node, capped.grants)
    assert grant.limits == {("nvidia.com/gpu.shared" if renamed else "nvidia.com/gpu"): 1}
    if strategy == "mps":
        assert (dict(grant.environment), grant.note) == ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6144M"}, "")
    else:
        assert not grant.environment and "6 GiB GPU memory cap is not enforced" in grant.note
    plain = kube_grant(node, uncapped.grants)  # no cap asked: nothing to set or say
    assert not plain.environment and not plain.note


def test_a_node_with_a_mig_profile_its_gpu_lacks_is_refused_naming_the_node() -> None:
    odd = _with(
        H100, {"nvidia.com/mig.config": "custom"}, **{"nvidia.com__gpu": "7", "nvidia.com__mig-5g.60gb": "1"}
    )
    with pytest.raises(NodeLabelError, match=r"node dgx-h100-01: .*5g\.60gb"):
        parse_node(odd)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}},
         "it is NotReady (KubeletNotReady)"),
        ({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}, "unknown state"),
        ({"spec": {"unschedulable": True}}, "it is cordoned (spec.unschedulable)"),
        ({"spec": {"taints": [{"key": "maintenance", "value": "bios", "effect": "NoExecute"}]}},
         "it has the taint maintenance=bios:NoExecute"),
        ({"metadata": {"labels": {"nvidia.com/mig.config.state": "failed"}}}, "MIG reconfiguration failed"),
        ({"metadata": {"labels": {"nvidia.com/mig.config.state": "pending"}}}, "reconfiguration is pending"),
    ],
)  # fmt: skip
def test_a_node_that_must_not_take_work_says_why(change: dict[str, Any], said: str) -> None:
    node = copy.deepcopy(A100)
    for section, values in change.items():
        for key, value in values.items():
            if isinstance(value, dict):
                node[section][key].update(value)
            elif key == "conditions":
                node[section][key] = value
            else:
                node[section][key] = value
    problem = node_problem(node)
    assert problem is not None and said in problem


def test_the_gpu_taint_and_a_prefer_no_schedule_taint_leave_a_node_healthy() -> None:
    node = copy.deepcopy(A100)
    node["spec"]["taints"].append({"key": "soft", "effect": "PreferNoSchedule"})
    assert node_problem(node) is None


def _pod(node: str | None, limits: dict[str, str], phase: str = "Running", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "x", "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}],
                 "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]},
        "status": {"phase": phase},
    }  # fmt: skip


def test_usage_counts_bound_unfinished_pods_of_other_workloads_only() -> None:
    pods = [
        _pod("a", {"nvidia.com/gpu": "2", "cpu": "4"}),
        _pod("a", {"nvidia.com/gpu": "1"}),  # its init container needs 3 at once: 3 count
        _pod("b", {"nvidia.com/mig-3g.40gb": "1"}, phase="Pending"),
        _pod("a", {"nvidia.com/gpu": "4"}, phase="Succeeded"),
        _pod(None, {"nvidia.com/gpu": "4"}, phase="Pending"),  # not scheduled yet: holds nothing
        _pod(
            "a", {"nvidia.com/gpu": "4"}, **{"gpupool.io/lease": "abc"}
        ),  # gpupool's own: its lease counts it
    ]
    assert external_usage(pods) == {
        "a": {"nvidia.com/gpu": 6},
        "b": {"nvidia.com/gpu": 3, "nvidia.com/mig-3g.40gb": 1},
    }


def test_outside_use_holds_free_devices_and_says_what_did_not_fit() -> None:
    h100 = parse_node(H100).node
    pool = PoolState([h100])
    assert pool.hold_outside("dgx-h100-01", OutsideUse(whole_gpus=5, mig={"3g.40gb": 4})) == (
        "1 MIG 3g.40gb instance(s)"
    )
    assert isinstance(pool.place(Request(0, 0, WholeGpus(1)), "mine"), Allocation)
    assert not isinstance(pool.place(Request(0, 0, WholeGpus(1)), "more"), Allocation)
    assert pool.hold_outside("dgx-h100-01", OutsideUse()) is None  # replaced: everything outside is back
    assert isinstance(pool.place(Request(0, 0, WholeGpus(5)), "more"), Allocation)
    assert pool.check_invariants() == []


def test_a_bad_quantity_names_the_node_and_field() -> None:
    node = copy.deepcopy(A100)
    node["status"]["allocatable"]["cpu"] = "lots"
    with pytest.raises(
        NodeLabelError, match=r"node gpu-a100-01: status.allocatable.cpu: expected a Kubernetes quantity"
    ):
        parse_node(node)
