"""``JobPanel()``: submit training jobs and watch them from a notebook, without blocking the kernel.

The panel is a form (command, profile with live availability, maximum runtime, retries), a table of my jobs
with their state and queue position, and the log of the chosen job, kept current every ``refresh`` seconds
by a task on the kernel's event loop (see :mod:`.poller`); the kernel stays free for other cells, and the
buttons' calls to the service are tasks too. Cancel stops the chosen job.

What the panel shows is built by plain functions (:func:`jobs_table`, :func:`profile_choices`), so the
rendering is tested without a browser and the widgets only hold it.
"""

from __future__ import annotations

import asyncio
import html
import shlex
import time
from collections.abc import Iterable, Mapping
from typing import Any

import ipywidgets as w  # type: ignore[import-untyped]
from traitlets import Float

from ._api import NO_EXPECTED_START, Connection, GpupoolError, time_and_span, time_of_day
from .gpu_monitor import SIMULATED_STYLE
from .jobs import FINISHED, Job, submission
from .poller import Poller, in_background

WAITING = "waiting for the gpupool service…"
REPLACED = "replaced by a newer JobPanel (a cell ran again): this one no longer refreshes"

# GpuMonitor's label, styled here: the panel carries no style sheet of its own
_SIMULATED_LABEL = f'<span class="gpupool-simulated" style="{SIMULATED_STYLE}">simulated</span> '
_LOG_TAIL = 20_000  # characters of the log shown; the rest is one job.logs() away


def profile_choices(profiles: Iterable[Mapping[str, Any]], now: float | None = None) -> list[tuple[str, str]]:
    """``(label, slug)`` per profile the user may use, as the spawn form lists them: the label says how many
    could start now, or why the pool can never run it or the user's quota refuses it now."""
    at = time.time() if now is None else now
    choices = []
    for profile in profiles:
        if profile.get("never_fits"):
            label = f"{profile['display_name']} — cannot run on this pool: {profile['never_fits']}"
        elif profile.get("quota_forbids"):
            label = f"{profile['display_name']} — not within your quota: {profile['quota_forbids']}"
        elif profile.get("over_quota"):
            label = f"{profile['display_name']} — not now: {profile['over_quota']}"
        else:
            now, queued = int(profile.get("available_now", 0)), int(profile.get("queued", 0))
            waiting = f", {queued} queued" if queued else ""
            start = profile.get("expected_start")
            expected = f", one could start by {_when(float(start), at)}" if not now and start else ""
            label = f"{profile['display_name']} — {now} free now{waiting}{expected}"
        choices.append((label, str(profile["slug"])))
    return choices


def default_profile(profiles: Iterable[Mapping[str, Any]]) -> str | None:
    """The slug the spawn form would check: the default profile, else the first the pool can run."""
    usable = [p for p in profiles if not p.get("never_fits") and not p.get("quota_forbids")]
    chosen = next((p for p in usable if p.get("default")), usable[0] if usable else None)
    return str(chosen["slug"]) if chosen else None


def jobs_table(jobs: Iterable[Mapping[str, Any]], now: float | None = None) -> str:
    """My jobs, newest first, as an HTML table: name, state (with queue position), devices, reason."""
    at = time.time() if now is None else now
    rows = []
    for job in sorted(jobs, key=lambda j: j.get("submitted_at", 0), reverse=True):
        state = str(job["state"])
        held_up = job.get("held_up")  # the cluster silent, or its pod not yet started: the cluster's words
        if state in ("queued", "requeued") and job.get("position") is not None:
            state += f" (#{int(job['position']) + 1} in line"
            start = job.get("expected_start")
            state += f", expected to start by {_when(float(start), at)}" if start else ""
            state += f", {NO_EXPECTED_START}" if start is None and not held_up else ""
            state += f"; {held_up})" if held_up else ")"
        elif held_up:
            state += f" (not started: {held_up})"
        devices = ", ".join(d.get("label", d.get("uuid", "")) for d in job.get("devices", [])) or "—"
        cells = (job["id"], job["name"], job["profile"], state, devices, job.get("reason", ""))
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    if not rows:
        return "<p>No jobs yet: submit one above.</p>"
    head = "".join(f"<th>{h}</th>" for h in ("id", "name", "profile", "state", "devices", "why"))
    return f'<table class="gpupool-jobs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _when(start: float, now: float) -> str:
    """``06:14 UTC (in about 11.9 h)``: a time of day alone cannot tell today's from tomorrow's."""
    return time_and_span(start, now, time_of_day)


def _error(text: str) -> str:
    return f'<span class="gpupool-error">{html.escape(text)}</span>'


class JobPanel(w.VBox):  # type: ignore[misc]  # ipywidgets is untyped
    """The panel; display it as a cell's last expression. ``close()`` stops its refreshing.

    It returns at once and says it is waiting until the service first answers. One panel refreshes per
    kernel: a new one (a cell run again) stops the previous one's refreshing.
    """

    refresh = Float(2.0, min=0.1, help="Seconds between refreshes, e.g. ``JobPanel(refresh=5)``.")

    def __init__(self, connection: Connection | None = None, **traits: Any) -> None:
        self._poller: Poller | None = None  # first: ipywidgets calls close() when __init__ fails
        self.connection = connection or Connection()
        self._choose: str | None = None  # the job to choose at the next refresh (one just submitted)
        self._about_service = True  # the message line is about the service (waiting, unreachable)
        self.command = w.Text(description="Command", placeholder="python train.py --steps 200")
        self.profile = w.Dropdown(description="Profile", options=[])
        self.max_hours = w.BoundedFloatText(value=1.0, min=0.01, max=24 * 30, description="Max hours")
        self.retries = w.BoundedIntText(value=2, min=0, max=20, description="Retries")
        self.submit_button = w.Button(description="Submit", button_style="primary", icon="play")
        self.message = w.HTML(WAITING)
        self.standing = w.HTML()  # the user's quota and what they hold: servers and jobs
        self.table = w.HTML()
        self.chosen = w.Dropdown(description="Job", options=[])
        self.cancel_button = w.Button(description="Cancel job", button_style="danger", icon="stop")
        # not ``self.log``: every widget's ``log`` is traitlets' Logger trait, which refuses a Textarea
        self.log_view = w.Textarea(layout=w.Layout(width="100%", height="16em"), disabled=True)
        self.submit_button.on_click(lambda _button: self.submit())
        self.cancel_button.on_click(lambda _button: self.cancel())
        self.chosen.observe(lambda _change: self._refresh_now(), "value")  # its log now, not at the next tick
        form = w.VBox(
            [self.command, w.HBox([self.profile, self.max_hours, self.retries]), self.submit_button]
        )
        super().__init__(
            [
                form,
                self.standing,
                self.message,
                self.table,
                w.HBox([self.chosen, self.cancel_button]),
                self.log_view,
            ],
            **traits,
        )
        self.add_class("gpupool-job-panel")
        self._poller = Poller("job-panel", self.update, lambda: self.refresh, self._replaced)
        self._poller.start()

    def submit(self) -> asyncio.Task[Job | None] | Job | None:
        """Submit what the form says, without blocking: in a kernel a task (whose result is the job, or None
        when refused); the message line tells what happened."""
        return in_background(self._submit())

    async def _submit(self) -> Job | None:
        self.submit_button.disabled = True
        try:
            command = shlex.split(self.command.value)
            if not command:
                raise GpupoolError(400, "invalid_request", "command: type a command, e.g. python train.py")
            if self.profile.value is None:
                raise GpupoolError(400, "invalid_request", "profile: no profile is available to you")
            body = submission(
                command,
                self.profile.value,
                max_runtime=self.max_hours.value * 3600,
                retries=self.retries.value,
            )
            created = await self.connection.acall("POST", "jobs", json=body)
        except (GpupoolError, ValueError) as error:
            self._say(_error(str(error)))
            return None
        finally:
            self.submit_button.disabled = False
        job = Job(str(created["id"]), self.connection)
        self._say(f"Submitted job {html.escape(job.id)}.")
        self._refresh_now(choose=job.id)
        return job

    def cancel(self) -> asyncio.Task[None] | None:
        """Cancel the chosen job, without blocking; the message line tells its state."""
        return in_background(self._cancel())

    async def _cancel(self) -> None:
        chosen = self.chosen.value
        if not chosen:
            return
        try:
            state = str((await self.connection.acall("DELETE", f"jobs/{chosen}"))["state"])
        except GpupoolError as error:
            self._say(_error(str(error)))
            return
        self._say(f"Job {html.escape(chosen)} is {html.escape(state)}.")
        self._refresh_now()

    def _refresh_now(self, choose: str | None = None) -> None:
        self._choose = choose or self._choose
        if self._poller is not None and self._poller.running:
            self._poller.poke()

    async def update(self) -> None:
        """Read the profiles, my jobs and the chosen job's log once, and show them (or what went wrong)."""
        try:
            profiles, jobs = await asyncio.gather(
                self.connection.acall("GET", "profiles"), self.connection.acall("GET", "jobs")
            )
        except GpupoolError as error:
            self._say(_error(str(error)), about_service=True)
            return
        if self._about_service:
            self._say("")  # answered: the waiting, or the last failure, is over
        self._show(profile_choices(profiles), jobs, default_profile(profiles))
        await self._show_standing(simulated=any(p.get("simulated") for p in profiles))
        if self.chosen.value:
            try:
                log = await self.connection.atext(f"jobs/{self.chosen.value}/logs", offset=0)
                self.log_view.value = log[-_LOG_TAIL:]
            except GpupoolError as error:
                self.log_view.value = str(error)

    async def _show_standing(self, *, simulated: bool) -> None:
        """The simulated label (the pool is no real GPUs) and the user's quota line; no quota line from a
        service too old to answer ``GET quota``."""
        try:
            summary = str((await self.connection.acall("GET", "quota"))["summary"])
        except GpupoolError:
            summary = ""
        label = _SIMULATED_LABEL if simulated else ""
        line = f'<span class="gpupool-standing">{html.escape(summary)}</span>' if summary else ""
        self.standing.value = label + line

    def _show(self, choices: list[tuple[str, str]], jobs: list[dict[str, Any]], default: str | None) -> None:
        """The choices (keeping the user's pick, else the form's default), the table, and the job whose log
        shows: the one just submitted or picked, else the newest."""
        if choices != list(self.profile.options):
            keep = self.profile.value or default
            self.profile.options = choices
            slugs = {slug for _, slug in choices}
            self.profile.value = keep if keep in slugs else default if default in slugs else None
        self.table.value = jobs_table(jobs)
        newest = max(jobs, key=lambda j: j.get("submitted_at", 0))["id"] if jobs else None
        ids = [(f"{j['id']} {j['name']} ({j['state']})", j["id"]) for j in reversed(jobs)]
        keep, self._choose = self._choose or self.chosen.value or newest, None
        if ids != list(self.chosen.options):
            self.chosen.options = ids
        if keep in {i for _, i in ids} and keep != self.chosen.value:
            self.chosen.value = keep
        states = {j["id"]: j["state"] for j in jobs}  # a job that has ended has nothing left to cancel
        self.cancel_button.disabled = states.get(self.chosen.value, "succeeded") in FINISHED

    def _say(self, text: str, *, about_service: bool = False) -> None:
        """Show ``text`` on the message line; a refresh clears it only when it is about the service."""
        self.message.value, self._about_service = text, about_service

    def _replaced(self) -> None:
        self._say(_error(REPLACED))

    def close(self) -> None:
        if self._poller is not None:
            self._poller.stop()
        super().close()
