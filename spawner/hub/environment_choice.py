"""A profile's environments in the spawn form, as pure functions: the select (an environment no GPU of the pool
can run is a disabled option saying why), what it preselects, and reading the choice back."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from ..pool.environments import FIELD as ENVIRONMENT
from ..pool.environments import Environment, choose
from ..pool.profiles import Profile, preselected_environment


def environment_field_name(slug: str) -> str:
    """The form field of a profile's environment choice (one per profile: only the chosen profile's counts)."""
    return f"{ENVIRONMENT}-{slug}"


def unrunnable_text(environment: Environment, why: str) -> str:
    """``Code built for CUDA 12.4 — cannot run on this profile's GPUs: needs CUDA 12.4; the A100-40GB's
    driver 535.104.05 supports up to 12.2 (on a100-01)``."""
    return f"{environment.display_name} — cannot run on this profile's GPUs: {why}"


def not_offered_text(environment: Environment, why: str) -> str:
    """The same said in a Kubernetes profile's description, where KubeSpawner's choices cannot be disabled and
    the environment is left out instead: ``Code built for CUDA 12.4 not offered: needs CUDA 12.4; …``."""
    return f"{environment.display_name} not offered: {why}"


def environment_field(profile: Profile, closed: Mapping[str, str]) -> str:
    """The profile's environments as a select; one no GPU of the pool can run is a disabled option saying why
    (the service would refuse it: :func:`gpupool.spawner.pool.profiles.refuse_environment`)."""
    if not profile.environments:
        return ""
    name = escape(environment_field_name(profile.slug))
    selected = preselected_environment(profile, closed)
    options = "".join(_environment_option(e, closed.get(e.slug), e is selected) for e in profile.environments)
    return (
        f'<label class="gpupool-environment" for="{name}">Environment '
        f'<select name="{name}" id="{name}">{options}</select></label>'
    )


def _environment_option(environment: Environment, never_fits: str | None, selected: bool) -> str:
    value = escape(environment.slug)
    if never_fits is not None:
        said = escape(unrunnable_text(environment, never_fits))
        return f'<option value="{value}" disabled title="{escape(never_fits)}">{said}</option>'
    return (
        f'<option value="{value}"{" selected" if selected else ""}>{escape(environment.describe())}</option>'
    )


def environment_of(options: Mapping[str, Any], profile: Profile) -> Environment | None:
    """The environment ``options`` choose for ``profile`` (its default when they name none); raises
    :class:`UnknownEnvironment` listing the ones it offers."""
    raw = options.get(ENVIRONMENT)
    slug = str(raw[0] if isinstance(raw, list) and raw else raw or "").strip() or None
    return choose(profile.environments, slug, profile.slug)
