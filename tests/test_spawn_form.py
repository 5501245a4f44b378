"""The spawn form: every profile shows, usable ones as one radio each, blocked ones with their reason; the
choice reads back from the form or a REST body, and unknown or forbidden slugs are refused in words."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from gpupool.spawner.client.leases import Availability
from gpupool.spawner.files.profiles_file import EXAMPLE_PROFILES, load_profiles
from gpupool.spawner.hub.form import (
    FREE_QUOTA,
    ProfileChoice,
    choices_for,
    formdata_from_body,
    from_service,
    limits_text,
    profile_from_form,
    refusal_text,
    render_form,
    walltime_of,
)
from gpupool.spawner.pool.profiles import Profile, UnknownProfile
from gpupool.spawner.pool.requests import WholeGpus

PROFILES = load_profiles(EXAMPLE_PROFILES)
NEVER_FITS = "no node has 4 whole H100-80GB GPUs"


class Page(HTMLParser):
    """The parts of the form the tests read: radio inputs, text per row (by data-slug), all tags seen."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.radios: list[dict[str, str | None]] = []
        self.inputs = 0
        self.rows: dict[str, dict[str, str | None]] = {}
        self.text: dict[str, str] = {}
        self.tags: list[str] = []
        self.badge = ""
        self._row: str | None = None
        self._depth = 0
        self._in_badge = False
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        found = dict(attrs)
        if tag == "input":
            self.inputs += 1
            if found.get("type") == "radio":
                self.radios.append(found | {"row": self._row})
        if tag == "div":
            if self._row is not None:
                self._depth += 1
            elif found.get("data-slug"):
                self._row, self._depth = str(found["data-slug"]), 1
                self.rows[self._row] = found
                self.text[self._row] = ""
        if "gpupool-simulated" in (found.get("class") or "").split():
            self._in_badge = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "div" and self._row is not None:
            self._depth -= 1
            if self._depth == 0:
                self._row = None
        if tag == "p":
            self._in_badge = False

    def handle_data(self, data: str) -> None:
        if self._row is not None:
            self.text[self._row] += data
        if self._in_badge:
            self.badge += data


def choices(
    groups: tuple[str, ...] = (),
    is_admin: bool = False,
    availability: dict[str, tuple[int, int]] | None = None,
    never_fits: dict[str, str] | None = None,
) -> list[ProfileChoice]:
    return choices_for(PROFILES, groups, is_admin, availability or {}, never_fits or {})


def page(choice_list: list[ProfileChoice], simulated: bool = False) -> Page:
    return Page(render_form(choice_list, simulated=simulated))


# ---- which profiles, and who may use them ------------------------------------------------------------


def test_every_profile_is_listed_in_file_order_including_the_ones_the_user_may_not_use() -> None:
    listed = choices(groups=("students",))
    assert [c.profile.slug for c in listed] == [p.slug for p in PROFILES]
    blocked = {c.profile.slug: c.blocked_reason for c in listed if not c.usable}
    assert blocked == {
        "a100-pair": "Only members of gpu-users may use this profile",
        "h100-x4": "Only members of training may use this profile",
    }


def test_a_group_member_may_use_the_group_profile() -> None:
    listed = {c.profile.slug: c for c in choices(groups=("training",))}
    assert listed["h100-x4"].usable and not listed["a100-pair"].usable


def test_admins_may_use_every_profile_but_never_fits_still_blocks_them() -> None:
    listed = choices(is_admin=True, never_fits={"h100-x4": NEVER_FITS})
    assert [c.profile.slug for c in listed if not c.usable] == ["h100-x4"]
    assert listed[-1].blocked_reason == NEVER_FITS


def test_the_group_rule_is_the_reason_shown_when_both_block() -> None:
    (choice,) = [c for c in choices(never_fits={"h100-x4": NEVER_FITS}) if c.profile.slug == "h100-x4"]
    assert choice.blocked_reason == "Only members of training may use this profile"


def test_availability_is_taken_by_slug_and_missing_means_none_free() -> None:
    listed = {c.profile.slug: c for c in choices(availability={"mig-3g": (2, 0), "h100": (0, 3)})}
    assert (listed["mig-3g"].available_now, listed["mig-3g"].queued) == (2, 0)
    assert (listed["h100"].available_now, listed["h100"].queued) == (0, 3)
    assert (listed["cpu"].available_now, listed["cpu"].queued) == (0, 0)


# ---- the HTML ------------------------------------------------------------------------------------------


def test_each_usable_profile_has_exactly_one_radio_carrying_its_slug() -> None:
    listed = choices(groups=("training",), availability={p.slug: (1, 0) for p in PROFILES})
    form = page(listed)
    usable = [c.profile.slug for c in listed if c.usable]
    assert [r["value"] for r in form.radios] == usable
    assert all(r["name"] == "profile" and r["row"] == r["value"] for r in form.radios)
    assert "form" not in form.tags and "script" not in form.tags


def test_blocked_profiles_have_no_radio_and_show_their_reason() -> None:
    form = page(choices(never_fits={"h100": NEVER_FITS}))
    radio_slugs = {r["value"] for r in form.radios}
    for slug, reason in [
        ("h100", NEVER_FITS),
        ("a100-pair", "Only members of gpu-users may use this profile"),
        ("h100-x4", "Only members of training may use this profile"),
    ]:
        assert slug not in radio_slugs
        assert form.rows[slug]["aria-disabled"] == "true"
        assert reason in form.text[slug]
    assert form.inputs == len(form.radios) == 4


def test_each_row_shows_the_gpu_cpu_and_memory() -> None:
    form = page(choices())
    assert "MIG 3g.40gb" in form.text["mig-3g"] and "8 CPUs" in form.text["mig-3g"]
    assert "64 GiB memory" in form.text["mig-3g"]
    assert "1 × H100-80GB" in form.text["h100"] and "Four H100s for training" in form.text["h100-x4"]


def test_each_row_names_the_slug_a_job_asks_for() -> None:
    """A first-day trial: ``gpupool submit --help`` said "the profile's slug (see the spawn form)", and the form
    showed only names ("One H100"); the slug was in the typo's error alone."""
    form = page(choices())
    assert all(f"for jobs: --profile {slug}" in text for slug, text in form.text.items()), form.text


def test_the_form_says_how_many_could_start_now_or_how_many_wait() -> None:
    form = page(choices(availability={"mig-1g": (3, 0), "h100": (0, 2), "cpu": (1, 5)}))
    assert "3 could start now" in form.text["mig-1g"]
    assert "1 could start now" in form.text["cpu"] and "waiting" not in form.text["cpu"]
    assert "none free now: you will wait in a queue (2 waiting)" in form.text["h100"]


def test_the_default_profile_is_checked_and_only_it() -> None:
    form = page(choices())
    assert [r["value"] for r in form.radios if "checked" in r] == ["cpu"]


def test_the_first_usable_profile_is_checked_when_the_default_is_blocked() -> None:
    form = page(choices(never_fits={"cpu": "no node has 2 CPUs free even when empty"}))
    assert [r["value"] for r in form.radios if "checked" in r] == ["l4-quarter"]


def test_a_user_with_no_usable_profile_gets_no_radio_and_a_sentence() -> None:
    (only,) = [p for p in PROFILES if p.slug == "h100-x4"]
    form = Page(render_form(choices_for([only], (), False, {}, {}), simulated=False))
    assert form.radios == [] and "only members of training" in form.text["h100-x4"].lower()
    assert "ask an administrator" in render_form(choices_for([only], (), False, {}, {}), simulated=False)


def test_a_user_whose_quota_is_taken_is_told_to_free_some_of_it_not_to_ask_an_administrator() -> None:
    """A course's trial: a student whose one MIG slice a job held read "No profile is open to you now; ask an
    administrator"."""
    said = "stu1's quota allows 1 MIG slice at once; 1 is held or queued and 1 more was asked for"
    open_ones = [p for p in PROFILES if not p.groups]
    full = choices_for(open_ones, (), False, {}, {}, over_quota={p.slug: said for p in open_ones})
    html = render_form(full, simulated=False)
    assert all(c.quota_full and not c.usable for c in full) and Page(html).radios == []
    assert "Your quota is taken by your other servers and jobs" in html and "administrator" not in html
    assert html.count(said.replace("'", "&#x27;")) == len(open_ones)  # each closed row says the limit
    # with another profile still open, each closed row says how to open it (a trial found only the limit)
    some = choices_for(open_ones, (), False, {}, {}, over_quota={open_ones[0].slug: said})
    row = Page(render_form(some, simulated=False)).text[open_ones[0].slug]
    assert (
        said in row
        and "stop another server, or cancel a job (JobPanel, or gpupool cancel ID), to free it" in row
    ), row
    # a spawn the service refuses for the quota (a REST spawn, or KubeSpawner's form) says the same
    assert refusal_text(said, "quota_exceeded") == f"{said}; {FREE_QUOTA}"
    assert refusal_text("only members of training may use h100-x4", "forbidden").endswith("h100-x4")
    never = choices_for(open_ones[:1], (), False, {}, {open_ones[0].slug: "no such GPU"}, over_quota={})
    assert not never[0].quota_full  # a profile that never fits is not waiting on the quota
    # the review: a quota of 0 is not "taken": freeing nothing would open it
    zero = "members of group students may each hold no whole GPUs at once; 0 are held or queued and 1 more …"
    live = Availability(
        {p.slug: (1, 0) for p in open_ones}, {}, "nvml", quota_forbids={p.slug: zero for p in open_ones}
    )
    closed = from_service(open_ones, [], False, live, 0)
    assert not any(c.usable or c.quota_full for c in closed)
    assert "ask an administrator" in render_form(closed, simulated=False)


def test_display_names_descriptions_and_groups_are_html_escaped() -> None:
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    profile = Profile("evil", evil, 1000, 1024, description=f"desc {evil}", groups={f"g{evil}"})
    for choice in (
        ProfileChoice(profile, 1, 0),
        *choices_for([profile], (), False, {}, {}),
    ):
        html = render_form([choice], simulated=True)
        form = Page(html)
        assert "script" not in form.tags and "img" not in form.tags
        assert evil in form.text["evil"]
        assert "<script>" not in html


def test_a_simulated_pool_shows_a_visible_badge() -> None:
    assert "simulated" in page(choices(), simulated=True).badge.lower()
    assert page(choices(), simulated=False).badge == ""


def test_simulated_counts_are_marked_on_each_row() -> None:
    listed = choices_for(PROFILES, (), False, {"cpu": (2, 0)}, {}, simulated=True)
    assert all(c.simulated for c in listed)
    assert "2 could start now (simulated)" in page(listed, simulated=True).text["cpu"]


# ---- reading the choice back -----------------------------------------------------------------------------


def test_the_chosen_profile_is_returned() -> None:
    assert profile_from_form({"profile": ["mig-3g"]}, PROFILES, (), False).slug == "mig-3g"


def test_an_unknown_slug_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownProfile) as caught:
        profile_from_form({"profile": ["a100-x8"]}, PROFILES, (), False)
    message = str(caught.value)
    assert "'a100-x8'" in message
    assert "cpu, l4-quarter, mig-1g, mig-3g, h100" in message and "h100-x4" not in message


@pytest.mark.parametrize("formdata", [{}, {"profile": []}, {"profile": [""]}, {"other": ["cpu"]}])
def test_a_missing_slug_is_refused_with_the_valid_ones(formdata: dict[str, list[str]]) -> None:
    with pytest.raises(UnknownProfile, match="no profile chosen; choose one of cpu, "):
        profile_from_form(formdata, PROFILES, (), False)


def test_a_profile_the_user_may_not_use_raises_permission_error() -> None:
    with pytest.raises(PermissionError) as caught:
        profile_from_form({"profile": ["h100-x4"]}, PROFILES, ("students",), False)
    assert str(caught.value) == (
        "Four H100s for training (h100-x4): only members of training may use this profile"
    )
    assert profile_from_form({"profile": ["h100-x4"]}, PROFILES, ("training",), False).slug == "h100-x4"
    assert profile_from_form({"profile": ["h100-x4"]}, PROFILES, (), True).slug == "h100-x4"


def test_a_rest_body_chooses_the_same_way_as_the_form() -> None:
    assert formdata_from_body({"profile": "h100"}) == {"profile": ["h100"]}
    chosen = profile_from_form(formdata_from_body({"profile": "h100"}), PROFILES, (), False)
    assert chosen == profile_from_form({"profile": ["h100"]}, PROFILES, (), False)
    with pytest.raises(UnknownProfile, match="unknown profile '7'"):
        profile_from_form(formdata_from_body({"profile": 7}), PROFILES, (), False)
    with pytest.raises(UnknownProfile, match="no profile chosen"):
        profile_from_form(formdata_from_body({"profile": None}), PROFILES, (), False)


def test_a_profile_built_in_code_renders_like_one_from_a_file() -> None:
    pair = Profile("pair", "Two GPUs", 500, 512, gpu=WholeGpus(2, frozenset(), 0))
    form = Page(render_form(choices_for([pair], (), False, {"pair": (1, 0)}, {}), simulated=False))
    assert "2 × any GPU" in form.text["pair"] and "0.5 CPUs" in form.text["pair"]
    assert "0.5 GiB memory" in form.text["pair"]


def test_the_form_shows_the_users_quota_each_profiles_limits_and_when_one_could_start() -> None:
    """Finding 6 of the researcher's-day review: the form left out the user's quota and holdings, the idle and
    lifetime limits, and the expected wait when nothing is free."""
    h100 = next(p for p in PROFILES if p.slug == "h100")
    # the GPU's own idle limit too, which culls first (a trial saw only "1h idle" for a 30m GPU limit)
    assert limits_text(h100).startswith("stopped after 2h idle or 1h with its GPU unused · lives at most 2d")
    live = Availability(
        {"h100": (0, 2), "cpu": (3, 0)}, {}, "simulated", {"h100": 1_000.0 + 25 * 60}, simulated=True
    )
    choices = from_service(PROFILES, [], False, live, now=1_000.0)
    html = render_form(choices, simulated=True, standing="Your quota: 4 whole GPUs, 1 held")
    page = Page(html)
    assert "Your quota: 4 whole GPUs, 1 held" in html
    assert "none free now: you will wait in a queue (2 waiting); expected to start by" in page.text["h100"]
    assert "(in about 25 min)" in page.text["h100"]
    assert "lives at most 2d" in page.text["h100"]
    assert "expected to start" not in page.text["cpu"] and "3 could start now" in page.text["cpu"]
    assert 'name="walltime"' in html  # how long the user needs it: what the estimates go by


def test_a_walltime_reads_back_as_seconds_and_one_past_the_lifetime_is_refused_naming_the_field() -> None:
    h100 = next(p for p in PROFILES if p.slug == "h100")
    assert walltime_of({"walltime": "4h"}, h100) == 4 * 3600
    assert walltime_of({"walltime": ["90m"]}, h100) == 90 * 60
    assert walltime_of({}, h100) is None and walltime_of({"walltime": ""}, h100) is None
    with pytest.raises(ValueError, match=r"walltime: h100 servers live at most 2d, got 3d"):
        walltime_of({"walltime": "3d"}, h100)
    with pytest.raises(ValueError, match=r"walltime: expected a duration such as 4h"):
        walltime_of({"walltime": "soon"}, h100)


def test_a_profile_added_to_the_file_after_the_service_started_is_shown_closed_saying_why() -> None:
    """A lab trial put a profile back in profiles.yaml without a restart: the form (which reads the file at each
    page) offered it, and its start was refused with "unknown profile" by the service (which read it at start)."""
    known = {p.slug: (1, 0) for p in PROFILES if p.slug != "mig-1g"}
    choices = {
        c.profile.slug: c for c in from_service(PROFILES, [], True, Availability(known, {}, "nvml"), 0)
    }
    assert not choices["mig-1g"].usable and choices["h100"].usable
    assert "added to the profiles file since it started" in (choices["mig-1g"].blocked_reason or "")
    assert "restarted" in (choices["mig-1g"].blocked_reason or "")
    # with no answer from the service nothing is known either way, and nothing is closed for it
    silent = from_service(PROFILES, [], True, Availability({}, {}, ""), 0)
    assert all(c.usable for c in silent)
