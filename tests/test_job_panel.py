"""What ``JobPanel`` shows, from the service's answers: the profile choices and the table of jobs."""

from __future__ import annotations

from typing import Any

from gpupool.widgets.job_panel import jobs_table, profile_choices


def _job(**fields: Any) -> dict[str, Any]:
    return {
        "id": "j1",
        "name": "train",
        "profile": "mig-3g",
        "state": "running",
        "reason": "started",
        "devices": [{"uuid": "MIG-1", "label": "3g.40gb on H100-80GB #6"}],
        "position": None,
        "submitted_at": 1.0,
    } | fields


def test_each_usable_profile_says_how_many_could_start_now_and_how_many_wait() -> None:
    profiles = [
        {"slug": "cpu", "display_name": "CPU only", "available_now": 64, "queued": 0, "never_fits": None},
        {"slug": "h100", "display_name": "One H100", "available_now": 0, "queued": 3, "never_fits": None},
        {
            "slug": "b200",
            "display_name": "One B200",
            "available_now": 0,
            "queued": 0,
            "never_fits": "no B200",
        },
    ]
    assert profile_choices(profiles) == [
        ("CPU only — 64 free now", "cpu"),
        ("One H100 — 0 free now, 3 queued", "h100"),
    ]


def test_the_table_lists_newest_first_with_devices_and_queue_place() -> None:
    table = jobs_table(
        [
            _job(),
            _job(
                id="j2",
                name="sweep",
                state="queued",
                position=1,
                devices=[],
                reason="waiting",
                submitted_at=2,
            ),
        ]
    )
    assert table.index("j2") < table.index("j1")
    assert "queued (#2 in line)" in table
    assert "3g.40gb on H100-80GB #6" in table


def test_names_are_escaped_and_an_empty_list_says_so() -> None:
    assert "&lt;script&gt;" in jobs_table([_job(name="<script>alert(1)</script>")])
    assert "No jobs yet" in jobs_table([])
