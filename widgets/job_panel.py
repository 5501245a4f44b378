"""``JobPanel()``: submit training jobs and watch them from a notebook, without blocking the kernel.

The panel is a form (command, profile with live availability, maximum runtime, retries), a table of my jobs
with their state and queue position, and the log of the chosen job, kept current by a background thread
every ``refresh`` seconds; the kernel stays free for other cells. Cancel stops the chosen job.

What the panel shows is built by plain functions (:func:`jobs_table`, :func:`profile_choices`), so the
rendering is tested without a browser and the widgets only hold it.
"""

from __future__ import annotations

import html
import shlex
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import ipywidgets as w  # type: ignore[import-untyped]

from .client import Connection, GpupoolError
from .jobs import Job, submit

_LOG_TAIL = 20_000  # characters of the log shown; the rest is one job.logs() away


def profile_choices(profiles: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """``(label, slug)`` per profile the user may use, the label saying how many could start now."""
    choices = []
    for profile in profiles:
        if profile.get("never_fits"):
            continue
        now, queued = int(profile.get("available_now", 0)), int(profile.get("queued", 0))
        waiting = f", {queued} queued" if queued else ""
        label = f"{profile['display_name']} — {now} free now{waiting}"
        choices.append((label, str(profile["slug"])))
    return choices


def jobs_table(jobs: Iterable[Mapping[str, Any]]) -> str:
    """My jobs, newest first, as an HTML table: name, state (with queue position), devices, reason."""
    rows = []
    for job in sorted(jobs, key=lambda j: j.get("submitted_at", 0), reverse=True):
        state = str(job["state"])
        if state == "queued" and job.get("position") is not None:
            state += f" (#{int(job['position']) + 1} in line)"
        devices = ", ".join(d.get("label", d.get("uuid", "")) for d in job.get("devices", [])) or "—"
        cells = (job["id"], job["name"], job["profile"], state, devices, job.get("reason", ""))
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    if not rows:
        return "<p>No jobs yet: submit one above.</p>"
    head = "".join(f"<th>{h}</th>" for h in ("id", "name", "profile", "state", "devices", "why"))
    return f'<table class="gpupool-jobs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


class JobPanel(w.VBox):  # type: ignore[misc]  # ipywidgets is untyped
    """The panel; display it as a cell's last expression. ``close()`` stops its refresh thread."""

    def __init__(self, connection: Connection | None = None, refresh: float = 2.0) -> None:
        # first: ipywidgets calls close() when __init__ fails, and close() needs the stop event
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.connection = connection or Connection()
        self.refresh = refresh
        self.command = w.Text(description="Command", placeholder="python train.py --epochs 10")
        self.profile = w.Dropdown(description="Profile", options=[])
        self.max_hours = w.BoundedFloatText(value=1.0, min=0.01, max=24 * 30, description="Max hours")
        self.retries = w.BoundedIntText(value=2, min=0, max=20, description="Retries")
        self.submit_button = w.Button(description="Submit", button_style="primary", icon="play")
        self.message = w.HTML()
        self.table = w.HTML()
        self.chosen = w.Dropdown(description="Job", options=[])
        self.cancel_button = w.Button(description="Cancel job", button_style="danger", icon="stop")
        # not ``self.log``: every widget's ``log`` is traitlets' Logger trait, which refuses a Textarea
        self.log_view = w.Textarea(layout=w.Layout(width="100%", height="16em"), disabled=True)
        self.submit_button.on_click(lambda _button: self.submit())
        self.cancel_button.on_click(lambda _button: self.cancel())
        form = w.VBox(
            [self.command, w.HBox([self.profile, self.max_hours, self.retries]), self.submit_button]
        )
        super().__init__(
            [form, self.message, self.table, w.HBox([self.chosen, self.cancel_button]), self.log_view],
        )
        self.add_class("gpupool-job-panel")
        self.update()
        self._thread = threading.Thread(target=self._refresh_forever, name="gpupool-job-panel", daemon=True)
        self._thread.start()

    def submit(self) -> Job | None:
        """Submit what the form says; the message line tells what happened."""
        try:
            command = shlex.split(self.command.value)
            if not command:
                raise GpupoolError(400, "invalid_request", "command: type a command, e.g. python train.py")
            if self.profile.value is None:
                raise GpupoolError(400, "invalid_request", "profile: no profile is available to you")
            job = submit(
                command,
                self.profile.value,
                max_runtime=self.max_hours.value * 3600,
                retries=self.retries.value,
                connection=self.connection,
            )
        except (GpupoolError, ValueError) as error:
            self.message.value = f'<span class="gpupool-error">{html.escape(str(error))}</span>'
            return None
        self.message.value = f"Submitted job {html.escape(job.id)}."
        self.update(choose=job.id)
        return job

    def cancel(self) -> None:
        if not self.chosen.value:
            return
        try:
            state = Job(self.chosen.value, self.connection).cancel()
        except GpupoolError as error:
            self.message.value = f'<span class="gpupool-error">{html.escape(str(error))}</span>'
            return
        self.message.value = f"Job {html.escape(self.chosen.value)} is {html.escape(state)}."
        self.update()

    def update(self, choose: str | None = None) -> None:
        """Read the profiles, my jobs and the chosen job's log once, and show them."""
        with self._lock:
            try:
                profiles = self.connection.call("GET", "profiles")
                jobs = self.connection.call("GET", "jobs")
            except GpupoolError as error:
                self.message.value = f'<span class="gpupool-error">{html.escape(str(error))}</span>'
                return
            choices = profile_choices(profiles)
            if choices != list(self.profile.options):
                keep = self.profile.value
                self.profile.options = choices
                if keep in {slug for _, slug in choices}:
                    self.profile.value = keep
            self.table.value = jobs_table(jobs)
            ids = [(f"{j['id']} {j['name']} ({j['state']})", j["id"]) for j in reversed(jobs)]
            if ids != list(self.chosen.options):
                keep = choose or self.chosen.value
                self.chosen.options = ids
                if keep in {i for _, i in ids}:
                    self.chosen.value = keep
            if self.chosen.value:
                try:
                    self.log_view.value = Job(self.chosen.value, self.connection).logs()[-_LOG_TAIL:]
                except GpupoolError as error:
                    self.log_view.value = str(error)

    def close(self) -> None:
        self._stop.set()
        super().close()

    def _refresh_forever(self) -> None:
        # A thread, not the kernel's event loop: a slow service never holds up the user's cells.
        while not self._stop.wait(self.refresh):
            self.update()
