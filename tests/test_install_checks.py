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

from gpupool.spawner.hub.install import _running_from, uninstall
from gpupool.spawner.hub.install_files import Layout
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


def test_uninstall_with_purge_names_the_postgresql_store_it_leaves_behind(tmp_path: Path) -> None:
    """A lab's trial: ``make uninstall PURGE=1`` removed /etc/gpupool/environment, the only record of the
    PostgreSQL store's URL, and said nothing of the database and role it left."""
    layout = Layout(
        prefix=tmp_path / "opt", config=tmp_path / "etc", state=tmp_path / "var", units=tmp_path / "units"
    )
    layout.config.mkdir()
    layout.environment_file.write_text(
        "GPUPOOL_POOL=/opt/gpupool/demo.yaml\nexport GPUPOOL_DB_URL='postgresql+psycopg://gpupool:s3cret@db/gpupool'\n"
    )
    said: list[str] = []
    uninstall(layout, purge=True, say=said.append)
    assert not layout.config.exists()
    assert said[-1] == (
        "The lease store postgresql+psycopg://gpupool:***@db/gpupool is kept, with its role: drop them in "
        "PostgreSQL once no longer wanted."
    )
    assert not any("s3cret" in line for line in said)
    layout.config.mkdir()
    layout.environment_file.write_text("GPUPOOL_DB_URL=sqlite:////var/lib/gpupool/gpupool.sqlite\n")
    said.clear()
    uninstall(layout, purge=True, say=said.append)
    assert not any("lease store" in line for line in said)  # the SQLite file went with the state folder
