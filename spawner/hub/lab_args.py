"""What both GPU spawners add to JupyterLab's command line: job folders it may open, and terminals that keep the
server's ``PATH``.

A user's job logs and checkpoints live under ``~/.gpupool/jobs/<id>/``, a hidden folder JupyterLab refuses to
list unless told; a Kubernetes trial found the README's "they show in JupyterLab's file browser" true only on one
host. The terminals: see :mod:`.terminal_shell`.
"""

from __future__ import annotations

from traitlets import Bool
from traitlets.config import Configurable

from .terminal_shell import terminal_shell_arg


class LabArgs(Configurable):
    """A mixin before the base spawner: ``class LocalGPUSpawner(GpuLeasing, LabArgs, LocalProcessSpawner)``.

    Not a :class:`~jupyterhub.spawner.Spawner` itself (JupyterHub refuses a Spawner subclass that does not
    start, stop and poll); its traits are configured under the spawner that mixes it in.
    """

    show_job_folders = Bool(
        True,
        config=True,
        help="""Let JupyterLab's file browser open hidden folders (``--ContentsManager.allow_hidden``), so a
        user's job logs and checkpoints under ``~/.gpupool/jobs/<id>/`` show beside their notebooks. Left
        alone when ``args`` already set ``allow_hidden``.""",
    )

    terminals_keep_path = Bool(
        True,
        config=True,
        help="""Start JupyterLab's terminals as a login shell that puts the server's ``PATH`` back in front
        after the profiles ran (Debian's ``/etc/profile`` replaces it, and with it the server's ``python`` and
        the ``gpupool`` command). False: jupyter-server's own login shell. Left alone when ``args`` already set
        ``terminado_settings``; being an argument, it overrides ``c.ServerApp.terminado_settings`` in a
        ``jupyter_server_config.py`` (set this False to keep one).""",
    )

    def get_args(self) -> list[str]:
        """The base spawner's arguments, with the job folders visible (``show_job_folders``) and the terminals'
        shell keeping the server's ``PATH`` (``terminals_keep_path``)."""
        args: list[str] = super().get_args()  # type: ignore[misc]  # the spawner's, after this in the MRO
        if not getattr(
            self, "cmd", None
        ):  # KubeSpawner runs the image's own command then, and drops arguments
            return args
        if self.show_job_folders and not any("allow_hidden" in arg for arg in args):
            args.append("--ContentsManager.allow_hidden=True")
        if self.terminals_keep_path and not any("terminado_settings" in arg for arg in args):
            args.append(terminal_shell_arg())
        return args
