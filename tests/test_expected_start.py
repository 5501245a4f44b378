"""The queue's expected start: from how long the leases ahead said they would hold their devices.

Finding 1 of the researcher's-day review: a queued user saw only "1 ahead of you", never when they could
expect to start, and had no way to say how long they need a GPU.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_lease_manager import MIG, PAIR, WHOLE, ask, manager

from gpupool.spawner.pool.expected_start import Holder, expected_start, in_words
from gpupool.spawner.pool.leases import Lease, LeaseState
from gpupool.spawner.pool.queue import competes
from gpupool.spawner.pool.requests import InvalidRequest, Request, WholeGpus


def held(seconds: int | None, at: float = 0.0) -> Holder:
    return Holder(replace(WHOLE, seconds=seconds), at)


def test_the_nth_in_line_starts_when_the_nth_competing_holder_is_expected_to_end() -> None:
    holders = [
        held(3600),
        held(600),
        held(1800),
        Holder(replace(MIG, seconds=60), 0.0),
    ]  # MIG competes with none
    assert expected_start(WHOLE, [], holders, 100.0, competes) == 600.0
    assert expected_start(WHOLE, [WHOLE], holders, 100.0, competes) == 1800.0
    pair = Request(8000, 32768, WholeGpus(2))  # needs two devices back: the second end
    assert expected_start(pair, [], holders, 100.0, competes) == 1800.0


def test_an_overdue_holder_means_now_and_one_without_a_limit_means_unknown() -> None:
    assert expected_start(WHOLE, [], [held(60)], 500.0, competes) == 500.0
    assert expected_start(WHOLE, [WHOLE], [held(60), held(None)], 500.0, competes) is None
    assert (
        expected_start(Request(1000, 1024), [], [held(60)], 0.0, competes) is None
    )  # CPU-only: not estimated


def test_the_words_give_a_clock_time_and_a_span() -> None:
    clock = {660.0: "14:11 UTC", 30.0: "14:01 UTC"}.get
    assert (
        in_words(660.0, 0.0, lambda t: clock(t) or "") == "expected to start by 14:11 UTC (in about 11 min)"
    )
    assert in_words(30.0, 0.0, lambda t: clock(t) or "") == "expected to start by 14:01 UTC (within a minute)"
    assert in_words(None, 0.0, str).startswith("no expected start yet")
    spans = [
        in_words(h * 3600, 0.0, lambda t: "T").removeprefix("expected to start by T ")
        for h in (12, 23.96, 25, 72)
    ]
    assert spans == [
        "(in about 12 h)",
        "(in about 1 day)",
        "(in about 1 day)",
        "(in about 3 days)",
    ]  # not "1 days"


def test_a_request_cannot_hold_for_zero_seconds() -> None:
    with pytest.raises(InvalidRequest, match="seconds must be at least 1"):
        replace(WHOLE, seconds=0)


def test_a_queued_lease_says_when_it_can_expect_to_start_across_a_restart(tmp_path: Path) -> None:
    first = manager(tmp_path)
    ask(first, "alice", replace(WHOLE, seconds=7200))  # clock: granted at 1001
    ask(first, "bob", replace(WHOLE, seconds=600))  # granted at 1002 (each reading moves a second)
    carol, dave = ask(first, "carol", WHOLE), ask(first, "dave", WHOLE)
    assert first.expected_start(carol.id) == 1602.0  # bob's lease ends first
    assert first.expected_start(dave.id) == 8201.0
    assert "1 ahead of you; expected to start by" in (first.waiting_message(dave.id) or "")
    again = manager(tmp_path)  # the time limits are stored with the leases
    assert again.expected_start(carol.id) == 1602.0


def test_a_job_that_ends_before_the_blocked_pair_can_start_backfills_and_a_longer_one_waits(
    tmp_path: Path,
) -> None:
    """Backfill: with one of two GPUs free and a pair waiting for both until alice's lease ends, a job that
    will have ended by then takes the free GPU; a longer job, or a server (whose wall-time is not enforced),
    waits its turn behind the pair."""
    m = manager(tmp_path)
    alice = ask(m, "alice", replace(WHOLE, seconds=3600))
    bob = ask(m, "bob", replace(WHOLE, seconds=600))
    pair = ask(m, "carol", replace(PAIR, seconds=600))
    assert pair.state is LeaseState.QUEUED and m.expected_start(pair.id) == alice.granted_at + 3600
    m.release(bob.id, "stopped")  # one GPU free; the pair still waits for alice's
    assert m.get(pair.id).state is LeaseState.QUEUED

    def job(user: str, seconds: int, kind: str = "job") -> Lease:
        return m.request_lease(user, [], kind, user, "h100", replace(WHOLE, seconds=seconds))  # type: ignore[arg-type]

    long_job, server = job("erin", 7200), job("frank", 60, kind="server")
    assert long_job.state is LeaseState.QUEUED and server.state is LeaseState.QUEUED
    short_job = job("dave", 1800)
    assert m.get(short_job.id).state is LeaseState.GRANTED  # ends an hour before the pair's expected start
    assert m.get(pair.id).state is LeaseState.QUEUED and m.expected_start(pair.id) == alice.granted_at + 3600


def test_the_queue_is_played_forward_each_request_giving_back_after_its_own_time() -> None:
    pair = Request(8000, 32768, WholeGpus(2), seconds=600)
    # one GPU free, one held until 3600: the pair starts at 3600 and gives both back at 4200
    assert expected_start(WHOLE, [pair], [held(3600)], 100.0, competes, free=1) == 4200.0
    assert expected_start(WHOLE, [], [held(3600)], 100.0, competes, free=1) == 100.0  # free now: now
    assert expected_start(WHOLE, [replace(pair, seconds=None)], [held(3600)], 0.0, competes, free=1) is None
