"""Text from users and their programs, made safe to print: no terminal escape sequences, no control characters.

A job's name and the last line of its log reach an admin's terminal (``gpupool jobs``, ``drain``, ``fault``) and
the pages. A colour code left half-stripped reads ``[31m``, and an escape sequence left whole can retitle or
rewrite an admin's terminal. HTML pages escape on their own; terminals need this.
"""

from __future__ import annotations

import re

# CSI (colours, cursor moves) and OSC (titles, hyperlinks; ended by BEL or ST) sequences, whole
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")


def printable(text: str) -> str:
    """``text`` without escape sequences and with every other non-printable character dropped."""
    return "".join(c for c in _ESCAPES.sub("", text) if c.isprintable())
