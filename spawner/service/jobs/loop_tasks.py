"""Writes the job manager asks for from any thread, run as tasks on one event loop, and cancelled together.

The manager's supervision step is synchronous and may run on a worker thread; the Kubernetes client lives on
the service's event loop. :class:`LoopTasks` hands each write to that loop (at once when already on it) and
keeps the tasks, so a shutdown cancels and awaits every one rather than leaving them to the garbage collector.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class LoopTasks:
    """Tasks on the loop :meth:`bind` names; none run before it or after :meth:`close`."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def spawn(self, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``make()`` as a task on the loop, from that loop or any other thread."""
        loop = self.loop
        if loop is None:
            log.warning("the Kubernetes job runner is not running; a write was dropped")
            return

        def go() -> None:
            task = loop.create_task(make())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            go()
        else:
            loop.call_soon_threadsafe(go)

    async def close(self) -> None:
        """Cancel every task still running and wait for them; nothing runs after."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.loop = None
