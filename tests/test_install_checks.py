"""`gpupool uninstall` refuses while anything runs from the install, and only then.

A fresh-clone run found it refusing because a `gpupool up` demo ran beside it: the demo's environment was
under /opt/gpupool, and the PATH check matched /opt/gpupool-demo as text too. Now the demo's environment is
/opt/gpupool-demo/env, and a folder counts only when it is the prefix or inside it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpupool.spawner.hub.install import _running_from
from gpupool.spawner.hub.user_environment import DEMO_ENV


@contextmanager
def sleeper(path: str) -> Iterator[int]:
    process = subprocess.Popen(["sleep", "30"], env={**os.environ, "PATH": f"{path}:/usr/bin:/bin"})
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def test_a_process_with_the_install_on_its_path_counts_and_one_with_a_sibling_folder_does_not() -> None:
    prefix = Path("/opt/gpupool")
    assert not DEMO_ENV.is_relative_to(prefix)  # the demo's environment is not the install's
    with sleeper("/opt/gpupool/env/bin") as inside, sleeper(f"{DEMO_ENV}/bin") as beside:
        found = {pid for pid, _user in _running_from(prefix)}
        assert inside in found and beside not in found
