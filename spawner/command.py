"""The installed ``gpupool`` command's entry point: a Ctrl-C ends any command with one line, never a traceback.

The command's own module imports JupyterHub, so it is imported here, inside the guard: a Ctrl-C in the first
second of ``gpupool up`` (or ``make run``) lands in those imports, later ones in the pool's discovery, the
users' environment being built or JupyterHub's start, before JupyterHub handles SIGINT itself.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # what a shell reports for a command ended by SIGINT (128 + 2)


def main() -> int:
    try:
        from .cli import main as run

        return run()
    except KeyboardInterrupt:
        print("\ngpupool: interrupted (Ctrl-C)", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
