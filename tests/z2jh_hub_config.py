"""Run Zero to JupyterHub's own hub configuration and report what JupyterHub would get (a script; run by
``test_z2jh_conformance`` in the hub image's versions).

    python z2jh_hub_config.py CHART_HUB_FILES MOUNTED_FOLDER PROFILES_FILE OUT.json

The chart's ``jupyterhub_config.py`` runs as JupyterHub loads it, beside the chart's ``z2jh.py``, whose one
change is where it reads the mounted files (``MOUNTED_FOLDER`` instead of ``/usr/local/etc/jupyterhub``). The
spawner class it names is then made with that configuration, as the hub makes one per user (its Kubernetes
client from ``KUBECONFIG``), and its spawn form rendered; ``PROFILES_FILE`` stands in for the ConfigMap the
chart mounts at the configured ``profiles_file``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyterhub.objects import Hub, Server
from traitlets.config import PyFileConfigLoader
from traitlets.utils.importstring import import_item

MOUNT = "/usr/local/etc/jupyterhub/"


class _User:
    name, id, url, admin, groups, settings = "ada", 1, "/user/ada/", False, [], {}


def load(chart_hub_files: Path, mounted: Path) -> Any:
    with tempfile.TemporaryDirectory() as scratch:
        shutil.copy(chart_hub_files / "jupyterhub_config.py", scratch)
        z2jh = (chart_hub_files / "z2jh.py").read_text()
        assert z2jh.count(MOUNT) >= 3, (
            "z2jh.py no longer reads the mounted files from /usr/local/etc/jupyterhub"
        )
        Path(scratch, "z2jh.py").write_text(z2jh.replace(MOUNT, f"{mounted}/"))
        return PyFileConfigLoader("jupyterhub_config.py", path=scratch).load_config()


async def report(config: Any, profiles_file: str) -> dict[str, Any]:
    spawner_class = import_item(config.JupyterHub.spawner_class)
    configured_profiles = config[spawner_class.__name__].get("profiles_file")
    config[spawner_class.__name__].profiles_file = profiles_file
    spawner = spawner_class(
        config=config, user=_User(), hub=Hub(ip="127.0.0.1", port=8081, base_url="/hub/"), api_token="t"
    )
    spawner.server = Server(base_url="/user/ada/")
    form = await spawner.get_options_form()
    return {
        "spawner_class": f"{spawner_class.__module__}.{spawner_class.__name__}",
        "profiles_file": configured_profiles,
        "start_timeout": spawner.start_timeout,
        "form": form,
        "custom_scopes": sorted(config.JupyterHub.custom_scopes),
        "services": {s["name"]: s for s in config.JupyterHub.services},
        "roles": {r["name"]: r for r in config.JupyterHub.load_roles},
        "template_paths": list(config.JupyterHub.template_paths),
    }


if __name__ == "__main__":
    chart_files, mounted_folder, profiles, out = sys.argv[1:5]
    loaded = load(Path(chart_files), Path(mounted_folder))
    Path(out).write_text(json.dumps(asyncio.run(report(loaded, profiles)), default=str))
