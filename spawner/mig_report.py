"""MIG advice as an admin reads it and applies it: the GPU Operator's MIG Manager config (mig-parted's
``version: v1`` format), pool-file fragments, the before/after figures, JSON and text.

gpupool never changes a layout. An admin applies the advice with the MIG Manager (put the config.yaml in its
ConfigMap, then ``kubectl label node NODE nvidia.com/mig.config=gpupool-NODE --overwrite`` for each node to
change, as the text output spells out with the node names; the GPUs must be free), or with ``nvidia-smi
mig``/``nvidia-mig-parted apply`` on a host, and, for a simulated pool, edits the pool file's ``mig:``
entries. mig-parted places the instances itself; the pool-file fragments give one legal placement of the same
instances. GPUs a config does not list are left as they are (mig-parted skips them).
"""

from __future__ import annotations

import html
from collections import Counter
from itertools import groupby
from typing import Any

import yaml

from .pool.mig import largest_first
from .pool.mig_advice import Advice, GpuAdvice


def config_name(node: str) -> str:
    """The MIG Manager config advised for ``node`` (the value of its ``nvidia.com/mig.config`` label)."""
    return f"gpupool-{node}"


def mig_parted_config(advice: Advice) -> dict[str, Any]:
    """One mig-parted config per node, its MIG GPUs grouped by advised layout: ``mig-devices`` counts."""
    configs: dict[str, list[dict[str, Any]]] = {}
    for node, gpus in groupby(advice.gpus, key=lambda g: g.gpu.node):
        by_layout: dict[tuple[str, ...], list[int]] = {}
        for gpu in gpus:
            by_layout.setdefault(largest_first(p.profile for p in gpu.advised), []).append(gpu.gpu.index)
        configs[config_name(node)] = [
            {"devices": sorted(indices), "mig-enabled": True, "mig-devices": dict(Counter(combo))}
            for combo, indices in by_layout.items()
        ]
    return {"version": "v1", "mig-configs": configs}


def pool_fragment(advice: Advice) -> dict[str, Any]:
    """Each node's ``mig:`` entry for a pool file, GPU index → ``profile@start`` list."""
    return {
        "nodes": [
            {"name": node, "mig": {g.gpu.index: [str(p) for p in g.advised] for g in gpus}}
            for node, gpus in groupby(advice.gpus, key=lambda g: g.gpu.node)
        ]
    }


def _yaml(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, allow_unicode=True)


def _gpu(gpu: GpuAdvice) -> dict[str, Any]:
    return {
        "node": gpu.gpu.node,
        "index": gpu.gpu.index,
        "product": gpu.gpu.product,
        "current": [str(p) for p in gpu.gpu.layout],
        "advised": [str(p) for p in gpu.advised],
        "changed": gpu.changed,
    }


def describe_advice(advice: Advice, source: str) -> dict[str, Any]:
    """A JSON-ready account of ``advice``; ``source`` says where the demand came from."""
    return {
        "source": source,
        "demand": [{"ask": ask.label, "count": n, "servable": bool(ask.serves)} for ask, n in advice.demand],
        "unservable": advice.unservable,
        "kept": list(advice.kept),
        "missing": list(advice.missing),
        "gpus": [_gpu(g) for g in advice.gpus],
        "before": advice.before.as_dict(),
        "after": advice.after.as_dict(),
        "mig_parted": _yaml(mig_parted_config(advice)),
        "pool_file": _yaml(pool_fragment(advice)),
    }


def figures_rows(description: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The replayed figures, current against advised, as (what, current, advised) rows."""
    before, after = description["before"], description["after"]
    return [
        ("asks served", f"{before['served']} of {before['asked']}", f"{after['served']} of {after['asked']}"),
        (
            "GPU-equivalents served",
            f"{before['served_gpus']:g} of {before['asked_gpus']:g}",
            f"{after['served_gpus']:g} of {after['asked_gpus']:g}",
        ),
        ("asks waiting", str(before["waiting"]), str(after["waiting"])),
        (
            "stranded slices (free while asks wait)",
            f"{before['stranded']} of {before['instances']} ({before['stranded_gpus']:g} GPUs)",
            f"{after['stranded']} of {after['instances']} ({after['stranded_gpus']:g} GPUs)",
        ),
    ]


def render_advice(description: dict[str, Any]) -> str:
    """The advice as text: demand, each GPU's layout now and advised, the figures, then the two YAML forms."""
    gpus = description["gpus"]
    if not gpus and description.get("missing"):  # every MIG GPU drained or unhealthy
        return f"No GPU in MIG mode is in service: {_missing_text(description['missing'])}."
    if not gpus:
        return (
            "No GPU is in MIG mode: nothing to advise (gpupool advises layouts for GPUs already in MIG mode)."
        )
    demand = ", ".join(f"{d['ask']} ×{d['count']}" for d in description["demand"]) or "none"
    lines = [
        f"MIG advice for {len(gpus)} GPU(s) in MIG mode, from the demand of {description['source']}",
        f"  demand (MIG slices asked for): {demand}",
    ]
    if description["unservable"]:
        lines.append(f"  {description['unservable']} ask(s) no layout of these GPUs can serve")
    if description.get("kept"):
        lines.append(f"  kept a slice for each profile offered: {', '.join(description['kept'])}")
    if description.get("missing"):
        lines.append(f"  {_missing_text(description['missing'])}")
    for gpu in gpus:
        advised = layout_text_of(gpu["advised"]) if gpu["changed"] else "unchanged"
        lines.append(
            f"  {gpu['node']} GPU {gpu['index']} ({gpu['product']}): {layout_text_of(gpu['current'])} → {advised}"
        )
    lines.append("Replayed on that demand (every ask at once; current → advised):")
    lines += [f"  {what}: {now} → {then}" for what, now, then in figures_rows(description)]
    return "\n".join(lines + _how_to_apply(description))


def _how_to_apply(description: dict[str, Any]) -> list[str]:
    """Nothing to do when no GPU changes; else the steps with the real node names, then the two YAML forms."""
    gpus = description["gpus"]
    nodes = list(dict.fromkeys(g["node"] for g in gpus if g["changed"]))
    if not nodes:
        return [
            f"Nothing to change: the current layouts of the {len(gpus)} MIG GPU(s) serve this demand as well as "
            "any layout the search found."
        ]
    changed = sum(1 for g in gpus if g["changed"])
    return [
        f"{changed} GPU(s) on {len(nodes)} node(s) to change. gpupool never changes a MIG layout: empty each GPU "
        "to change, then, on Kubernetes, put the config.yaml below in the GPU Operator's MIG Manager's "
        "ConfigMap and select it:",
        *(
            f"  kubectl label node {node} nvidia.com/mig.config={config_name(node)} --overwrite"
            for node in nodes
        ),
        "or, on a host of its own (as root, with the GPU Operator's mig-parted tool; then restart gpupool):",
        *(f"  nvidia-mig-parted apply -f config.yaml -c {config_name(node)}  # on {node}" for node in nodes),
        "and, where a pool file describes the pool, update its mig: entries (the fragments below).",
        "",
        "# the MIG Manager's config.yaml (mig-parted's format), for its ConfigMap",
        description["mig_parted"].rstrip(),
        "",
        "# pool-file fragments: each node's mig: entry",
        description["pool_file"].rstrip(),
    ]


def _missing_text(missing: list[str]) -> str:
    return (
        f"no GPU in service has a slice for {', '.join(missing)}, which a profile offers: its starts wait "
        "until a GPU with one is back in service or a layout here includes one (the advice adds one only where "
        "that serves more of the demand seen)"
    )


def layout_text_of(placements: list[str]) -> str:
    return ", ".join(placements) or "none"


def advice_html(description: dict[str, Any]) -> str:
    """The dashboard's short form: the GPUs to change, the figures, and the two YAML forms folded away."""
    e = html.escape
    gpus = description["gpus"]
    if not gpus and description.get("missing"):
        return f"<p>No GPU in MIG mode is in service: {e(_missing_text(description['missing']))}.</p>"
    if not gpus:
        return "<p>No GPU is in MIG mode: nothing to advise.</p>"
    changed = [g for g in gpus if g["changed"]]
    rows = "".join(
        f"<tr><td>{e(g['node'])}</td><td>{g['index']}</td><td>{e(g['product'])}</td>"
        f"<td>{e(layout_text_of(g['current']))}</td><td>{e(layout_text_of(g['advised']))}</td></tr>"
        for g in changed
    )
    table = (
        '<table class="mig-advice"><tr><th>node</th><th>GPU</th><th>product</th><th>now</th><th>advised</th></tr>'
        f"{rows}</table>"
        if changed
        else f"<p>Keep the current layouts of the {len(gpus)} MIG GPUs: the search found none that serves more "
        "of this demand.</p>"
    )
    figures = "".join(
        f"<tr><td>{e(what)}</td><td>{e(now)}</td><td>{e(then)}</td></tr>"
        for what, now, then in figures_rows(description)
    )
    kept = description.get("kept")
    kept_text = f" A slice is kept for each profile offered ({e(', '.join(kept))})." if kept else ""
    if description.get("missing"):
        kept_text += f" <strong>{e(_missing_text(description['missing']))}.</strong>"
    return (
        f"<p>From {e(description['source'])}, replayed with every ask at once.{kept_text} Advice only: gpupool "
        "never changes a MIG layout; apply it with the GPU Operator's MIG Manager, each GPU emptied first.</p>"
        + table
        + f'<table class="mig-figures"><tr><th></th><th>now</th><th>advised</th></tr>{figures}</table>'
        + f"<details><summary>mig-parted config</summary><pre>{e(description['mig_parted'])}</pre></details>"
        + f"<details><summary>pool-file fragments</summary><pre>{e(description['pool_file'])}</pre></details>"
    )


__all__ = [
    "advice_html",
    "config_name",
    "describe_advice",
    "figures_rows",
    "layout_text_of",
    "mig_parted_config",
    "pool_fragment",
    "render_advice",
]
