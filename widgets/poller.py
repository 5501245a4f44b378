"""Refreshing a widget on the kernel's own event loop, one poller per kind of widget.

ipykernel 7 runs the kernel's asyncio loop in its main thread and delivers widget updates made there; updates
made from other threads lose their parent message and go astray (ipykernel#1450, ipywidgets#4001). So a
widget's calls to the service are tasks on that loop awaiting an asynchronous HTTP client: a slow service
holds up nothing but the widget, and every change of widget state happens where ipykernel expects it. Cells
run on the same loop, so a cell that waits for a widget awaits (``await asyncio.sleep(1)``), never
``time.sleep``.

Running a cell again makes a new widget; the registry, keyed by kind, stops the previous one's poller, so a
kernel never polls twice for the same kind of widget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("gpupool.widgets")
T = TypeVar("T")

_LIVE: dict[str, Poller] = {}  # the running poller of each kind
_ACTIONS: set[asyncio.Task[Any]] = set()  # a loop keeps only weak references to its tasks


def live() -> dict[str, Poller]:
    """The running poller of each kind (``"gpu-monitor"``, ``"job-panel"``)."""
    return dict(_LIVE)


def in_background(action: Coroutine[Any, Any, T]) -> asyncio.Task[T] | T:
    """Run ``action`` as a task on the running loop (a button's work in a kernel) and return the task; with
    no loop running (a plain script), run it to the end and return its result."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(action)
    task = loop.create_task(action)
    _ACTIONS.add(task)
    task.add_done_callback(_ACTIONS.discard)
    return task


class Poller:
    """Awaits ``step`` now and then every ``interval()`` seconds, or at once when :meth:`poke`\\ d.

    ``on_replaced`` is called when a newer poller of the same ``kind`` takes over, so the old widget can say
    that it no longer refreshes.
    """

    def __init__(
        self,
        kind: str,
        step: Callable[[], Awaitable[None]],
        interval: Callable[[], float],
        on_replaced: Callable[[], None] | None = None,
    ) -> None:
        self.kind = kind
        self._step, self._interval, self._on_replaced = step, interval, on_replaced
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> bool:
        """Start on the running loop, replacing the previous poller of this kind; False with no loop running
        (a plain script), where nothing refreshes by itself."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        previous = _LIVE.get(self.kind)
        if previous is not None and previous is not self:
            previous.stop(replaced=True)
        _LIVE[self.kind] = self
        self._task = loop.create_task(self._run(), name=f"gpupool-{self.kind}")
        return True

    def poke(self) -> None:
        """Refresh now rather than at the end of the interval (after a submission, say)."""
        self._wake.set()

    def stop(self, *, replaced: bool = False) -> None:
        if self._task is not None:
            self._task.cancel()
        if _LIVE.get(self.kind) is self:
            del _LIVE[self.kind]
        if replaced and self._on_replaced is not None:
            self._on_replaced()

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except Exception:  # a bug of ours must not end the refreshing; the service's errors are shown
                log.exception("gpupool %s: refresh failed", self.kind)
            with contextlib.suppress(TimeoutError):  # the interval passed without a poke
                await asyncio.wait_for(self._wake.wait(), timeout=self._interval())
            self._wake.clear()
