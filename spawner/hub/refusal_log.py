"""A spawn refused for the user's own mistake is logged as one line, not a traceback.

JupyterHub logs every exception a spawn raises with its traceback ("Failed to spawn single-user server with
form", "Unhandled error starting …"). For a refusal the user reads and can fix (an unknown profile, a wall
time past the profile's lifetime: an HTTP error below 500), the traceback only points at gpupool's own
check and buries the sentence; the admin reading the log wants that sentence. Other errors keep theirs.
"""

from __future__ import annotations

import logging

from tornado import web


class RefusalsInOneLine(logging.Filter):
    """Folds a client error's traceback into the record's message: ``…: 400 … unknown profile 'x'; …``."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, web.HTTPError) and error.status_code < 500:
            record.msg, record.args = f"{record.getMessage()}: {error}", ()
            record.exc_info = record.exc_text = None
        return True


def log_refusals_in_one_line(logger: logging.Logger) -> None:
    """Add :class:`RefusalsInOneLine` to ``logger`` (JupyterHub's), once however many spawners ask."""
    if not any(isinstance(f, RefusalsInOneLine) for f in logger.filters):
        logger.addFilter(RefusalsInOneLine())
