"""Where to log in, told once the hub answers.

``gpupool up`` prints its other lines before JupyterHub starts; the login line waits for the hub's health page
to answer 200 through the proxy, so a start that fails (a ``-f`` file that raises) invites no one to log in.
"""

from __future__ import annotations

import threading
import time
import urllib.request


def say_when_answering(page: str, line: str, every: float = 0.2) -> threading.Thread:
    """Print ``line`` from a daemon thread once ``page`` answers 200 (it dies with the hub if that never comes)."""
    thread = threading.Thread(target=_wait_then_say, args=(page, line, every), daemon=True)
    thread.start()
    return thread


def _wait_then_say(page: str, line: str, every: float) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1: never through a proxy
    while True:
        try:
            with opener.open(page, timeout=2) as answer:
                if answer.status == 200:
                    print(line, flush=True)
                    return
        except OSError:  # not listening yet, or not answering 200 yet
            pass
        time.sleep(every)
