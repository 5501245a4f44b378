"""Writing a benchmark's table into the README between its two marker comments, for the scripts here."""

from __future__ import annotations

from pathlib import Path


def write_between(readme: Path, start: str, end: str, table: str) -> None:
    """Replace what lies between the markers ``start`` and ``end`` in ``readme`` with ``table``."""
    before, rest = readme.read_text().split(start, 1)
    after = rest.split(end, 1)[1]
    readme.write_text(f"{before}{start}\n{table}{end}{after}")
    print(f"updated {readme}")
