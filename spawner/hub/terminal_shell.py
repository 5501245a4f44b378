"""The shell JupyterLab's terminals start: a login shell that keeps the server's environment first on PATH.

Spawned without a terminal, jupyter-server starts ``$SHELL -l``, so that ``/etc/profile`` and the user's
profile set the session up. On Debian ``/etc/profile`` sets ``PATH`` outright, so the environment gpupool
started the server from (its ``python``, its packages, the ``gpupool`` command) was gone in the terminal: a
researcher's ``gpupool submit`` there was "command not found" while the README said it worked. This login
shell runs the profiles, puts the server's ``PATH`` back in front, then hands over to the user's shell,
interactive. A shell that does not speak sh's syntax (fish, say) gets jupyter-server's plain login shell; a pod
whose image sets no ``SHELL`` gets ``/bin/sh``, as jupyter-server would give it.
"""

from __future__ import annotations

import json

# $0 in the inner command is the server's PATH, passed as its first argument before the profiles run (an empty
# one adds nothing: an empty entry would search the current folder first).
_KEEP_PATH = """SHELL="${SHELL:-/bin/sh}"; export SHELL
case "${SHELL##*/}" in
  bash|sh|dash|zsh|ksh|mksh) exec "$SHELL" -l -c 'PATH="${0:+$0:}$PATH"; export PATH; exec "$SHELL" -i' "$PATH" ;;
esac
exec "$SHELL" -l"""


def terminal_shell_arg() -> str:
    """jupyter-server's option for its terminals' shell command (``terminado_settings``), as an argument."""
    return "--ServerApp.terminado_settings=" + json.dumps({"shell_command": ["/bin/sh", "-c", _KEEP_PATH]})
