"""Value types for the commands' arguments: a bad value is argparse's one-line error naming the flag."""

from __future__ import annotations

import argparse


def positive(text: str) -> float:
    """A number above 0, such as an inflation or a load factor."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number such as 1.3, got {text}")
    return value


def whole_number(text: str) -> int:
    """A whole number of at least 1, such as a scale."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1 such as 3, got {text}")
    return int(text)


def seed_list(text: str) -> list[int]:
    """Seeds as ``42``, ``42,43``, ``42-44`` or ``45,50-51``."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            seeds += range(int(first), int(last or first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected e.g. 42, 42,43 or 42-44, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"{text!r} holds no seed; expected e.g. 42-44")
    return seeds
