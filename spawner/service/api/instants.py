"""Times in query strings: Unix seconds or ISO 8601 dates and times, since an admin asking for last week's
usage or culls writes ``since=2026-12-01``, not ``since=1796083200``."""

from __future__ import annotations

from datetime import UTC, datetime

INSTANT = (
    "Unix seconds (1796083200) or an ISO 8601 date or time (2026-12-01, 2026-12-01T09:30); UTC unless it says"
)


def unix_seconds(moment: datetime) -> float:
    """Unix seconds of ``moment`` (FastAPI parses either form into a datetime); one without a zone is UTC."""
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()
