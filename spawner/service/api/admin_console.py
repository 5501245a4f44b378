"""The admin's console on the dashboard: the hub's navigation, servers and jobs side by side, and buttons that
act through the service's own REST API, the one the CLI uses (drain and undrain a node or GPU, release a
server's lease, cancel a job), each after a ``confirm()``, with the answer shown on the page.

The page only asks: each route keeps its own checks (``custom:gpupool:admin`` for drains, who may touch a lease
or a job), so a request a non-admin forged from a button is refused (403) as it would be from the CLI. The
script authorises a request the way the page itself was: with the page's ``?token=`` as ``Authorization``, else
with the browser's login cookie and the page's XSRF token (``X-XSRFToken``, see
:meth:`.auth.Authenticator.token_of`).

A server is acted on through its lease. The hub's ``DELETE /hub/api/users/{user}/servers/{name}`` wants the
hub's own XSRF cookie, which a page under the service's prefix cannot read; stopping it with the service's own
hub token (which may stop servers, for reconciliation) would hand every gpupool admin a scope the hub never gave
them. So the button releases the lease (``DELETE leases/{id}``): its devices go back to the pool at once; a
queued spawn gives up; a running server is stopped by the service's reconciliation when
``GPUPOOL_STOP_UNLEASED`` is on (else it is reported as unleased).

Pure HTML from plain records, like :mod:`.page_html`; :mod:`.pages` gathers them.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .page_html import Controls, duration, section


@dataclass(frozen=True)
class ServerRow:
    """A server's lease, granted or queued."""

    user: str
    server: str  # "" for the default server
    profile: str
    state: str
    devices: str  # the devices' labels, or "" (queued, or a profile without GPUs)
    age_seconds: float  # since the lease was asked for
    lease_id: str

    @property
    def who(self) -> str:
        """``alice's server`` or ``alice's server big``."""
        return f"{self.user}'s server" + (f" {self.server}" if self.server else "")


@dataclass(frozen=True)
class JobRow:
    """A job that is not finished: queued, requeued or running."""

    job_id: str
    name: str
    user: str
    profile: str
    state: str
    age_seconds: float  # since it was submitted


def _e(value: object) -> str:
    return html.escape(str(value))


def hub_nav(hub_prefix: str, user: str, *, hub_admin: bool) -> str:
    """The hub's own navigation, so the dashboard is no dead end: Home, Token, Admin (for the hub's admins: it
    is their page) and Logout, under the hub's prefix (``/hub/``, or ``{JUPYTERHUB_BASE_URL}hub/``)."""
    prefix = hub_prefix.rstrip("/") + "/"
    links = [("home", "Home"), ("token", "Token")] + ([("admin", "Admin")] if hub_admin else [])

    def link(path: str, label: str) -> str:
        return f'<a href="{_e(prefix + path)}">{label}</a>'

    items = "".join(link(path, label) for path, label in links)
    return (
        f'<nav class="hub" aria-label="JupyterHub">{items}<span class="me">{_e(user)}</span>'
        f"{link('logout', 'Logout')}</nav>"
    )


def action_button(
    label: str, *, method: str, url: str, confirm: str, what: str, done: str, body: Any = None
) -> str:
    """A button :data:`CONSOLE_SCRIPT` turns into ``method url`` (with ``body`` as JSON) once the admin says
    yes to ``confirm``; ``done`` is shown when it worked, ``what`` names it when it did not."""
    data = {"method": method, "url": url, "confirm": confirm, "what": what, "done": done}
    if body is not None:
        data["body"] = json.dumps(body)
    attributes = "".join(f' data-{key}="{_e(value)}"' for key, value in data.items())
    return f'<button type="button" class="act"{attributes}>{_e(label)}</button>'


def device_controls(api_base: str) -> Controls:
    """The pool tree's buttons: Drain a healthy (or unhealthy) node or GPU, Undrain a drained one, Repair an
    unhealthy one (reset or replaced)."""

    def controls(node: str, gpu_index: int | None, health: str) -> str:
        what = f"node {node}" if gpu_index is None else f"GPU {gpu_index} of node {node}"
        body = {"node": node} | ({} if gpu_index is None else {"gpu_index": gpu_index})

        def post(label: str, route: str, confirm: str, done: str) -> str:
            return action_button(
                label,
                method="POST",
                url=f"{api_base}/admin/{route}",
                body=body,
                confirm=confirm,
                what=f"{label} {what}",
                done=f"{done} {what}.",
            )

        if health == "drained":
            return post(
                "Undrain", "undrain", f"Undrain {what}? New work may be placed there again.", "Undrained"
            )
        drain = post(
            "Drain",
            "drain",
            f"Drain {what}? Nothing new is placed there; jobs running there are stopped and requeued; servers "
            "keep running.",
            "Drained",
        )
        if health != "unhealthy":
            return drain
        repair = f"Mark {what} repaired? Only once it was reset or replaced: new work goes there again."
        return drain + post("Repair", "repair", repair, "Repaired")

    return controls


def _release_button(row: ServerRow, api_base: str) -> str:
    if row.state == "queued":
        effect = "The spawn waiting for it gives up."
    else:
        effect = (
            "Its devices go back to the pool now; the server runs on until it is stopped (the service's "
            "reconciliation stops it when GPUPOOL_STOP_UNLEASED is on)."
        )
    return action_button(
        "Release lease",
        method="DELETE",
        url=f"{api_base}/leases/{row.lease_id}",
        confirm=f"Release the {row.state} lease {row.lease_id} of {row.who}? {effect}",
        what=f"Release lease {row.lease_id}",
        done=f"Released lease {row.lease_id} of {row.who}.",
    )


def servers_table(rows: Sequence[ServerRow], api_base: str) -> str:
    if not rows:
        return "<p>No server holds or waits for a lease.</p>"
    body = "".join(
        f"<tr><td>{_e(r.user)}</td><td>{_e(r.server or 'default')}</td><td>{_e(r.profile)}</td>"
        f"<td>{_e(r.state)}</td><td>{_e(r.devices or '–')}</td><td>{duration(r.age_seconds)}</td>"
        f"<td>{_release_button(r, api_base)}</td></tr>"
        for r in rows
    )
    return (
        '<table class="servers"><tr><th>user</th><th>server</th><th>profile</th><th>state</th>'
        f"<th>devices</th><th>age</th><th></th></tr>{body}</table>"
    )


def jobs_table(rows: Sequence[JobRow], api_base: str) -> str:
    if not rows:
        return "<p>No job is queued or running.</p>"

    def cancel(row: JobRow) -> str:
        return action_button(
            "Cancel",
            method="DELETE",
            url=f"{api_base}/jobs/{row.job_id}",
            confirm=f"Cancel job {row.name or row.job_id} ({row.job_id}) of {row.user}? A running job is "
            "stopped (SIGTERM, then SIGKILL after the grace period).",
            what=f"Cancel job {row.job_id}",
            done=f"Cancelled job {row.job_id} of {row.user}.",
        )

    def requeue(row: JobRow) -> str:
        if row.state != "running":
            return ""
        return action_button(
            "Requeue",
            method="POST",
            url=f"{api_base}/jobs/{row.job_id}/requeue",
            confirm=f"Requeue job {row.name or row.job_id} ({row.job_id}) of {row.user}? It is stopped and waits "
            "in the queue again, resuming from its checkpoint folder; none of its retries is used.",
            what=f"Requeue job {row.job_id}",
            done=f"Requeued job {row.job_id} of {row.user}.",
        )

    body = "".join(
        f"<tr><td>{_e(r.job_id)}</td><td>{_e(r.name)}</td><td>{_e(r.user)}</td><td>{_e(r.profile)}</td>"
        f"<td>{_e(r.state)}</td><td>{duration(r.age_seconds)}</td><td>{cancel(r)}{requeue(r)}</td></tr>"
        for r in rows
    )
    return (
        '<table class="jobs"><tr><th>job</th><th>name</th><th>user</th><th>profile</th><th>state</th>'
        f"<th>age</th><th></th></tr>{body}</table>"
    )


def servers_and_jobs(servers: Sequence[ServerRow], jobs: Sequence[JobRow], api_base: str) -> str:
    """Servers and jobs side by side: both compete for the same devices through the same queue."""
    return (
        '<div class="side">'
        + section("Servers", servers_table(servers, api_base), "servers")
        + section("Jobs", jobs_table(jobs, api_base), "jobs")
        + "</div>"
    )


# One listener on the document: the buttons live in #gpupool-dashboard, which the page replaces every few
# seconds. The answer goes to #gpupool-result (outside it), then the page refreshes at once.
CONSOLE_SCRIPT = """<script>
document.addEventListener('click', async (event) => {
  const button = event.target.closest('button[data-url]');
  if (!button || !confirm(button.dataset.confirm)) return;
  const headers = {'Content-Type': 'application/json'};
  const token = new URLSearchParams(location.search).get('token');
  if (token) headers.Authorization = 'token ' + token;
  else headers['X-XSRFToken'] = document.getElementById('gpupool-dashboard').dataset.xsrf || '';
  const out = document.getElementById('gpupool-result');
  button.disabled = true;
  let said, how;
  try {
    const answer = await fetch(button.dataset.url, {method: button.dataset.method, headers,
      body: button.dataset.body, credentials: 'same-origin'});
    const problem = answer.ok ? {} : await answer.json().catch(() => ({}));
    said = answer.ok ? button.dataset.done
      : `${button.dataset.what}: refused (${answer.status}) ${problem.detail || ''}`;
    how = answer.ok ? 'ok' : 'bad';
  } catch (error) {
    said = `${button.dataset.what}: ${error}`;
    how = 'bad';
  }
  out.textContent = said;
  out.className = how;
  button.disabled = false;
  await window.gpupoolRefresh();
});
</script>"""
