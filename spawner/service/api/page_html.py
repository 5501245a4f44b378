"""The dashboard's HTML, built by pure functions from plain data (no I/O, no clock), so it is tested without
a server or a browser. :mod:`.pages` gathers the data and serves the pages."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...pool.expected_start import time_and_span, time_of_day
from ...pool.gpu_equivalents import shares_worth
from ..leasing.culls import Culls
from ..telemetry.host_usage import HostUse

NA = "N/A"


@dataclass(frozen=True)
class IdleDevice:
    """A held device whose utilisation stayed below the threshold for all of ``seconds`` up to now."""

    uuid: str
    label: str
    user: str
    lease_id: str
    seconds: float
    peak: float  # the highest utilisation seen in that time, percent


@dataclass(frozen=True)
class QueuedLease:
    position: int
    user: str
    profile: str
    ask: str
    waited_seconds: float
    lease_id: str


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h``, ``2 h 10 min``, ``4 d 2 h``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h" + (f" {minutes} min" if minutes else "")
    days, hours = divmod(hours, 24)
    return f"{days} d" + (f" {hours} h" if hours else "")


def heat_colour(utilization: float | None) -> str:
    """The heat map's colour for a utilisation percentage: grey for "not available", else from pale blue
    (idle) through yellow to red (busy)."""
    if utilization is None:
        return "#c8c8c8"
    u = min(max(utilization, 0.0), 100.0) / 100
    hue = 210 - 210 * u  # 210 (blue) -> 0 (red)
    return f"hsl({hue:.0f}, 75%, {88 - 38 * u:.0f}%)"


def _pct(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def _e(value: object) -> str:
    return html.escape(str(value))


def idle_line(idle: IdleDevice) -> str:
    """``3 h at 0% on H100 #5, alice`` (``at ≤4%`` when it rose a little, to 3.2%, but stayed below the threshold)."""
    level = "0%" if idle.peak == 0 else f"≤{math.ceil(idle.peak)}%"  # never "≤0%" (a peak of 0.5 rounded)
    return f"{duration(idle.seconds)} at {level} on {idle.label}, {idle.user}"


def device_cell(
    label: str,
    uuid: str,
    holders: Sequence[str],
    health: str,
    sample: Mapping[str, Any] | None,
    extra: str = "",
    *,
    leased_whole: bool = True,
    controls: str = "",
) -> str:
    """One device in the tree: a heat-coloured square, its label, who holds it, health and latest readings,
    then ``controls`` (an admin's buttons). ``leased_whole`` False (a GPU in MIG mode, leased only through its
    slices): no "free" or holder."""
    util = sample.get("gpu_utilization") if sample else None
    memory = sample.get("memory_used_mib") if sample else None
    total = sample.get("memory_total_mib") if sample else None
    memory_text = (
        NA if memory is None else f"{memory / 1024:.1f}" + (f"/{total / 1024:.0f} GiB" if total else " GiB")
    )
    board = _board(sample) if sample else ""
    # a device out of the pool is not "free" to anyone: its health alone says what it is
    unheld = "free" if health == "healthy" else ""
    holder = (", ".join(holders) if holders else unheld) if leased_whole else "split into MIG slices"
    state = "" if health == "healthy" else f' <span class="bad">{_e(health)}</span>'
    return (
        f'<div class="dev{" held" if holders else ""}" title="{_e(uuid)}">'
        f'<span class="sq" style="background:{heat_colour(util)}"></span>'
        f'<b>{_e(label)}</b>{_e(extra)} — <span class="who">{_e(holder)}</span>{state} '
        f'<span class="m">util {_pct(util)} · mem {memory_text}{_e(board)}</span>{controls}</div>'
    )


def _board(sample: Mapping[str, Any]) -> str:
    """`` · 48 °C · 360/700 W``: what a GPU's board reads (an admin's trial found them on no page); a MIG
    slice, whose board is its GPU's, reads neither."""
    temperature, power, limit = (sample.get(k) for k in ("temperature_c", "power_w", "power_limit_w"))
    said = [f"{temperature:.0f} °C"] if temperature is not None else []
    if power is not None:
        said.append(f"{power:.0f}/{limit:.0f} W" if limit else f"{power:.0f} W")
    return "".join(f" · {part}" for part in said)


Controls = Callable[[str, int | None, str], str]  # (node, GPU index or None, health) -> buttons' HTML


def _no_controls(_node: str, _gpu_index: int | None, _health: str) -> str:
    return ""


def pool_tree(
    pool: Mapping[str, Any],
    users_of: Mapping[str, str],
    latest: Mapping[str, Mapping[str, Any]],
    controls: Controls = _no_controls,
) -> str:
    """Nodes → GPUs → MIG slices and shares, from ``describe_pool``; ``users_of`` maps a lease id (the
    pool's holder) to ``user (server or job)``; ``controls`` adds an admin's buttons to each node and GPU."""
    parts = []
    for node in pool.get("nodes", []):
        health = "" if node["health"] == "healthy" else f' <span class="bad">{_e(node["health"])}</span>'
        made_up = ' <span class="sim">simulated</span>' if node.get("simulated") else ""
        gpus = []
        for gpu in node["gpus"]:
            holders = [users_of.get(h, h) for h in gpu["holders"]]
            extra = f" ({gpu['mode']}"
            if gpu["mode"] == "shared":
                extra += f", {gpu['free_milli'] / 10:g}% free"
            extra += ")"
            label = f"{gpu['product']} #{gpu['index']}"
            out = gpu.get("out", gpu["health"]) or "healthy"  # its own mark or its node's: both keep work off
            cell = device_cell(
                label,
                gpu["uuid"],
                holders,
                out,
                latest.get(gpu["uuid"]),
                extra,
                leased_whole=gpu["mode"] != "mig",
                controls=controls(node["name"], gpu["index"], gpu["health"]),
            )
            slices = "".join(
                device_cell(
                    f"MIG {m['profile']} @{m['start']}",
                    m["uuid"],
                    [users_of.get(h, h) for h in m["holders"]],
                    out,  # a slice is as healthy as its GPU
                    latest.get(m["uuid"]),
                )
                for m in gpu["mig"]
            )
            gpus.append(f"<li>{cell}{f'<ul class=mig>{slices}</ul>' if slices else ''}</li>")
        cpu = f"CPU {node['cpu_free_milli'] / 1000:g}/{node['cpu_milli'] / 1000:g} free"
        parts.append(
            f'<li class="node"><b>{_e(node["name"])}</b>{health}{made_up} <span class="m">{cpu}</span>'
            f"{controls(node['name'], None, node['health'])}"
            f"<ul>{''.join(gpus) or '<li>(no GPUs)</li>'}</ul></li>"
        )
    return f'<ul class="tree">{"".join(parts)}</ul>'


def heat_map(
    pool: Mapping[str, Any], latest: Mapping[str, Mapping[str, Any]], holders: Mapping[str, str]
) -> str:
    """A row of squares per node, one per leasable device (a whole or shared GPU, or a MIG slice),
    coloured by its latest utilisation. A colour alone says nothing to a screen reader or on a glance, so
    each square is labelled (``title`` and ``aria-label``) with what it is, its use and who holds it;
    ``holders`` maps a lease id to ``alice's server``."""
    rows = []
    for node in pool.get("nodes", []):
        cells = []
        for gpu in node["gpus"]:
            name = f"{gpu['product']} #{gpu['index']}"
            devices = [(f"MIG {m['profile']} slice of {name}", m) for m in gpu["mig"]] or [(name, gpu)]
            health = next((h for h in (gpu["health"], node["health"]) if h != "healthy"), "")
            for label, device in devices:
                util = latest.get(device["uuid"], {}).get("gpu_utilization")
                said = heat_label(
                    f"{label} on {node['name']}", util, [holders.get(h, h) for h in device["holders"]], health
                )
                out = " out" if health else ""  # drained or unhealthy: outlined whatever its colour
                cells.append(
                    f'<span class="hm{out}" role="img" data-uuid="{_e(device["uuid"])}" title="{_e(said)}" '
                    f'aria-label="{_e(said)}" style="background:{heat_colour(util)}">{_e(_pct(util))}</span>'
                )
        rows.append(f"<tr><th>{_e(node['name'])}</th><td>{''.join(cells)}</td></tr>")
    return f'<table class="heat">{"".join(rows)}</table>'


def heat_label(device: str, utilization: float | None, holders: Sequence[str], health: str = "") -> str:
    """``H100-80GB #3 on dgx-h100-01: 42% used, held by alice's server`` (``, drained`` when not healthy; an
    unheld device out of the pool is not called free)."""
    use = "utilisation not available" if utilization is None else f"{utilization:.0f}% used"
    who = f"held by {' and '.join(holders)}" if holders else "" if health else "free"
    return f"{device}: " + ", ".join(part for part in (use, who, health) if part)


def queue_table(queue: Sequence[QueuedLease]) -> str:
    if not queue:
        return "<p>Nobody is waiting.</p>"
    rows = "".join(
        f"<tr><td>{q.position + 1}</td><td>{_e(q.user)}</td><td>{_e(q.profile)}</td><td>{_e(q.ask)}</td>"
        f"<td>{duration(q.waited_seconds)}</td><td>{_e(q.lease_id)}</td></tr>"
        for q in queue
    )
    return (
        '<table class="queue"><tr><th>#</th><th>user</th><th>profile</th><th>asks for</th><th>waiting</th>'
        f"<th>lease</th></tr>{rows}</table>"
    )


def host_table(rows: Sequence[tuple[str, str, str, HostUse]]) -> str:
    """Per running server or job (holder, profile, lease, use): CPU and memory used against the limits."""
    if not rows:
        return "<p>No server or job runs.</p>"

    def used(value: float | None, text: str) -> str:
        return "–" if value is None else text

    body = "".join(
        f"<tr><td>{_e(who)}</td><td>{_e(profile)}</td>"
        f"<td>{used(u.cpu_used, f'{u.cpu_used or 0:.1f}')} of {u.cpu_limit:g}</td>"
        f"<td>{used(u.memory_used_mib, f'{(u.memory_used_mib or 0) / 1024:.1f}')} of "
        f"{u.memory_limit_mib / 1024:.1f}</td><td>{_e(lease_id)}</td></tr>"
        for who, profile, lease_id, u in rows
    )
    return (
        '<table class="host"><tr><th>holder</th><th>profile</th><th>CPU cores used</th>'
        f"<th>memory GiB used</th><th>lease</th></tr>{body}</table>"
    )


def idle_list(idle: Iterable[IdleDevice], window_note: str) -> str:
    items = "".join(f'<li class="idle">{_e(idle_line(i))}</li>' for i in idle)
    return (
        f'<ul class="idle-list">{items}</ul>'
        if items
        else f"<p>No held device is idle ({_e(window_note)}).</p>"
    )


def cull_list(kept: Culls, now: float, shown: int = 20) -> str:
    """The servers warned of culling (when they stop, and why), then the latest culls of the last 7 days, newest
    first; times in the host's zone, as elsewhere on the page."""
    warnings, culls = kept.pending(now), kept.since(now - 7 * 86400, limit=shown + 1)
    items = [
        f'<li class="warned">{_e(_server_of(w.user, w.server))} {_e(_stops(w.cull_at, now))}: {_e(w.reason)}</li>'
        for w in warnings
    ]
    items += [
        f'<li class="culled">{_e(time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(c.at)))} '
        f"{_e(_server_of(c.user, c.server))} culled ({_e(c.limit)}): {_e(c.reason)}</li>"
        for c in culls[:shown]
    ]
    more = "<p>More in GET api/v1/culls.</p>" if len(culls) > shown else ""
    return (
        f'<ul class="cull-list">{"".join(items)}</ul>{more}' if items else "<p>No warnings, and no culls.</p>"
    )


def _stops(cull_at: float, now: float) -> str:
    """``stops at 14:05 UTC (in about 10 min)``; past that time, ``is due (since 14:05 UTC)``: the culler's next
    pass stops it."""
    if cull_at <= now:
        return f"is due (since {time_of_day(cull_at)})"
    return f"stops at {time_and_span(cull_at, now, time_of_day)}"


def _server_of(user: str, server: str) -> str:
    return f"{user}'s server" + (f" {server}" if server else "")


def summary_line(summary: Mapping[str, Any]) -> str:
    mig = ", ".join(f"{p} ×{n}" for p, n in summary.get("mig_slices_free", {}).items()) or "none"
    return _e(
        f"{summary.get('nodes', 0)} nodes, {summary.get('gpus', 0)} GPUs. Free now: "
        f"{summary.get('whole_gpus_free', 0)} whole GPUs; MIG slices {mig}; "
        f"{shares_worth(summary.get('shared_milli_free', 0))}."
    )


def page(
    title: str,
    body: str,
    *,
    simulated: bool | None,
    refresh_seconds: float = 5.0,
    nav: str = "",
    xsrf: str = "",
    script: str = "",
) -> str:
    """A whole page; its script swaps in a fresh ``#gpupool-dashboard`` every ``refresh_seconds`` (and
    whenever another script calls ``gpupoolRefresh()``). ``nav`` goes on top; ``xsrf`` (the browser's XSRF
    token, on the refreshed part so a restarted service's new one arrives) and ``script`` are the console's;
    ``#gpupool-result`` says what its last action did, outside the refreshed part."""
    label = '<span class="sim">simulated</span>' if simulated else ""
    refresh = (
        "<script>window.gpupoolRefresh=async()=>{try{const r=await fetch(location.href,"
        "{credentials:'same-origin'});if(!r.ok)return;"
        "const d=new DOMParser().parseFromString(await r.text(),'text/html');"
        "const n=d.getElementById('gpupool-dashboard');if(n)document.getElementById('gpupool-dashboard')"
        f".replaceWith(n);}}catch(e){{}}}};setInterval(window.gpupoolRefresh,{int(refresh_seconds * 1000)});"
        "</script>"
    )
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{_e(title)}</title><style>{_CSS}</style>'
        f"</head><body>{nav}<h1>{_e(title)} {label}</h1>"
        '<p id="gpupool-result" role="status" aria-live="polite"></p>'
        f'<div id="gpupool-dashboard" data-xsrf="{_e(xsrf)}">{body}</div>{refresh}{script}'
        "</body></html>"
    )


def section(title: str, content: str, css_id: str) -> str:
    return f'<section id="{css_id}"><h2>{_e(title)}</h2>{content}</section>'


def my_jobs_table(jobs: Sequence[tuple[str, str, str, str, str]]) -> str:
    """A user's unfinished jobs (rows of id, name, profile, state, why): a failure trial's researcher found no
    jobs on their page, and the reason a job was requeued only in the API's history."""
    if not jobs:
        return "<p>No job of yours is queued or running.</p>"
    body = "".join("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in jobs)
    head = "".join(f"<th>{h}</th>" for h in ("job", "name", "profile", "state", "why"))
    return f'<table class="jobs"><tr>{head}</tr>{body}</table>'


def usage_table(rows: Sequence[tuple[str, float, float, float]]) -> str:
    """Per profile: GPU-hours held, used, and the share used (rows of profile, held, used, unknown hours)."""
    if not rows:
        return "<p>No usage recorded yet.</p>"
    body = "".join(
        f"<tr><td>{_e(p)}</td><td>{held:.2f}</td><td>{used:.2f}</td>"
        f"<td>{_pct(100 * used / held if held else None)}</td></tr>"
        for p, held, used, _unknown in rows
    )
    return (
        '<table class="usage"><tr><th>profile</th><th>GPU-h held</th><th>GPU-h used</th><th>used</th></tr>'
        f"{body}</table>"
    )


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:1em 2em;color:#222}h1 .sim,.sim{background:#fd7;"
    "font-size:60%;padding:2px 8px;border-radius:4px;vertical-align:middle}"
    "ul.tree,ul.tree ul{list-style:none;padding-left:1.2em}.node{margin:.4em 0}"
    ".dev{margin:2px 0}.sq{display:inline-block;width:12px;height:12px;margin-right:6px;border:1px solid #999;"
    "vertical-align:middle}.m{color:#667;font-size:90%}.who{color:#225}.held .who{font-weight:bold}"
    ".bad{color:#b00;font-weight:bold}table{border-collapse:collapse}td,th{padding:2px 8px;text-align:left}"
    ".heat .hm{display:inline-block;min-width:3.2em;text-align:center;margin:1px;padding:4px 2px;"
    "font-size:80%;border-radius:3px}.heat .hm.out{outline:2px dashed #b00}.idle{color:#a40}"
    "section{margin-bottom:1.2em}"
    "nav.hub{display:flex;gap:1.2em;align-items:center;background:#f3f4f6;margin:-1em -2em 0;padding:.5em 2em;"
    "border-bottom:1px solid #ddd}nav.hub .me{margin-left:auto;color:#667}"
    ".side{display:flex;flex-wrap:wrap;gap:2em;align-items:flex-start}.side>section{flex:1 1 28em}"
    "button.act{font-size:80%;margin-left:.5em;padding:1px 8px;cursor:pointer}"
    "#gpupool-result:empty{display:none}#gpupool-result{padding:.4em .8em;border-radius:4px;background:#eef}"
    "#gpupool-result.ok{background:#e3f6e3}#gpupool-result.bad{background:#fde3e3}"
)
