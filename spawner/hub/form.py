"""The spawn form, as pure functions: which profiles a user sees, the HTML, and reading the choice back.

No JupyterHub import and no I/O: the spawner gathers availability from the service and passes plain data in.
Every user sees every profile, in file order; one they may not use, or one the pool can never serve, shows
why instead of a radio button. Admins may use every profile (:meth:`Profile.visible_to`), so only a
never-fits reason blocks one for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from ..client.leases import Availability
from ..pool.environments import FIELD as ENVIRONMENT  # the spawners read it here too
from ..pool.expected_start import in_words, time_of_day
from ..pool.profiles import Profile, UnknownProfile, format_duration, parse_duration, preselected_environment
from .environment_choice import environment_field, environment_of, not_offered_text

FIELD = "profile"  # the form field and the REST body key that name the chosen profile's slug
WALLTIME = "walltime"  # how long the user expects to need the server: what the queue's estimates go by
WALLTIMES = ("1h", "2h", "4h", "8h", "1d")  # the form's choices, besides the profile's own limit

# The form reads the profiles file at each page, the service at its start: a profile added since, which the
# service would refuse as unknown, is shown closed.
NOT_IN_SERVICE = (
    "The gpupool service does not know this profile (added to the profiles file since it started?): it can be "
    "started once the hub is restarted"
)

_CSS = """<style>
.gpupool-form .gpupool-profile { border: 1px solid #ddd; border-radius: 4px; padding: 8px 12px; margin: 6px 0; }
.gpupool-form .gpupool-profile label { display: block; font-weight: normal; cursor: pointer; }
.gpupool-form .gpupool-blocked { color: #777; background: #f6f6f6; }
.gpupool-form .gpupool-details, .gpupool-form .gpupool-description { display: block; font-size: 90%; }
.gpupool-form .gpupool-free { color: #2a7a2a; }
.gpupool-form .gpupool-queue { color: #a06000; }
.gpupool-form .gpupool-reason { color: #a02020; }
.gpupool-form .gpupool-environment select { max-width: 100%; }
.gpupool-form .gpupool-simulated { display: inline-block; background: #fff3cd; border: 1px solid #e0c060;
  border-radius: 4px; padding: 2px 8px; margin-bottom: 6px; font-weight: bold; }
</style>"""


@dataclass(frozen=True)
class ProfileChoice:
    """One row of the form: a profile, how many could start now, how many wait, and why it is blocked."""

    profile: Profile
    available_now: int
    queued: int
    blocked_reason: str | None = None  # None when the user may start it
    simulated: bool = False  # the counts come from a simulated pool
    expected_wait: str = ""  # when none is free: "expected to start by 14:05 UTC (in about 12 min)"
    quota_full: bool = False  # blocked by the user's quota only until they hold less
    # environment slug: why no GPU of the pool can run it (the service's sentence); offered disabled, saying so
    closed_environments: Mapping[str, str] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Whether the form offers this profile as a choice."""
        return self.blocked_reason is None


def permission_reason(profile: Profile) -> str:
    """The sentence saying who may use ``profile``: ``Only members of training may use this profile``."""
    return f"Only members of {_members(profile)} may use this profile"


def _members(profile: Profile) -> str:
    return " or ".join(sorted(profile.groups))


def choices_for(
    profiles: Sequence[Profile],
    user_groups: Iterable[str],
    is_admin: bool,
    availability: Mapping[str, tuple[int, int]],
    never_fits: Mapping[str, str],
    *,
    simulated: bool = False,
    expected_waits: Mapping[str, str] | None = None,
    over_quota: Mapping[str, str] | None = None,
    environments_never_fit: Mapping[str, Mapping[str, str]] | None = None,
) -> list[ProfileChoice]:
    """Every profile in file order, with its ``(available_now, queued)`` from ``availability`` (by slug,
    missing means ``(0, 0)``) and what blocks it: the group rule first, then ``never_fits`` (slug to the
    sentence :func:`fits_pool` gave), then ``over_quota`` (what the user's quota refuses now). Blocked
    profiles stay in the list so the form can say why. ``expected_waits``: by slug, when one could expect to
    start if none is free now; ``environments_never_fit``: by slug, the environments no GPU of the pool can
    run, with why (:func:`environments_never_fit`)."""
    groups = frozenset(user_groups)
    choices = []
    for profile in profiles:
        available_now, queued = availability.get(profile.slug, (0, 0))
        reason = None if profile.visible_to(groups, is_admin) else permission_reason(profile)
        quota = (over_quota or {}).get(profile.slug)
        blocked = reason or never_fits.get(profile.slug) or quota
        wait = (expected_waits or {}).get(profile.slug, "")
        full = blocked is not None and blocked == quota
        closed = (environments_never_fit or {}).get(profile.slug, {})
        choices.append(ProfileChoice(profile, available_now, queued, blocked, simulated, wait, full, closed))
    return choices


def from_service(
    profiles: Sequence[Profile], user_groups: Iterable[str], is_admin: bool, live: Availability, now: float
) -> list[ProfileChoice]:
    """:func:`choices_for` with what the service said: counts, never-fits reasons (of profiles and of their
    environments), what the user's quota refuses now, whether the pool is simulated, and when one asked
    ``now`` could expect to start."""
    waits = {slug: in_words(start, now, time_of_day) for slug, start in live.expected_starts.items()}
    blocked = live.quota_forbids | live.never_fits  # a quota of 0 closes a profile as a group rule does
    if live.backend:  # the service answered: a profile it does not know would be refused at the start
        blocked |= {p.slug: NOT_IN_SERVICE for p in profiles if p.slug not in live.counts}
    return choices_for(
        profiles,
        user_groups,
        is_admin,
        live.counts,
        blocked,
        simulated=live.simulated,
        expected_waits=waits,
        over_quota=live.over_quota,
        environments_never_fit=live.environments_never_fit,
    )


def render_form(
    choices: Sequence[ProfileChoice], *, simulated: bool, limits_note: str = "", standing: str = ""
) -> str:
    """An HTML fragment for JupyterHub's spawn page (it sits inside the hub's own ``<form>``).

    One radio named ``profile`` per usable choice, the default profile checked (else the first usable one);
    blocked choices are disabled rows carrying their reason. ``simulated``: the pool's GPUs are made up (a
    banner says so); ``limits_note``: why the profiles' CPU and memory are not enforced on this host, if they
    are not; ``standing``: the user's quota and what they hold.
    Every text is escaped.
    """
    usable = [c for c in choices if c.usable]
    checked = next((c for c in usable if c.profile.default), usable[0] if usable else None)
    parts = [_CSS, '<div class="gpupool-form">']
    if simulated:
        parts.append(
            '<p class="gpupool-simulated" title="no real GPUs: gpupool simulates them">'
            "Simulated pool: the GPUs below are not real</p>"
        )
    if limits_note:
        parts.append(
            '<p class="gpupool-unenforced">CPU and memory below are what the pool counts, not limits: '
            f"{escape(limits_note)}</p>"
        )
    if standing:
        parts.append(f'<p class="gpupool-standing">{escape(standing)}</p>')
    if not usable and any(choice.quota_full for choice in choices):
        parts.append(
            '<p class="gpupool-none">Your quota is taken by your other servers and jobs (queued ones too): '
            "stop a server, or cancel a job (JobPanel, or gpupool cancel ID), to start one here.</p>"
        )
    elif not usable:
        parts.append('<p class="gpupool-none">No profile is open to you now; ask an administrator.</p>')
    parts.extend(_row(choice, choice is checked, hint_quota=bool(usable)) for choice in choices)
    if usable:
        parts.append(_walltime_field())
    parts.append("</div>")
    return "\n".join(parts)


FREE_QUOTA = "stop another server, or cancel a job (JobPanel, or gpupool cancel ID), to free it"


def refusal_text(detail: str, code: str) -> str:
    """The service's refusal of a spawn, with how to open a profile the user's quota closes (a Kubernetes
    trial's refusal, like KubeSpawner's form, said only the limit)."""
    return f"{detail}; {FREE_QUOTA}" if code == "quota_exceeded" else detail


def _row(choice: ProfileChoice, checked: bool, *, hint_quota: bool) -> str:
    """One profile's row; a row closed by the quota says how to open it (``hint_quota``: unless the form's
    top says so already, as it does when no row is open)."""
    profile = choice.profile
    slug = escape(profile.slug)
    summary = (
        f'<strong class="gpupool-name">{escape(profile.display_name)}</strong>'
        f'<span class="gpupool-details">{escape(profile.gpu_description())} · {_cpu(profile)} · '
        f"{_memory(profile)}</span>"
        # a first-day trial found the slug that `gpupool submit --profile` and submit() take nowhere
        f'<span class="gpupool-details gpupool-slug">for jobs: <code>--profile {slug}</code></span>'
    )
    if limits_text(profile):
        summary += f'<span class="gpupool-details gpupool-limits">{escape(limits_text(profile))}</span>'
    if profile.description:
        summary += f'<span class="gpupool-description">{escape(profile.description)}</span>'
    if choice.blocked_reason is not None:
        reason = (
            f"{choice.blocked_reason}: {FREE_QUOTA}"
            if choice.quota_full and hint_quota
            else choice.blocked_reason
        )
        return (
            f'<div class="gpupool-profile gpupool-blocked" data-slug="{slug}" aria-disabled="true">'
            f'{summary}<span class="gpupool-reason">{escape(reason)}</span></div>'
        )
    field_id = f"gpupool-profile-{slug}"
    check = " checked" if checked else ""
    return (
        f'<div class="gpupool-profile" data-slug="{slug}">'
        f'<label for="{field_id}"><input type="radio" name="{FIELD}" id="{field_id}" value="{slug}"{check}> '
        f"{summary}{_availability(choice)}</label>{environment_field(profile, choice.closed_environments)}</div>"
    )


def _walltime_field() -> str:
    options = ['<option value="" selected>as long as the profile allows</option>']
    options += [f'<option value="{w}">{w}</option>' for w in WALLTIMES]
    return (
        '<p class="gpupool-walltime"><label for="gpupool-walltime">How long will you need it? '
        f'<select name="{WALLTIME}" id="gpupool-walltime">{"".join(options)}</select></label> '
        '<span class="gpupool-details">Tells those queued behind you when to expect the GPU; '
        "the profile's own limits still apply.</span></p>"
    )


def walltime_of(options: Mapping[str, Any], profile: Profile) -> int | None:
    """The wall-time ``options`` ask for, in seconds (``"4h"``, ``14400``), None when they ask none; ValueError
    naming the field when it is not a duration or is longer than the profile's ``max_lifetime``."""
    raw = options.get(WALLTIME)
    if raw is None or raw == "" or raw == []:
        return None
    text = str(raw[0] if isinstance(raw, list) else raw)
    seconds = parse_duration(text)
    if not seconds:
        raise ValueError(f"{WALLTIME}: expected a duration such as 4h, 90m or 3600 (seconds), got {text!r}")
    if profile.max_lifetime is not None and seconds > profile.max_lifetime:
        limit = format_duration(profile.max_lifetime)
        raise ValueError(
            f"{WALLTIME}: {profile.slug} servers live at most {limit}, got {format_duration(seconds)}"
        )
    return seconds


def lease_options(options: Mapping[str, Any], profile: Profile) -> dict[str, Any]:
    """What a server's lease asks beyond the profile: its wall-time and environment, both checked here."""
    chosen = environment_of(options, profile)
    return {"walltime": walltime_of(options, profile), "environment": chosen.slug if chosen else None}


def availability_text(choice: ProfileChoice) -> str:
    """``2 could start now`` or ``none free now: you will wait in a queue (3 waiting); expected to start by
    14:05 UTC (in about 12 min)``."""
    if choice.available_now > 0:
        return f"{choice.available_now} could start now"
    wait = f"; {choice.expected_wait}" if choice.expected_wait else ""
    return f"none free now: you will wait in a queue ({choice.queued} waiting){wait}"


def limits_text(profile: Profile) -> str:
    """The limits a user plans by: ``stopped after 2h idle or 1h with its GPU unused · lives at most 2d · waits
    up to 4h for a device`` (the GPU's limit is often the first to come)."""
    parts = []
    idle = [f"{format_duration(profile.idle_timeout)} idle"] if profile.idle_timeout else []
    if profile.gpu_idle_timeout:
        idle.append(f"{format_duration(profile.gpu_idle_timeout)} with its GPU unused")
    if idle:
        parts.append(f"stopped after {' or '.join(idle)}")
    if profile.max_lifetime:
        parts.append(f"lives at most {format_duration(profile.max_lifetime)}")
    if profile.queue_wait:
        parts.append(f"waits up to {format_duration(profile.queue_wait)} for a device")
    return " · ".join(parts)


def _availability(choice: ProfileChoice) -> str:
    css = "gpupool-free" if choice.available_now > 0 else "gpupool-queue"
    tag = " (simulated)" if choice.simulated else ""
    return f'<span class="gpupool-details {css}">{escape(availability_text(choice) + tag)}</span>'


def _cpu(profile: Profile) -> str:
    cores = profile.cpu_milli / 1000
    return f"{cores:g} CPU" if cores == 1 else f"{cores:g} CPUs"


def _memory(profile: Profile) -> str:
    return f"{profile.memory_mib / 1024:g} GiB memory"


def profile_list(choices: Sequence[ProfileChoice]) -> list[dict[str, object]]:
    """KubeSpawner's ``profile_list`` for the usable choices (its form has no disabled rows, so a profile the
    user may not use, or that never fits, is left out; one the user's quota refuses now stays, saying so, as
    a profile that vanished would say nothing): display name, slug, and a description that carries the live
    availability. An environment no GPU of the pool can run is left out of the profile's choices for the
    same reason, and the description says why (:func:`not_offered_text`). No ``kubespawner_override``: the
    granted lease, not the form, sets the pod's resources, node and environment."""
    usable = [c for c in choices if c.usable]
    default = next((c for c in usable if c.profile.default), usable[0] if usable else None)
    rows: list[dict[str, object]] = []
    for choice in [c for c in choices if c.usable or c.quota_full]:
        profile = choice.profile
        live = (
            f"not now: {choice.blocked_reason}"
            if choice.quota_full
            else f"{choice.available_now} can start now"
            if choice.available_now
            else f"none free now, {choice.queued} waiting: you would queue"
        )
        closed = choice.closed_environments
        # KubeSpawner's choices cannot be disabled: one no GPU can run is left out, and said here
        unrunnable = [not_offered_text(e, closed[e.slug]) for e in profile.environments if e.slug in closed]
        details = " · ".join([profile.gpu_description(), _cpu(profile), _memory(profile), *unrunnable, live])
        if choice.simulated:
            details += " (simulated pool)"
        description = f"{profile.description} — {details}" if profile.description else details
        row: dict[str, object] = {
            "display_name": profile.display_name,
            "slug": profile.slug,
            "description": description,
        }
        selected = preselected_environment(profile, closed)
        if selected is not None:  # KubeSpawner's own vocabulary; the spawner sets the chosen image itself
            offered = {
                e.slug: {"display_name": e.describe(), "default": e is selected}
                for e in profile.environments
                if e.slug not in closed
            }
            row["profile_options"] = {ENVIRONMENT: {"display_name": "Environment", "choices": offered}}
        if choice is default:
            row["default"] = True
        rows.append(row)
    return rows


# ---- reading the choice back ---------------------------------------------------------------------------


def formdata_from_body(body: Mapping[str, object]) -> dict[str, list[str]]:
    """A REST spawn body such as ``{"profile": "mig-3g"}`` in the form's shape (every value a list)."""
    formdata: dict[str, list[str]] = {}
    for key, value in body.items():
        if value is None:
            formdata[key] = []
        elif isinstance(value, list | tuple):
            formdata[key] = [str(item) for item in value]
        else:
            formdata[key] = [str(value)]
    return formdata


def profile_from_form(
    formdata: Mapping[str, list[str]],
    profiles: Sequence[Profile],
    user_groups: Iterable[str],
    is_admin: bool,
) -> Profile:
    """The profile the user chose. Raises :class:`UnknownProfile` (listing the slugs this user may start)
    for a missing or unknown slug, and :class:`PermissionError` for a profile the user may not use."""
    groups = frozenset(user_groups)
    values = [v.strip() for v in formdata.get(FIELD, []) if v.strip()]
    open_to_user = [p.slug for p in profiles if p.visible_to(groups, is_admin)]
    valid = ", ".join(open_to_user) or "none (no profile is open to you)"
    if not values:
        raise UnknownProfile(f"no profile chosen; choose one of {valid}")
    slug = values[0]
    profile = next((p for p in profiles if p.slug == slug), None)
    if profile is None:
        raise UnknownProfile(f"unknown profile {slug!r}; choose one of {valid}")
    if not profile.visible_to(groups, is_admin):
        raise PermissionError(
            f"{profile.display_name} ({slug}): only members of {_members(profile)} may use this profile"
        )
    return profile
