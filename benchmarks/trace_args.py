"""The arguments every benchmark over the Alibaba trace takes: where the trace is, where results go, which
workload."""

from __future__ import annotations

import argparse
from pathlib import Path


def trace_parser(description: str | None) -> argparse.ArgumentParser:
    """A parser with ``--trace``, ``--out`` and ``--workload``; the script adds its own options."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", required=True, type=Path, help="folder of the Alibaba GPU trace v2023")
    parser.add_argument("--out", default="benchmarks/results", type=Path)
    parser.add_argument("--workload", default="default", help="the pod list, e.g. default or gpushare40")
    return parser
