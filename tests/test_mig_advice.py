"""`gpupool mig advise` and the dashboard's MIG advice: layouts that serve the demand seen at least as well as
the current ones, written as a valid mig-parted config and pool-file fragments, for admins only."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_telemetry_api import USERS, Client, Service
from token_hub import token_hub

from gpupool.spawner.backends import discovery
from gpupool.spawner.backends.simulated import DEMO_POOL, load_pool_file, parse_pool
from gpupool.spawner.cli import main
from gpupool.spawner.client.connection import Connection
from gpupool.spawner.mig_report import describe_advice, mig_parted_config, pool_fragment, render_advice
from gpupool.spawner.pool import mig
from gpupool.spawner.pool.devices import Health
from gpupool.spawner.pool.mig import largest_first
from gpupool.spawner.pool.mig_advice import Ask, MigGpu, advise, ask_for, demand_of, mig_gpus, scaled_demand
from gpupool.spawner.pool.mig_layouts import candidate_layouts
from gpupool.spawner.pool.requests import GpuShare, MigSlice, Request, WholeGpus

PODS = Path(__file__).parent / "data" / "trace" / "pods_sample.csv"
PRODUCTS = ("H100-80GB", "A30-24GB")
LAYOUTS = {p: list(candidate_layouts(p).values()) for p in PRODUCTS}
PROFILES = {p: sorted(mig.geometry(p).profiles) for p in PRODUCTS}


def _ask(product: str, profile: str) -> Ask:
    found = ask_for(Request(1000, 1024, MigSlice(profile=profile)), [product])
    assert found is not None
    return found


def _gpus(layouts: list[tuple[str, tuple[mig.Placement, ...]]]) -> list[MigGpu]:
    return [MigGpu(f"node-{i // 2}", i % 2, product, layout) for i, (product, layout) in enumerate(layouts)]


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[MigGpu], Counter[Ask]]:
    """A few MIG GPUs in random legal layouts (some not maximal) and a random demand of named profiles."""
    layouts = []
    for _ in range(draw(st.integers(1, 4))):
        product = draw(st.sampled_from(PRODUCTS))
        full = draw(st.sampled_from(LAYOUTS[product]))
        layouts.append((product, tuple(draw(st.lists(st.sampled_from(full), min_size=1, unique=True)))))
    demand: Counter[Ask] = Counter()
    for _ in range(draw(st.integers(0, 6))):
        product = draw(st.sampled_from(PRODUCTS))
        demand[_ask(product, draw(st.sampled_from(PROFILES[product])))] += draw(st.integers(1, 9))
    for gb in draw(st.lists(st.sampled_from([5, 10, 20, 40, 80]), max_size=2)):  # asks that span products
        wide = ask_for(Request(1000, 1024, MigSlice(min_memory_gb=gb)), PRODUCTS)
        assert wide is not None
        demand[wide] += draw(st.integers(1, 5))
    return _gpus(layouts), demand


@given(situations())
@settings(max_examples=60, deadline=None)
def test_the_advice_never_serves_less_than_the_current_layouts_on_their_own_demand(
    situation: tuple[list[MigGpu], Counter[Ask]],
) -> None:
    gpus, demand = situation
    advice = advise(gpus, demand)
    assert (advice.after.served_units, advice.after.served) >= (
        advice.before.served_units,
        advice.before.served,
    )
    assert advice.after.key() >= advice.before.key()
    for gpu in advice.gpus:  # every advised layout is legal on its GPU's product
        assert mig.layout_problem(mig.geometry(gpu.gpu.product), gpu.advised) is None


@given(situations(), st.data())
@settings(max_examples=60, deadline=None)
def test_a_profile_the_hub_offers_keeps_a_slice_to_start_on_whatever_the_demand(
    situation: tuple[list[MigGpu], Counter[Ask]], data: st.DataObject
) -> None:
    gpus, demand = situation
    product = data.draw(st.sampled_from(PRODUCTS))
    offered = [
        _ask(product, name) for name in data.draw(st.sets(st.sampled_from(PROFILES[product]), max_size=3))
    ]
    advice = advise(gpus, demand, keep=offered)
    now = Counter((g.product, p.profile) for g in gpus for p in g.layout)
    advised = Counter((g.gpu.product, p.profile) for g in advice.gpus for p in g.advised)
    for ask in offered:
        if any(now[slot] for slot in ask.serves):
            assert any(advised[slot] for slot in ask.serves), (ask.label, advice.gpus)
    assert (advice.after.served_units, advice.after.served) >= (
        advice.before.served_units,
        advice.before.served,
    )


def test_advice_for_a_demand_of_small_slices_keeps_the_only_large_one_an_offered_profile_needs() -> None:
    """Stop 32's trial: the advice turned the only 3g.40gb into 1g slices, for fewer stranded slices alone,
    though the spawn form offers "MIG 3g.40gb", which then could never start."""
    h100 = mig.geometry("H100-80GB")
    gpus = _gpus([("H100-80GB", mig.fit(h100, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]) or ())])
    demand = Counter({_ask("H100-80GB", "1g.10gb"): 5})
    unkept = advise(gpus, demand)
    assert "3g.40gb" not in [p.profile for p in unkept.gpus[0].advised]  # what the search alone would do
    kept = advise(gpus, demand, keep=[_ask("H100-80GB", "3g.40gb")])
    assert "3g.40gb" in [p.profile for p in kept.gpus[0].advised] and kept.kept == ("3g.40gb",)
    assert kept.before.served < kept.after.served <= unkept.after.served  # still more than now


def test_a_demand_the_current_layouts_fit_exactly_changes_nothing() -> None:
    current = [("H100-80GB", mig.fit(mig.geometry("H100-80GB"), ["3g.40gb", "3g.40gb"]) or ())]
    current.append(("H100-80GB", mig.fit(mig.geometry("H100-80GB"), ["2g.20gb"] * 3 + ["1g.10gb"]) or ()))
    gpus = _gpus(current)
    demand = Counter({_ask("H100-80GB", "3g.40gb"): 2, _ask("H100-80GB", "2g.20gb"): 3})
    demand[_ask("H100-80GB", "1g.10gb")] = 1
    advice = advise(gpus, demand)
    assert advice.before.served == advice.after.served == 6 and advice.after.stranded == 0
    assert not any(g.changed for g in advice.gpus)
    assert [g.advised for g in advice.gpus] == [g.layout for g in gpus]


def test_unmet_demand_gets_the_layouts_that_serve_it_and_spare_slices_are_not_stranded() -> None:
    gpus = _gpus([("H100-80GB", mig.fit(mig.geometry("H100-80GB"), ["3g.40gb", "3g.40gb"]) or ())])
    advice = advise(gpus, Counter({_ask("H100-80GB", "1g.10gb"): 7}))
    assert (advice.before.served, advice.before.stranded) == (0, 2)  # two 3g free while seven 1g asks wait
    assert (advice.after.served, advice.after.stranded) == (7, 0)
    assert largest_first(p.profile for p in advice.gpus[0].advised) == ("1g.10gb",) * 7
    few = advise(gpus, Counter({_ask("H100-80GB", "3g.40gb"): 1}))
    assert few.before.free == 1 and few.before.stranded == 0 and not few.gpus[0].changed  # spare, kept


def test_a_share_asks_for_the_smallest_covering_profile_and_whole_gpus_ask_nothing() -> None:
    def label(request: Request) -> str | None:
        found = ask_for(request, ["H100-80GB"])
        return None if found is None else found.label

    assert label(Request(1000, 1024, GpuShare(250))) == "2g.20gb"
    assert label(Request(1000, 1024, GpuShare(460))) == "4g.40gb"
    assert label(Request(1000, 1024, GpuShare(100, memory_mib=15 * 1024))) == "1g.20gb"
    assert label(Request(1000, 1024, GpuShare(100, products=frozenset({"T4-16GB"})))) == "share of 100 milli"
    assert label(Request(1000, 1024, WholeGpus(1))) is None and label(Request(1000, 1024)) is None
    wide = ask_for(Request(1000, 1024, MigSlice(min_memory_gb=20)), ["H100-80GB"])
    assert wide is not None and wide.serves[0] == ("H100-80GB", "1g.20gb")  # the smallest that serves first


def test_a_trace_asking_more_than_the_mig_gpus_hold_is_shrunk_keeping_its_mix() -> None:
    big, small = _ask("H100-80GB", "7g.80gb"), _ask("H100-80GB", "1g.10gb")
    demand = Counter({big: 500, small: 700})  # 600 GPUs' worth
    shrunk = scaled_demand(demand, gpus=6)
    assert shrunk == Counter({big: 5, small: 7})
    assert scaled_demand(Counter({small: 3}), gpus=6) == Counter({small: 3})  # less than they hold: as it is
    assert scaled_demand(demand, gpus=6, load=2.0) == Counter({big: 10, small: 14})
    with pytest.raises(ValueError, match="load must be positive"):
        scaled_demand(demand, gpus=6, load=0)


def _demo_advice() -> tuple[Any, dict[str, Any]]:
    nodes = load_pool_file(DEMO_POOL)
    gpus = mig_gpus(nodes)
    demand = demand_of([Request(1000, 1024, GpuShare(100))] * 14, {g.product for g in gpus})
    advice = advise(gpus, demand)
    return advice, describe_advice(advice, "a test")


def test_the_mig_parted_config_is_the_mig_managers_schema_with_legal_layouts_only() -> None:
    advice, description = _demo_advice()
    config = yaml.safe_load(description["mig_parted"])
    assert config == mig_parted_config(advice) and config["version"] == "v1"
    ((name, entries),) = config["mig-configs"].items()
    assert name == "gpupool-dgx-h100-01"
    assert sorted(i for e in entries for i in e["devices"]) == [6, 7]
    for entry in entries:
        assert set(entry) == {"devices", "mig-enabled", "mig-devices"} and entry["mig-enabled"] is True
        assert all(isinstance(i, int) for i in entry["devices"])
        profiles = [p for p, n in entry["mig-devices"].items() for _ in range(n)]
        assert all(isinstance(n, int) and n > 0 for n in entry["mig-devices"].values())
        assert mig.fit(mig.geometry("H100-80GB"), profiles) is not None
    assert advice.after.served == 14 and advice.before.served < 14  # fourteen 1g asks: 2 × all-1g


def test_the_pool_file_fragments_load_into_the_pool_file_and_give_the_advised_layouts() -> None:
    advice, description = _demo_advice()
    fragment = yaml.safe_load(description["pool_file"])
    assert fragment == pool_fragment(advice)
    data = yaml.safe_load(DEMO_POOL.read_text())
    for part in fragment["nodes"]:
        target = next(n for n in data["nodes"] if n["name"] == part["name"])
        target["mig"] = part["mig"]
    layouts = {(g.node, g.index): g.layout for g in mig_gpus(parse_pool(data, "edited"))}
    for gpu in advice.gpus:
        assert mig.layout_problem(mig.geometry(gpu.gpu.product), gpu.advised) is None
        assert layouts[gpu.gpu.node, gpu.gpu.index] == gpu.advised


def test_the_cli_advises_from_the_committed_sample(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mig", "advise", "--trace", str(PODS), "--pool", str(DEMO_POOL)]) == 0
    out = capsys.readouterr().out
    assert "(100 asks shrunk to 3, 1 × the capacity of the 2 MIG GPUs, keeping their mix)" in out
    assert "demand (MIG slices asked for): 7g.80gb ×1, 4g.40gb ×1, 3g.40gb ×1" in out
    # the demo's profiles offer 1g.10gb and 3g.40gb: each keeps a slice, so the 4g ask still waits
    assert "kept a slice for each profile offered: 1g.10gb, 3g.40gb" in out
    assert "GPU-equivalents served: 0.43 of 2 → 1.43 of 2" in out and "asks waiting: 2 → 1" in out
    assert "gpupool never changes a MIG layout" in out and "version: v1" in out and "mig:" in out
    assert "2 GPU(s) on 1 node(s) to change" in out and "NODE" not in out
    assert "  kubectl label node dgx-h100-01 nvidia.com/mig.config=gpupool-dgx-h100-01 --overwrite\n" in out
    # a lab's single server has no MIG Manager: mig-parted itself applies the same config (a trial's pool)
    assert "  nvidia-mig-parted apply -f config.yaml -c gpupool-dgx-h100-01  # on dgx-h100-01\n" in out
    assert "# the MIG Manager's config.yaml (mig-parted's format), for its ConfigMap\nversion: v1" in out
    assert main(["mig", "advise", "--trace", str(PODS), "--pool", str(DEMO_POOL), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["after"]["served_gpus"] >= data["before"]["served_gpus"]


def test_advice_that_changes_nothing_says_so_and_no_steps(capsys: pytest.CaptureFixture[str]) -> None:
    nodes = load_pool_file(DEMO_POOL)
    gpus = mig_gpus(nodes)
    exact = [MigSlice("3g.40gb")] * 2 + [MigSlice("2g.20gb")] * 3 + [MigSlice("1g.10gb")]
    demand = demand_of([Request(1000, 1024, need) for need in exact], {g.product for g in gpus})
    text = render_advice(describe_advice(advise(gpus, demand), "a test"))
    assert "Nothing to change: the current layouts of the 2 MIG GPU(s) serve this demand" in text
    assert "empty each GPU" not in text and "kubectl" not in text and "config.yaml" not in text


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--pool", str(DEMO_POOL)], "--pool goes with --trace"),
        (["--load", "2"], "--load goes with --trace"),
        (["--trace", str(PODS), "--url", "http://x/services/gpupool/"], "--trace does not go with --url:"),
        (["--trace", str(PODS), "--token", "t"], "--trace does not go with --token:"),
        (["--trace", str(PODS), "--url", "u", "--token", "t"], "--trace does not go with --url, --token:"),
        (["--trace", str(PODS), "--state-dir", "s"], "--trace does not go with --state-dir:"),
    ],
)
def test_an_option_of_the_other_source_is_refused_in_one_line_naming_it(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["mig", "advise", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and named in err and err.count("\n") == 1, err


def test_a_missing_trace_fails_before_any_pool_is_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def never(*_args: object) -> None:
        raise AssertionError("the pool was looked for before the trace was read")

    monkeypatch.setattr(discovery, "discover_pool", never)
    assert main(["mig", "advise", "--trace", str(tmp_path / "missing.csv")]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gpupool: {tmp_path / 'missing.csv'}: cannot read (No such file or directory)\n"


def test_the_demo_pool_note_is_said_once_on_stderr_apart_from_the_advice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["mig", "advise", "--trace", str(PODS)]) == 0  # no NVIDIA driver on test machines
    captured = capsys.readouterr()
    assert captured.err.count("showing the simulated demo pool instead") == 1
    assert "NVIDIA" not in captured.out and captured.out.startswith("MIG advice for 2 GPU(s)")


@pytest.fixture(scope="module")
def hub_api() -> Iterator[str]:
    with token_hub(USERS) as url:
        yield url


def test_admins_get_the_live_advice_and_anyone_else_a_403(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)  # alice holds a 3g.40gb slice
    with Client(service.app) as client:
        answer = client.get("api/v1/admin/mig-advice", "admin-token")
        refused = [client.get("api/v1/admin/mig-advice", t).status_code for t in ("alice-token", "hub-token")]
        assert client.get("api/v1/admin/mig-advice", None).status_code == 401
    assert answer.status_code == 200 and refused == [403, 403]
    data = answer.json()
    assert data["demand"] == [{"ask": "3g.40gb", "count": 1, "servable": True}]
    assert data["before"]["served"] == data["after"]["served"] == 1
    assert {(g["node"], g["index"]) for g in data["gpus"]} == {("dgx-h100-01", 6), ("dgx-h100-01", 7)}


def test_a_drained_or_unhealthy_mig_gpu_is_left_out_of_the_advice(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    service.manager.set_health("dgx-h100-01", Health.DRAINED, 7, "maintenance")
    with Client(service.app) as client:
        data = client.get("api/v1/admin/mig-advice", "admin-token").json()
    assert {(g["node"], g["index"]) for g in data["gpus"]} == {("dgx-h100-01", 6)}
    node = {"name": "n", "cpu": 8, "memory": "64GiB", "gpus": {"product": "H100-80GB", "count": 2}}
    pool = {"nodes": [node | {"mig": {0: ["7g.80gb"], 1: ["7g.80gb"]}, "unhealthy": [0]}]}
    assert [gpu.index for gpu in mig_gpus(parse_pool(pool, "a pool file"))] == [1]


def test_an_offered_profile_left_without_a_slice_in_service_is_named_in_the_report(
    tmp_path: Path, hub_api: str
) -> None:
    """Stop 34 left this alone: a drain took the only GPU with 1g.10gb slices, the form still offered mig-1g,
    and the advice said "nothing to change" without a word about it."""
    service = Service(tmp_path, hub_api)
    service.manager.set_health("dgx-h100-01", Health.DRAINED, 7, "maintenance")  # 6 keeps two 3g.40gb
    with Client(service.app) as client:
        data = client.get("api/v1/admin/mig-advice", "admin-token").json()
        page = client.get("", "admin-token").text
    assert data["missing"] == ["1g.10gb"] and data["kept"] == ["3g.40gb"], data
    said = render_advice(data)
    assert "no GPU in service has a slice for 1g.10gb, which a profile offers" in said, said
    assert "no GPU in service has a slice for 1g.10gb" in page
    h100 = mig.fit(mig.geometry("H100-80GB"), ["3g.40gb", "3g.40gb"]) or ()
    asked = advise(_gpus([("H100-80GB", h100)]), Counter({_ask("H100-80GB", "1g.10gb"): 1}), keep=[])
    assert asked.missing == ()  # nothing offered, nothing missing
    offered = [_ask("H100-80GB", "1g.10gb")]
    served = advise(_gpus([("H100-80GB", h100)]), Counter({_ask("H100-80GB", "1g.10gb"): 2}), keep=offered)
    assert served.missing == () and "1g.10gb" in [p.profile for p in served.gpus[0].advised]  # asked: added
    # the review: with every MIG GPU of the product drained, the profiles were forgotten, not named
    service.manager.set_health("dgx-h100-01", Health.DRAINED, 6, "maintenance")
    with Client(service.app) as client:
        none_left = client.get("api/v1/admin/mig-advice", "admin-token").json()
    assert none_left["gpus"] == [] and none_left["missing"] == ["1g.10gb", "3g.40gb"], none_left
    assert render_advice(none_left).startswith(
        "No GPU in MIG mode is in service: no GPU in service has a slice"
    )


def test_the_admin_dashboard_shows_mig_advice_and_a_users_page_does_not(tmp_path: Path, hub_api: str) -> None:
    service = Service(tmp_path, hub_api)
    with Client(service.app) as client:
        admin = client.get("", "admin-token").text
        alice = client.get("", "alice-token").text
    assert (
        'id="mig-advice"' in admin and "mig-parted config" in admin and "never changes a MIG layout" in admin
    )
    assert "mig-advice" not in alice and "MIG advice" not in alice and "mig-parted" not in alice


def test_the_cli_reads_the_live_advice_from_the_service(
    tmp_path: Path, hub_api: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    service = Service(tmp_path, hub_api)
    with Client(service.app) as client:

        def call(self: Connection, method: str, path: str, **kwargs: object) -> object:
            assert (method, path) == ("GET", "admin/mig-advice")
            return client.get(f"api/v1/{path}", "admin-token").json()

        monkeypatch.setattr(Connection, "call", call)
        assert main(["mig", "advise", "--url", "http://service/services/gpupool/", "--token", "x"]) == 0
    out = capsys.readouterr().out
    assert "leases granted and queued in the gpupool service's store" in out and "3g.40gb ×1" in out


def test_one_profile_name_offered_on_two_products_keeps_a_slice_on_each() -> None:
    """The review: two offered asks of one name ("1g.10gb" on H100s only, on A100s only) were kept as one."""
    h100 = mig.fit(mig.geometry("H100-80GB"), ["1g.10gb"] * 7) or ()
    a100 = mig.fit(mig.geometry("A100-80GB"), ["1g.10gb"] * 7) or ()
    gpus = [MigGpu("h", 0, "H100-80GB", h100), MigGpu("a", 0, "A100-80GB", a100)]
    demand = Counter({_ask("H100-80GB", "7g.80gb"): 1, _ask("A100-80GB", "7g.80gb"): 1})
    advice = advise(gpus, demand, keep=[_ask("H100-80GB", "1g.10gb"), _ask("A100-80GB", "1g.10gb")])
    for gpu in advice.gpus:
        assert "1g.10gb" in [p.profile for p in gpu.advised], (gpu.gpu.product, gpu.advised)
    assert advice.kept == ("1g.10gb",)
