"""MIG geometry against NVIDIA's published profiles and placements (MIG user guide, mig-parted configs)."""

from __future__ import annotations

import itertools

import pytest

from gpupool.spawner.cli import main
from gpupool.spawner.pool import mig

PUBLISHED_NAMES = {
    "A100-40GB": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "A100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-NVL-94GB": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    "GH200-96GB": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"],
    "H200-141GB": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    "B200-180GB": ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"],
    "A30-24GB": ["1g.6gb", "1g.6gb+me", "2g.12gb", "4g.24gb"],
}

# (shape of each profile in the product's own names) -> fits one GPU together?
EIGHT_SLICE_COMBINATIONS = [
    (["1g"] * 7, True),
    (["1g"] * 8, False),
    (["1g-double"] * 4, True),
    (["1g-double"] * 5, False),
    (["2g"] * 3 + ["1g"], True),
    (["2g"] * 4, False),
    (["3g", "3g"], True),
    (["3g"] * 3, False),
    (["4g", "3g"], True),
    (["4g", "4g"], False),
    (["4g", "2g", "1g"], True),
    (["3g", "2g", "1g", "1g"], True),
    (["3g", "3g", "1g"], False),
    (["7g"], True),
    (["7g", "1g"], False),
    (["1g+me", "1g+me"], False),
    (["1g+me"] + ["1g"] * 6, True),
]


def _names(product: str) -> dict[str, str]:
    geo = mig.GEOMETRIES[product]
    return {p.shape.key: p.name for p in geo.profiles.values()}


@pytest.mark.parametrize("product", sorted(PUBLISHED_NAMES))
def test_profile_names_match_the_published_table(product: str) -> None:
    assert sorted(mig.GEOMETRIES[product].profiles) == sorted(PUBLISHED_NAMES[product])


@pytest.mark.parametrize("product", sorted(set(PUBLISHED_NAMES) - {"A30-24GB"}))
@pytest.mark.parametrize(("shapes", "fits"), EIGHT_SLICE_COMBINATIONS)
def test_mig_check_agrees_with_published_geometry(product: str, shapes: list[str], fits: bool) -> None:
    names = _names(product)
    profiles = [names[s] for s in shapes]
    assert main(["mig", "check", product, *profiles]) == (0 if fits else 1)


@pytest.mark.parametrize(
    ("profiles", "fits"),
    [
        (["1g.6gb"] * 4, True),
        (["1g.6gb"] * 5, False),
        (["2g.12gb", "2g.12gb"], True),
        (["2g.12gb", "1g.6gb", "1g.6gb"], True),
        (["4g.24gb"], True),
        (["4g.24gb", "1g.6gb"], False),
        (["1g.6gb+me", "1g.6gb+me"], False),
    ],
)
def test_a30_has_four_slices(profiles: list[str], fits: bool) -> None:
    assert main(["mig", "check", "NVIDIA A30", *profiles]) == (0 if fits else 1)


def test_illegal_start_slot_names_the_legal_ones() -> None:
    geo = mig.geometry("H100-80GB")
    problem = mig.layout_problem(geo, [mig.Placement(2, "3g.40gb")])
    assert problem == "3g.40gb cannot start at slot 2 on H100-80GB; legal starts are 0 and 4"


def test_two_g_cannot_use_the_last_two_slices() -> None:
    geo = mig.geometry("H100-80GB")
    assert mig.layout_problem(geo, [mig.Placement(6, "2g.20gb")]) is not None
    assert mig.layout_problem(geo, [mig.Placement(4, "2g.20gb")]) is None


def test_refusal_explains_why_instances_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mig", "check", "NVIDIA-H100-80GB-HBM3", "4g.40gb", "4g.40gb"]) == 1
    out = capsys.readouterr().out
    assert "do not fit one H100-80GB" in out
    assert "they need 8 compute slices and one H100-80GB has 7" in out


def test_unknown_profile_lists_the_products_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mig", "check", "A100-40GB", "3g.40gb"]) == 2
    err = capsys.readouterr().err
    assert "A100-40GB has no MIG profile '3g.40gb'" in err
    assert "3g.20gb" in err


def test_product_without_mig_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mig", "layouts", "NVIDIA L4"]) == 2
    assert "L4-24GB does not support MIG" in capsys.readouterr().err


def _brute_force_maximal(geo: mig.Geometry) -> set[tuple[mig.Placement, ...]]:
    """All maximal legal layouts by plain enumeration of subsets, independent of the library's search."""
    every = sorted(mig.Placement(s, p.name) for p in geo.profiles.values() for s in p.shape.starts)
    legal: list[tuple[mig.Placement, ...]] = []
    for size in range(1, geo.memory_slices + 1):
        for combo in itertools.combinations(every, size):
            if mig.layout_problem(geo, combo) is None:
                legal.append(combo)
    legal_set = set(legal)
    return {
        layout
        for layout in legal
        if not any(tuple(sorted((*layout, extra))) in legal_set for extra in every if extra not in layout)
    }


@pytest.mark.parametrize("product", ["H100-80GB", "A30-24GB"])
def test_layouts_are_every_maximal_layout(product: str) -> None:
    geo = mig.GEOMETRIES[product]
    assert set(mig.maximal_layouts(geo)) == _brute_force_maximal(geo)


def test_layouts_json_lists_placements(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["mig", "layouts", "H100-80GB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    layouts = [{(p["profile"], p["start"]) for p in layout} for layout in data["layouts"]]
    assert {("7g.80gb", 0)} in layouts
    assert {("4g.40gb", 0), ("3g.40gb", 4)} in layouts
    assert {("3g.40gb", 0), ("3g.40gb", 4)} in layouts
    assert all(("3g.40gb", 0) not in layout or ("4g.40gb", 0) not in layout for layout in layouts)
