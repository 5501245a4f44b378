"""JupyterHub finds gpupool's spawners by their short names, as admins write them."""

from __future__ import annotations

import pytest
from jupyterhub.app import JupyterHub

from gpupool.spawner.hub.kube_spawner import KubeGPUSpawner
from gpupool.spawner.hub.spawner import LocalGPUSpawner, SimpleLocalGPUSpawner


@pytest.mark.parametrize(
    ("name", "spawner"),
    [
        ("gpupool", LocalGPUSpawner),
        ("gpupool-simple", SimpleLocalGPUSpawner),
        ("gpupool-kube", KubeGPUSpawner),
    ],
)
def test_spawner_class_accepts_gpupools_short_names(name: str, spawner: type) -> None:
    hub = JupyterHub()
    hub.spawner_class = name
    assert hub.spawner_class is spawner
