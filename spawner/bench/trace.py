"""Reading the Alibaba GPU cluster trace (v2023) into pool nodes and requests.

Node file: ``sn,cpu_milli,memory_mib,gpu,model``. Pod file: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli``
and optionally ``gpu_spec`` (allowed models separated by ``|``; empty allows any) and columns we ignore.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..pool.devices import FULL_MILLI, Gpu, GpuMode, Node
from ..pool.products import canonical_product
from ..pool.requests import GpuShare, InvalidRequest, Request, WholeGpus


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, the row and the column."""


@dataclass(frozen=True)
class TracePod:
    name: str
    request: Request

    @property
    def gpu_milli_total(self) -> int:
        """The pod's whole GPU demand: GPUs times milli per GPU."""
        return self.request.gpu_milli

    @property
    def gpu_milli_per_gpu(self) -> int:
        need = self.request.gpu
        if isinstance(need, GpuShare):
            return need.milli
        return FULL_MILLI if isinstance(need, WholeGpus) else 0


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(
                    f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(required)}"
                )
            return list(reader)
    except OSError as error:
        raise TraceError(f"{path}: cannot read ({error.strerror})") from None


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    try:
        value = int(row[column] or 0)
    except ValueError:
        raise TraceError(f"{path}, line {line}: {column} must be an integer, got {row[column]!r}") from None
    if value < 0:
        raise TraceError(f"{path}, line {line}: {column} must be 0 or more, got {value}")
    return value


def load_nodes(path: str | Path) -> list[Node]:
    """Every row of a node file as a node whose GPUs may be shared or used whole, as in the trace's cluster."""
    path = Path(path)
    nodes = []
    for line, row in enumerate(_rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")), start=2):
        count = _int(path, line, row, "gpu")
        model = canonical_product(row["model"].strip())
        gpus = tuple(
            Gpu(uuid=f"GPU-{row['sn']}-{i}", index=i, product=model, memory_mib=0, mode=GpuMode.SHARED)
            for i in range(count)
        )
        nodes.append(
            Node(row["sn"], _int(path, line, row, "cpu_milli"), _int(path, line, row, "memory_mib"), gpus)
        )
    if not any(node.gpus for node in nodes):
        raise TraceError(f"{path}: no node has a GPU; the placement protocol measures GPU allocation")
    return nodes


def load_pods(path: str | Path) -> list[TracePod]:
    """Every row of a pod file as a request: whole GPUs, a share of one GPU, or CPU only."""
    path = Path(path)
    pods = []
    for line, row in enumerate(
        _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")), start=2
    ):
        count = _int(path, line, row, "num_gpu")
        milli = min(_int(path, line, row, "gpu_milli"), FULL_MILLI)
        products = frozenset(p for p in (row.get("gpu_spec") or "").split("|") if p)
        cpu = _int(path, line, row, "cpu_milli")
        memory = _int(path, line, row, "memory_mib")
        if count > 1 and 0 < milli < FULL_MILLI:
            raise TraceError(
                f"{path}, line {line}: a share of several GPUs ({count} × {milli}) is not supported"
            )
        try:
            if count == 0 or milli == 0:
                request = Request(cpu, memory)
            elif milli == FULL_MILLI:
                request = Request(cpu, memory, WholeGpus(count, products))
            else:
                request = Request(cpu, memory, GpuShare(milli, 0, products))
        except InvalidRequest as error:
            raise TraceError(f"{path}, line {line}: {error}") from None
        pods.append(TracePod(row["name"], request))
    if not pods:
        raise TraceError(f"{path}: no tasks in the file")
    return pods
