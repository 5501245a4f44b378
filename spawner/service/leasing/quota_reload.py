"""The quotas file read again when it changes, so an admin tightens or lifts a limit without a restart.

A course's trial edited the quotas file under a running hub: nothing changed and nothing said so. The service
now looks at the file's modification time and size every few seconds, and reads it once they have held
still for one look (an editor that truncates, then writes, is not read half-way). A file that reads well replaces the
quotas in force (leases already held stay: a lower limit refuses only what is asked next); one that does not
leaves them in force, and the error is logged once, naming the field, until the file changes again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from ...files.quotas_file import QuotaFileError, load_quotas
from ...pool.quotas import QuotaPolicy, describe_quota, group_limits_above_user
from .lease_manager import LeaseManager

log = logging.getLogger(__name__)


class QuotaReload:
    """Keeps ``manager.quotas`` as ``path`` says, read again whenever the file changes."""

    def __init__(
        self, manager: LeaseManager, path: str | Path, on_new: Callable[[QuotaPolicy], None] | None = None
    ) -> None:
        self.manager = manager
        self.path = Path(path)
        self.on_new = on_new  # told of each new file that came into force (its group names are checked)
        self._applied = self._stamp()
        self._settling: tuple[int, int] | None = None  # a change seen once, read if it holds still

    def check(self) -> bool:
        """Read the file again if it changed and has held still since the last look; True when new quotas
        came into force."""
        stamp = self._stamp()
        if stamp is None or stamp == self._applied:  # missing: an editor's save-by-rename, a moment long
            self._settling = None
            return False
        if stamp != self._settling:  # changed since the last look: maybe still being written
            self._settling = stamp
            return False
        self._applied, self._settling = stamp, None
        try:
            quotas = load_quotas(self.path)
        except QuotaFileError as error:
            log.error("%s; the quotas read before stay in force until the file reads well", error)
            return False
        self.manager.quotas = quotas
        log.info(
            "quotas read again from %s: per user %s, %d group(s), %d user override(s)",
            self.path,
            describe_quota(quotas.per_user),
            len(quotas.per_group),
            len(quotas.user_overrides),
        )
        for line in group_limits_above_user(quotas):
            log.warning("%s", line)
        if self.on_new is not None:
            try:
                self.on_new(quotas)
            except Exception:  # a check of the new file must never stop the next reads of it
                log.exception("checking the quotas read again from %s", self.path)
        return True

    async def run_forever(self, interval: float = 5.0) -> None:
        while True:
            await asyncio.sleep(interval)
            self.check()

    def _stamp(self) -> tuple[int, int] | None:
        """The file's modification time and size (an edit within one clock tick mostly changes the size);
        None while it is missing."""
        try:
            status = os.stat(self.path)
        except OSError:
            return None
        return status.st_mtime_ns, status.st_size
