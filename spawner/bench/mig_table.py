"""``gpupool bench mig``'s table: one row per policy, its columns named as :class:`.mig_bench.MigRun`'s keys.

| column | key | unit |
|---|---|---|
| alloc @100, alloc @130 | ``alloc_pct`` | % of the cluster's GPU capacity |
| alloc @130 without MIG | ``alloc_without_mig_pct`` | % of the cluster's GPU capacity |
| asked by placed @END | ``asked_by_placed_pct`` | % of the cluster's GPU capacity |
| tasks on MIG | ``tasks_on_mig`` | count |
| MIG GPUs held | ``mig_gpus_held_pct`` | % of the MIG GPUs' capacity |
| stranded slices @END | ``stranded_slices`` | count |
| stranded compute @END | ``stranded_compute_pct`` | % of the cluster's GPU capacity |

END is ``inflate`` × 100 (130 by default). Over several seeds each figure is the mean: percentages with two
decimals, counts with one (whole numbers for one seed).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from .mig_bench import MigRun

Figure = Callable[[MigRun], float | None]


def _columns(end: int) -> list[tuple[str, Figure, bool]]:
    """(heading, figure, is a count) for each column after policy and seeds."""

    def without_mig(run: MigRun) -> float | None:
        return None if run.alloc_without_mig_pct is None else run.alloc_without_mig_pct.get("130")

    return [
        ("alloc @100", lambda r: r.alloc_pct.get("100"), False),
        ("alloc @130", lambda r: r.alloc_pct.get("130"), False),
        ("alloc @130 without MIG", without_mig, False),
        (f"asked by placed @{end}", lambda r: r.asked_by_placed_pct, False),
        ("tasks on MIG", lambda r: r.tasks_on_mig, True),
        ("MIG GPUs held", lambda r: r.mig_gpus_held_pct, False),
        (f"stranded slices @{end}", lambda r: r.stranded_slices, True),
        (f"stranded compute @{end}", lambda r: r.stranded_compute_pct, False),
    ]


def _cell(values: Sequence[float | None], count: bool) -> str:
    """The mean of ``values``, "–" when one is unknown (a checkpoint the run never reached)."""
    known = [v for v in values if v is not None]
    if not known or len(known) < len(values):
        return "–"
    mean = statistics.fmean(known)
    if count:
        return f"{mean:.0f}" if len(values) == 1 else f"{mean:.1f}"
    return f"{mean:.2f}"


def heading(runs: Sequence[MigRun]) -> list[str]:
    """What the MIG nodes are, and the legend: which columns are percentages of what, which are counts."""
    first = runs[0]
    end = round(first.inflate * 100)
    gpus = sorted({r.mig_gpus for r in runs})
    seeds = sorted({r.seed for r in runs})
    if len(seeds) == 1:
        over = f"seed {seeds[0]}"
    elif seeds == list(range(seeds[0], seeds[-1] + 1)):
        over = f"mean over seeds {seeds[0]}–{seeds[-1]}"
    else:
        over = f"mean over seeds {', '.join(map(str, seeds))}"
    if gpus[-1] == 0:
        cluster = f"No MIG nodes (--mig-share {first.mig_share:g}); {over}."
    else:
        span = f"{gpus[0]}" if len(gpus) == 1 else f"{gpus[0]}–{gpus[-1]}"
        count = f"{span} {first.product} GPUs" + ("" if len(gpus) == 1 else " by seed")
        cluster = (
            f"{first.mig_nodes} of the GPU nodes as MIG nodes ({count}, {first.layout}; "
            f"--mig-share {first.mig_share:g}); {over}."
        )
    return [
        cluster,
        "Percent of the cluster's GPU capacity: alloc @100, @130 (held when 100%, 130% of it has arrived; a MIG "
        "instance counts its compute share), alloc @130 without MIG (the same seeds with --mig-share 0), asked "
        "by placed (what the placed tasks asked for), stranded compute (the stranded slices' compute share). "
        "Percent of the MIG GPUs' capacity: MIG GPUs held (the compute of the instances placed tasks hold). "
        f"Counts: tasks on MIG, stranded slices (MIG instances still free at the end, {end}%).",
    ]


def render_runs(runs: Sequence[MigRun]) -> str:
    """The heading, then a Markdown table, one row per policy in the order run."""
    columns = _columns(round(runs[0].inflate * 100))
    names = ["policy", "seeds", *(name for name, _, _ in columns)]
    lines = [*heading(runs), "", f"| {' | '.join(names)} |", "|" + "---|" * len(names)]
    for policy in dict.fromkeys(r.policy for r in runs):
        mine = [r for r in runs if r.policy == policy]
        cells = [policy, ",".join(str(r.seed) for r in mine)]
        cells += [_cell([figure(r) for r in mine], count) for _, figure, count in columns]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


__all__ = ["heading", "render_runs"]
