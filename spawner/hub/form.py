"""The spawn form, as pure functions: which profiles a user sees, the HTML, and reading the choice back.

No JupyterHub import and no I/O: the spawner gathers availability from the service and passes plain data in.
Every user sees every profile, in file order; one they may not use, or one the pool can never serve, shows
why instead of a radio button. Admins may use every profile (:meth:`Profile.visible_to`), so only a
never-fits reason blocks one for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

from ..pool.profiles import Profile, UnknownProfile

FIELD = "profile"  # the form field and the REST body key that name the chosen profile's slug

_CSS = """<style>
.gpupool-form .gpupool-profile { border: 1px solid #ddd; border-radius: 4px; padding: 8px 12px; margin: 6px 0; }
.gpupool-form .gpupool-profile label { display: block; font-weight: normal; cursor: pointer; }
.gpupool-form .gpupool-blocked { color: #777; background: #f6f6f6; }
.gpupool-form .gpupool-details, .gpupool-form .gpupool-description { display: block; font-size: 90%; }
.gpupool-form .gpupool-free { color: #2a7a2a; }
.gpupool-form .gpupool-queue { color: #a06000; }
.gpupool-form .gpupool-reason { color: #a02020; }
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
) -> list[ProfileChoice]:
    """Every profile in file order, with its ``(available_now, queued)`` from ``availability`` (by slug,
    missing means ``(0, 0)``) and what blocks it: the group rule first, then ``never_fits`` (slug to the
    sentence :func:`fits_pool` gave). Blocked profiles stay in the list so the form can say why."""
    groups = frozenset(user_groups)
    choices = []
    for profile in profiles:
        available_now, queued = availability.get(profile.slug, (0, 0))
        reason = None if profile.visible_to(groups, is_admin) else permission_reason(profile)
        choices.append(
            ProfileChoice(profile, available_now, queued, reason or never_fits.get(profile.slug), simulated)
        )
    return choices


def render_form(choices: Sequence[ProfileChoice], *, backend: str, limits_note: str = "") -> str:
    """An HTML fragment for JupyterHub's spawn page (it sits inside the hub's own ``<form>``).

    One radio named ``profile`` per usable choice, the default profile checked (else the first usable one);
    blocked choices are disabled rows carrying their reason. ``limits_note``: why the profiles' CPU and memory
    are not enforced on this host, if they are not. Every text is escaped.
    """
    usable = [c for c in choices if c.usable]
    checked = next((c for c in usable if c.profile.default), usable[0] if usable else None)
    parts = [_CSS, '<div class="gpupool-form">']
    if backend == "simulated":
        parts.append(
            '<p class="gpupool-simulated" title="no real GPUs: the pool comes from a pool file">'
            "Simulated pool: the GPUs below are not real</p>"
        )
    if limits_note:
        parts.append(
            '<p class="gpupool-unenforced">CPU and memory below are what the pool counts, not limits: '
            f"{escape(limits_note)}</p>"
        )
    if not usable:
        parts.append('<p class="gpupool-none">No profile is open to you now; ask an administrator.</p>')
    parts.extend(_row(choice, choice is checked) for choice in choices)
    parts.append("</div>")
    return "\n".join(parts)


def _row(choice: ProfileChoice, checked: bool) -> str:
    profile = choice.profile
    slug = escape(profile.slug)
    summary = (
        f'<strong class="gpupool-name">{escape(profile.display_name)}</strong>'
        f'<span class="gpupool-details">{escape(profile.gpu_description())} · {_cpu(profile)} · '
        f"{_memory(profile)}</span>"
    )
    if profile.description:
        summary += f'<span class="gpupool-description">{escape(profile.description)}</span>'
    if choice.blocked_reason is not None:
        return (
            f'<div class="gpupool-profile gpupool-blocked" data-slug="{slug}" aria-disabled="true">'
            f'{summary}<span class="gpupool-reason">{escape(choice.blocked_reason)}</span></div>'
        )
    field_id = f"gpupool-profile-{slug}"
    check = " checked" if checked else ""
    return (
        f'<div class="gpupool-profile" data-slug="{slug}">'
        f'<label for="{field_id}"><input type="radio" name="{FIELD}" id="{field_id}" value="{slug}"{check}> '
        f"{summary}{_availability(choice)}</label></div>"
    )


def availability_text(choice: ProfileChoice) -> str:
    """``2 could start now`` or ``none free now: you will wait in a queue (3 waiting)``."""
    if choice.available_now > 0:
        return f"{choice.available_now} could start now"
    return f"none free now: you will wait in a queue ({choice.queued} waiting)"


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
    user may not use, or that never fits, is left out): display name, slug, and a description that carries
    the live availability. No ``kubespawner_override``: the granted lease, not the form, sets the pod's
    resources, node and environment."""
    usable = [c for c in choices if c.usable]
    default = next((c for c in usable if c.profile.default), usable[0] if usable else None)
    rows: list[dict[str, object]] = []
    for choice in usable:
        profile = choice.profile
        live = (
            f"{choice.available_now} can start now"
            if choice.available_now
            else f"none free now, {choice.queued} waiting: you would queue"
        )
        details = f"{profile.gpu_description()} · {_cpu(profile)} · {_memory(profile)} · {live}"
        if choice.simulated:
            details += " (simulated pool)"
        description = f"{profile.description} — {details}" if profile.description else details
        row: dict[str, object] = {
            "display_name": profile.display_name,
            "slug": profile.slug,
            "description": description,
        }
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
