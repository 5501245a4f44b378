"""``gpupool jobs`` and ``submit``'s wording of where a job stands, from the API's job model (the end-to-end
cases, against a real hub, are in ``test_jobs_api``)."""

from __future__ import annotations

from gpupool.spawner.pool.expected_start import NO_EXPECTED_START, time_of_day
from gpupool.widgets.jobs_cli import where_it_stands


def test_a_queued_jobs_expected_start_says_how_far_off_it_is_as_jobpanel_does() -> None:
    """``expected to start by 06:14 UTC`` alone could be today's or tomorrow's."""
    start = 1_800_000_000.0
    queued = {"position": 1, "expected_start": start, "held_up": None}
    said = where_it_stands(queued, now=start - 11.9 * 3600)
    assert said == f"#2 in the queue, expected to start by {time_of_day(start)} (in about 11.9 h)"
    # a failure trial's job waited on a failed GPU with no word of it, where its lease said this
    assert where_it_stands({"position": 0, "expected_start": None}) == f"#1 in the queue, {NO_EXPECTED_START}"
    assert (
        where_it_stands({"position": None, "held_up": "its Job is being created"})
        == "not started: its Job is being created"
    )
    assert where_it_stands({"position": None}) == ""
