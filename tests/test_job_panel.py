"""What ``JobPanel`` shows, from the service's answers: the profile choices and the table of jobs."""

from __future__ import annotations

import asyncio
from typing import Any

from gpupool.spawner.pool.expected_start import time_of_day
from gpupool.widgets.job_panel import JobPanel, jobs_table, profile_choices


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
    assert profile_choices(profiles) == [  # every profile the spawn form lists, a blocked one saying why
        ("CPU only — 64 free now", "cpu"),
        ("One H100 — 0 free now, 3 queued", "h100"),
        ("One B200 — cannot run on this pool: no B200", "b200"),
    ]
    over = profiles[0] | {"over_quota": "alice's quota allows 4 CPUs at once; 4 are held or queued"}
    assert profile_choices([over]) == [
        ("CPU only — not now: alice's quota allows 4 CPUs at once; 4 are held or queued", "cpu")
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
    assert "queued (#2 in line, no expected start yet (what it waits for has no time limit" in table
    assert "3g.40gb on H100-80GB #6" in table


def test_a_running_job_a_cluster_has_not_started_says_why() -> None:
    held = (
        "its pod is not scheduled: 0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims"
    )
    table = jobs_table([_job(held_up=held, devices=[])])
    assert f"running (not started: {held})" in table
    silent = "gpupool has lost its watch of the cluster since 22:15 UTC: nothing starts until it is back"
    queued = jobs_table([_job(state="queued", position=0, held_up=silent, devices=[])])
    assert f"queued (#1 in line; {silent})" in queued


def test_names_are_escaped_and_an_empty_list_says_so() -> None:
    assert "&lt;script&gt;" in jobs_table([_job(name="<script>alert(1)</script>")])
    assert "No jobs yet" in jobs_table([])


class _Service:
    """A stand-in :class:`Connection`: a service with three profiles (the default second) and two jobs."""

    async def acall(self, method: str, path: str, **kwargs: Any) -> Any:
        if path == "profiles":
            return [
                {"slug": "cpu", "display_name": "CPU", "available_now": 8, "queued": 0, "never_fits": None},
                {"slug": "mig-3g", "display_name": "MIG", "available_now": 1, "queued": 0, "never_fits": None}
                | {"default": True},
                {
                    "slug": "b200",
                    "display_name": "B200",
                    "available_now": 0,
                    "queued": 0,
                    "never_fits": "no B200",
                },
            ]
        if path == "jobs":
            return [_job(id="old", submitted_at=1.0), _job(id="new", name="finetune", submitted_at=2.0)]
        if path == "quota":
            return {"user": "ada", "limits": [], "summary": "Your quota: 4 whole GPUs, 1 held"}
        raise AssertionError(path)

    async def atext(self, path: str, **kwargs: Any) -> str:
        assert path == "jobs/new/logs", path
        return "epoch 3: loss 0.41\n"

    def close(self) -> None:
        pass


def test_the_panel_starts_on_the_forms_default_profile_and_the_newest_jobs_log() -> None:
    panel = JobPanel(_Service(), refresh=3600)  # type: ignore[arg-type]
    try:
        asyncio.run(panel.update())
        asyncio.run(panel.update())  # the log of the job chosen on the first refresh
        assert panel.profile.value == "mig-3g" and len(panel.profile.options) == 3
        assert panel.chosen.value == "new"
        assert panel.log_view.value == "epoch 3: loss 0.41\n"
        assert "Your quota: 4 whole GPUs, 1 held" in panel.standing.value  # finding 6: what the user holds
    finally:
        panel.close()


def test_cancel_is_offered_only_for_a_job_that_has_not_ended() -> None:
    """A trial's "Cancel job" stayed active on a finished job, and pressing it said the job "is succeeded"."""
    panel = JobPanel(_Service(), refresh=3600)  # type: ignore[arg-type]
    try:
        jobs = [_job(id="old", submitted_at=1.0), _job(id="new", state="succeeded", submitted_at=2.0)]
        panel._show([], jobs, None)
        assert panel.chosen.value == "new" and panel.cancel_button.disabled
        panel.chosen.value = "old"  # running
        panel._show([], jobs, None)
        assert not panel.cancel_button.disabled
        panel._show([], [], None)  # no job at all
        assert panel.cancel_button.disabled
    finally:
        panel.close()


def test_a_waiting_job_and_a_full_profile_say_when_they_can_expect_to_start() -> None:
    """Finding 1 of the researcher's-day review: a queued job showed only its place in line."""
    start = time_of_day(5_000.0)
    table = jobs_table([_job(state="queued", position=0, devices=[], expected_start=5_000.0)], now=4_280.0)
    assert f"queued (#1 in line, expected to start by {start} (in about 12 min))" in table
    full = {"slug": "h100", "display_name": "One H100", "available_now": 0, "queued": 2, "never_fits": None}
    # and how long from now: a trial read "06:14 UTC" of a slot half a day away, with no date
    assert profile_choices([full | {"expected_start": 5_000.0}], now=5_000.0 - 11.9 * 3600) == [
        (f"One H100 — 0 free now, 2 queued, one could start by {start} (in about 11.9 h)", "h100")
    ]
