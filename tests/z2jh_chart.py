"""Zero to JupyterHub's chart as its hub pod sees it, without Helm: the chart's default values with gpupool's
merged over them the way Helm merges values files, checked against the chart's ``values.schema.yaml``, and the
files the chart mounts into the hub pod (``/usr/local/etc/jupyterhub``: the values, the resource names, the
Secret's keys with the tokens the chart generates) written into a folder.

The chart's files (BSD-3-Clause) come from ``../shared/data/z2jh-4.4.0``; :func:`chart_folder` fails the test
saying so when that folder is missing (a clone alone has no ``../shared``).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SHARED_CHART = ROOT.parent / "shared" / "data" / "z2jh-4.4.0"
# What the chart names its resources when installed without name overrides (its ConfigMap's keys).
RESOURCE_NAMES = (
    "hub",
    "proxy-api",
    "proxy-public",
    "singleuser",
    "image-pull-secret",
    "user-scheduler",
    "priority",
)


def chart_folder() -> Path:
    if not (SHARED_CHART / "jupyterhub" / "values.yaml").is_file():
        pytest.fail(
            f"needs Zero to JupyterHub 4.4.0's chart files at {SHARED_CHART} (../shared, which CI has and a "
            "clone alone does not)"
        )
    return SHARED_CHART


def helm_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base`` as Helm merges values: maps merge key by key, anything else (lists too)
    replaces, and ``null`` removes the key."""
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = helm_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def chart_values(*overlays: Mapping[str, Any]) -> dict[str, Any]:
    """The chart's defaults with ``overlays`` merged in order; ``ValidationError`` if the schema refuses them."""
    chart = chart_folder() / "jupyterhub"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    for overlay in overlays:
        values = helm_merge(values, overlay)
    schema = yaml.safe_load((chart / "values.schema.yaml").read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(values)
    return values


def hub_pod_files(values: Mapping[str, Any], folder: Path) -> dict[str, str]:
    """Write what the chart mounts at ``/usr/local/etc/jupyterhub`` into ``folder``; returns the service tokens
    the chart generated (Secret ``hub``, key ``hub.services.<name>.apiToken``) for services that set none."""
    (folder / "secret").mkdir(parents=True)
    (folder / "config").mkdir()
    (folder / "secret" / "values.yaml").write_text(yaml.safe_dump(dict(values)))
    for name in RESOURCE_NAMES:
        (folder / "config" / name).write_text(name)
    keys = {
        "hub.config.JupyterHub.cookie_secret": secrets.token_hex(32),
        "hub.config.CryptKeeper.keys": secrets.token_hex(32),
    }
    tokens = {}
    for name, service in (values.get("hub", {}).get("services") or {}).items():
        tokens[name] = str((service or {}).get("apiToken") or secrets.token_hex(32))
        keys[f"hub.services.{name}.apiToken"] = tokens[name]
    for key, value in keys.items():
        (folder / "secret" / key).write_text(value)
    return tokens


def hub_pod_environment() -> dict[str, str]:
    """What Kubernetes sets in the hub pod that the chart's configuration reads (Service ports, namespace)."""
    return {"HUB_SERVICE_PORT": "8081", "PROXY_API_SERVICE_PORT": "8001", "POD_NAMESPACE": "jhub"}
