"""gpupool's hub side under the JupyterHub versions sites run: the oldest it supports (5.3.0) and Zero to
JupyterHub 4.4.0's hub image once gpupool is installed into it (JupyterHub 5.5.0 and KubeSpawner 7.0.0 as
pinned; jupyterhub-idle-culler upgraded from the image's 1.4.0 to 2.x, which gpupool requires), beside the
venv's 6.x that every other test runs on.

Each version set is installed over the venv (:mod:`pinned_packages`) and the KubeGPUSpawner end-to-end module
runs under it in a pytest of its own, with a control plane of its own: the real KubeSpawner code creates pods
the real scheduler binds, for leases from the real gpupool service. Under the hub image's set the culling
module runs too: a real JupyterHub 5.5.0 with the culler and gpupool's arbiter. The image's pins come from
``../shared/data/z2jh-4.4.0``; without that folder the test fails saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pinned_packages import installed_over, pinned

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
    return installed_over(HUB_IMAGE_REQUIREMENTS, HUB_PACKAGES)


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
    modules = ["test_kube_spawner_e2e.py"] + (["test_culling.py"] if which != "oldest" else [])
    pytest_args = ["-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t")]
    pytest_args += [str(ROOT / "tests" / module) for module in modules]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    # pytest's "Failed: <what did not happen> within …" lines first: the tail below is mostly hub log
    why = "\n".join([line for line in run.stdout.splitlines() if "Failed: " in line][:10])
    assert run.returncode == 0, (
        f"under {' '.join(pins)}:\n{why}\n...\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    )
