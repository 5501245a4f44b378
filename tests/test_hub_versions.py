"""gpupool's hub side under the JupyterHub versions sites run: the oldest it supports (5.3.0) and Zero to
JupyterHub 4.4.0's hub image pins (JupyterHub 5.5.0, KubeSpawner 7.0.0, jupyterhub-idle-culler 1.4.0), beside
the venv's 6.x that every other test runs on.

Each version set is installed over the venv (:mod:`pinned_packages`) and the KubeGPUSpawner end-to-end module
runs under it in a pytest of its own, with a control plane of its own: the real KubeSpawner code creates pods
the real scheduler binds, for leases from the real gpupool service. The hub image's pins come from
``../shared/data/z2jh-4.4.0``; without that folder the test fails saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pinned_packages import hub_image_pins, pinned

pytestmark = pytest.mark.kube  # a control plane of its own: not beside the other Kubernetes tests' one

ROOT = Path(__file__).resolve().parent.parent
HUB_IMAGE_REQUIREMENTS = (
    ROOT.parent / "shared" / "data" / "z2jh-4.4.0" / "images" / "hub" / "requirements.txt"
)
HUB_PACKAGES = ("jupyterhub", "jupyterhub-kubespawner", "jupyterhub-idle-culler")
VERSIONS = "import jupyterhub, kubespawner; print(jupyterhub.__version__, kubespawner.__version__)"


def _pins(which: str) -> list[str]:
    if which == "oldest":
        return ["jupyterhub==5.3.0"]
    if not HUB_IMAGE_REQUIREMENTS.is_file():
        pytest.fail(
            f"needs Zero to JupyterHub's hub image requirements at {HUB_IMAGE_REQUIREMENTS} (../shared, "
            "which CI has and a clone alone does not)"
        )
    return hub_image_pins(HUB_IMAGE_REQUIREMENTS, HUB_PACKAGES)


@pytest.mark.parametrize("which", ["oldest", "z2jh-4.4.0-hub-image"])
def test_kube_gpu_spawner_spawns_on_the_real_control_plane_under(which: str, tmp_path: Path) -> None:
    pins = _pins(which)
    env = os.environ | {"PYTHONPATH": str(pinned(pins))}
    shown = subprocess.run(
        [sys.executable, "-c", VERSIONS], env=env, capture_output=True, text=True, check=True
    )
    expected = {p.split("==")[0]: p.split("==")[1] for p in pins}
    jupyterhub_version, kubespawner_version = shown.stdout.split()
    assert jupyterhub_version == expected["jupyterhub"]
    assert kubespawner_version == expected.get("jupyterhub-kubespawner", kubespawner_version)
    e2e = ROOT / "tests" / "test_kube_spawner_e2e.py"
    pytest_args = ["-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"), str(e2e)]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, f"under {' '.join(pins)}:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
