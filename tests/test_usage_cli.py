"""`gpupool usage`'s table: the rows most held first, and a total whose idle share is the API's rule."""

from __future__ import annotations

from gpupool.widgets.usage_cli import usage_table


def _row(
    user: str, profile: str, held: float, used: float, unknown: float, idle: float | None
) -> dict[str, object]:
    return {
        "user": user,
        "profile": profile,
        "gpu_hours_held": held,
        "gpu_hours_used": used,
        "gpu_hours_unknown": unknown,
        "idle_share": idle,
    }


def test_the_table_puts_the_most_held_first_and_totals_the_idle_share_over_known_hours() -> None:
    rows = [_row("ada", "mig-1g", 2.0, 1.5, 0.0, 0.25), _row("linus", "h100", 10.0, 0.5, 2.0, 0.9375)]
    assert usage_table(rows).splitlines() == [
        "USER\tPROFILE\tHELD\tUSED\tUNKNOWN\tIDLE",
        "linus\th100\t10.00\t0.50\t2.00\t94%",
        "ada\tmig-1g\t2.00\t1.50\t0.00\t25%",
        "total\t\t12.00\t2.00\t2.00\t80%",  # (12 - 2 - 2) / (12 - 2): unknown hours are neither used nor idle
    ]


def test_an_empty_span_says_so_and_unreadable_hours_have_no_idle_share() -> None:
    assert usage_table([]) == "no GPU-hours held in this span"
    assert usage_table([_row("ada", "mig-1g", 1.0, 0.0, 1.0, None)]).splitlines()[-1].endswith("\tn/a")
