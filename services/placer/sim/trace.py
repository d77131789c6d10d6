"""Reading Alibaba-format traces (``openb_node_list_*.csv``, ``openb_pod_list_*.csv``).

A task's tenant (for ``tessera simulate --tenancy-file``) is its ``tenant`` column when the trace
has one, else its ``qos`` class in lower case (the Alibaba traces: ``ls``, ``be``, ``burstable``,
``guaranteed``), else empty.

A missing file, a missing column or a bad value is a :class:`TraceError` naming the file, the line
and the column; the simulator turns it into a one-line error and exit code 2.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(Exception):
    """A trace file that cannot be used."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TraceTask:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_milli: int
    """Per GPU: 1..1000 for one GPU (a share below 1000), 1000 for whole GPUs, 0 without GPU."""
    models: tuple[str, ...] = ()
    tenant: str = ""

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_count * self.gpu_milli


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise TraceError(
                    f"{path}: missing column(s) {', '.join(missing)} "
                    f"(header: {', '.join(header) or 'empty'})"
                )
            return [(number, row) for number, row in enumerate(reader, start=2)]
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, expected a CSV file") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a UTF-8 text CSV file") from None
    except csv.Error as error:
        raise TraceError(f"{path}: malformed CSV: {error}") from None


def _int(path: Path, line: int, row: dict[str, str], column: str, *, low: int = 0) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(float(raw)) if raw else 0
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column!r}: {raw!r} is not a number") from None
    if value < low:
        raise TraceError(f"{path}:{line}: column {column!r}: {value} is below {low}")
    return value


def load_nodes(path: Path) -> list[TraceNode]:
    """The nodes of a node CSV that have GPUs, sorted by name."""
    nodes = []
    for line, row in _rows(path, NODE_COLUMNS):
        name = (row.get("sn") or "").strip()
        if not name:
            raise TraceError(f"{path}:{line}: empty node name")
        gpus = _int(path, line, row, "gpu")
        if gpus == 0:
            continue
        nodes.append(
            TraceNode(
                name=name,
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpus=gpus,
                model=(row.get("model") or "").strip(),
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no node with GPUs")
    return sorted(nodes, key=lambda n: n.name)


def load_tasks(path: Path) -> list[TraceTask]:
    """Every task of a pod CSV, sorted by name."""
    tasks = []
    for line, row in _rows(path, POD_COLUMNS):
        gpu_count = _int(path, line, row, "num_gpu")
        gpu_milli = _int(path, line, row, "gpu_milli") if gpu_count else 0
        if gpu_count and not 0 < gpu_milli <= 1000:
            raise TraceError(f"{path}:{line}: column 'gpu_milli': {gpu_milli} is not in 1..1000")
        if gpu_count > 1 and gpu_milli != 1000:
            raise TraceError(f"{path}:{line}: a multi-GPU task must ask for whole GPUs (1000)")
        spec = (row.get("gpu_spec") or "").strip()
        tasks.append(
            TraceTask(
                name=(row.get("name") or f"line-{line}").strip(),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpu_count=gpu_count,
                gpu_milli=gpu_milli,
                models=tuple(m for m in spec.split("|") if m) if spec and spec != "nan" else (),
                tenant=(row.get("tenant") or row.get("qos") or "").strip().lower(),
            )
        )
    if not tasks:
        raise TraceError(f"{path}: no tasks")
    return sorted(tasks, key=lambda t: t.name)
