"""An offline bound: the most GPU milli any placement of a task list on a cluster can allocate.

The FGD methodology scores a policy by the GPU share it leaves unallocated once the arrived
workload reaches 100 % of capacity. No placement, online or offline, can allocate more than the
best packing of the tasks arrived so far, so that packing's value is a *lower bound* on the
unallocated share, and how far a policy is from it is what placement could still win.

**The exact problem** (what a placement must respect, as the placement core does): each task is
placed on one node or not at all; on a node the placed tasks' CPU and memory fit its capacity,
a task asking ``k >= 1`` whole GPUs takes ``k`` distinct whole GPUs, a GPU share of ``m`` milli
takes ``m`` of one GPU, the shares on a GPU add up to at most 1000 milli and a GPU holding a
whole-GPU task holds nothing else; a task with GPU models runs only on those models. CPU-only
tasks are left out: they allocate no GPU, and leaving a task out is always allowed. The value is
the placed tasks' GPU milli.

**The model** (:func:`max_allocated`): a linear program over *node types* (nodes with equal CPU,
memory, GPU count and model) and *task classes* (tasks with equal CPU, memory, GPU count, milli
and models), so that the 1,213 nodes and ~10,000 tasks of a trace become 15 types and ~130
classes:

- ``x[t, j] >= 0``: tasks of class ``t`` placed on nodes of type ``j`` (only where they fit one
  node of the type and its model is allowed); ``sum_j x[t, j] <= n_t``.
- per type: ``sum_t cpu_t x[t, j] <= N_j cpu_j``, the same for memory, and
  ``z_j + sum_{t whole} k_t x[t, j] <= N_j G_j``, where ``z_j`` GPUs of the type carry shares.
- the shares' GPUs as an *arc flow* (Valerio de Carvalho's bin-packing model): vertices are
  the filled milli of a GPU, 0..1000 in steps of the sizes' common divisor, an arc ``v -> v + s``
  per share size ``s``; ``z_j`` units of flow leave 0, and every other vertex passes on at most
  what enters it (a GPU's filling may stop anywhere). The tasks of size ``s`` on type ``j`` are
  at most the flow on the arcs of size ``s``. An integral flow is exactly a set of GPUs each
  packed with shares adding up to at most 1000 (each unit of flow is one GPU's path).
- maximise ``sum k_t milli_t x[t, j]``.

**Why it is a bound.** Any placement gives a feasible point: ``x`` counts its tasks per class and
type, and the flow is the sum over the type's nodes of each shared GPU's path. So the LP's
optimum is at least what any placement allocates. It relaxes three things: tasks may be split
(fractional ``x``), the CPU, memory and GPUs of a type's nodes are pooled (a task's CPU may sit
on one node and its GPUs on another of the same type: for identical nodes this is the same LP as
one node at a time, scaled), and a multi-GPU task needs its whole GPUs in the type's pool, not on
one node. The GPU-level packing, which is what strands the holes of a trace (a 190-milli hole
beside a 0.81 share takes only the few shares of 190 milli or less), is kept exactly, up to
fractional paths: the arc-flow LP is as strong as Gilmore-Gomory's pattern LP for bin packing.

**The exact solve** (:func:`exact_max_allocated`): the same model per node (every node a type of
its own, ``N = 1``) with integral ``x`` and flows, solved as a MILP. With one node per "type"
nothing is pooled and nothing split, so its optimum is the best placement itself (checked
against brute force in ``tests/placer/test_bound.py``). It is feasible for small samples only;
the gap between the two on a sample shows how much the pooling and splitting give away.

Both are solved by HiGHS through ``scipy.optimize.milp`` (an optional dependency, the ``bound``
extra: imported only when a bound is asked for).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.placer.sim.trace import TraceNode, TraceTask

GPU_MILLI = 1000


class SolverMissingError(RuntimeError):
    """scipy (HiGHS) is not installed."""


@dataclass(frozen=True)
class NodeType:
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    count: int


@dataclass(frozen=True)
class TaskClass:
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_milli: int
    models: tuple[str, ...]
    count: int

    @property
    def share(self) -> bool:
        return self.gpu_count == 1 and self.gpu_milli < GPU_MILLI

    @property
    def value(self) -> int:
        return self.gpu_count * self.gpu_milli

    def fits(self, node: NodeType) -> bool:
        """Fits one node of the type, on an allowed model."""
        return (
            self.cpu_milli <= node.cpu_milli
            and self.memory_mib <= node.memory_mib
            and self.gpu_count <= node.gpus
            and (not self.models or node.model in self.models)
        )


@dataclass(frozen=True)
class Solve:
    """One solve: the most GPU milli a placement can allocate (``allocated``, an upper bound on
    it when ``optimal`` is false: the solver's dual bound), and what the solver saw."""

    allocated: float
    optimal: bool
    found: float
    """The best placement's value the solver found (= ``allocated`` when optimal; an LP's
    optimum is its own primal)."""
    seconds: float
    variables: int
    constraints: int
    node_types: int
    task_classes: int


def node_types(nodes: Sequence[TraceNode]) -> list[NodeType]:
    counts: dict[tuple[int, int, int, str], int] = {}
    for n in nodes:
        key = (n.cpu_milli, n.memory_mib, n.gpus, n.model)
        counts[key] = counts.get(key, 0) + 1
    return [NodeType(c, m, g, model, k) for (c, m, g, model), k in sorted(counts.items())]


def task_classes(tasks: Sequence[TraceTask]) -> list[TaskClass]:
    """The GPU tasks grouped by what they ask (CPU-only tasks allocate no GPU: left out)."""
    counts: dict[tuple[int, int, int, int, tuple[str, ...]], int] = {}
    for t in tasks:
        if t.gpu_count == 0:
            continue
        key = (t.cpu_milli, t.memory_mib, t.gpu_count, t.gpu_milli, tuple(sorted(set(t.models))))
        counts[key] = counts.get(key, 0) + 1
    return [TaskClass(c, m, k, g, models, n) for (c, m, k, g, models), n in sorted(counts.items())]


def max_allocated(
    nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], *, time_limit: float | None = None
) -> Solve:
    """The LP bound (module docstring): at least what any placement of ``tasks`` allocates."""
    return _solve(node_types(nodes), task_classes(tasks), integral=False, time_limit=time_limit)


def exact_max_allocated(
    nodes: Sequence[TraceNode], tasks: Sequence[TraceTask], *, time_limit: float | None = None
) -> Solve:
    """The best placement itself (an integer program per node; small instances only)."""
    each = [NodeType(n.cpu_milli, n.memory_mib, n.gpus, n.model, 1) for n in nodes]
    return _solve(each, task_classes(tasks), integral=True, time_limit=time_limit)


class _Rows:
    """A sparse constraint matrix built row by row: ``low <= A x <= high``."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.low: list[float] = []
        self.high: list[float] = []

    def add(self, terms: Sequence[tuple[int, float]], low: float, high: float) -> None:
        if not terms:
            return
        row = len(self.low)
        for col, val in terms:
            self.rows.append(row)
            self.cols.append(col)
            self.vals.append(val)
        self.low.append(low)
        self.high.append(high)


def _solve(
    types: Sequence[NodeType],
    classes: Sequence[TaskClass],
    *,
    integral: bool,
    time_limit: float | None,
) -> Solve:
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_array
    except ImportError as error:  # pragma: no cover - the dev environment has scipy
        raise SolverMissingError(
            "the placement bound needs scipy (HiGHS): pip install 'tessera[bound]'"
        ) from error
    started = time.perf_counter()
    unit = math.gcd(GPU_MILLI, *(c.gpu_milli for c in classes if c.share))
    top = GPU_MILLI // unit
    objective: list[float] = []
    rows = _Rows()
    by_class: dict[int, list[tuple[int, float]]] = {i: [] for i in range(len(classes))}

    def column(value: float) -> int:
        objective.append(-value)
        return len(objective) - 1

    for node in types:
        cpu: list[tuple[int, float]] = []
        memory: list[tuple[int, float]] = []
        gpus: list[tuple[int, float]] = []
        by_size: dict[int, list[tuple[int, float]]] = {}
        for i, task in enumerate(classes):
            if not task.fits(node):
                continue
            col = column(task.value)
            by_class[i].append((col, 1.0))
            cpu.append((col, task.cpu_milli))
            memory.append((col, task.memory_mib))
            if task.share:
                by_size.setdefault(task.gpu_milli // unit, []).append((col, 1.0))
            else:
                gpus.append((col, task.gpu_count))
        # The shares' arc flow: arcs v -> v + s for the sizes that fit this type.
        out_of: dict[int, list[tuple[int, float]]] = {}
        into: dict[int, list[tuple[int, float]]] = {}
        for size, takers in sorted(by_size.items()):
            arcs = []
            for v in range(top - size + 1):
                col = column(0.0)
                arcs.append((col, -1.0))
                out_of.setdefault(v, []).append((col, 1.0))
                into.setdefault(v + size, []).append((col, 1.0))
            # tasks of this size on the type <= flow on this size's arcs
            rows.add([*takers, *arcs], -math.inf, 0.0)
        for v in range(1, top):
            passed = out_of.get(v, []) + [(c, -a) for c, a in into.get(v, [])]
            rows.add(passed, -math.inf, 0.0)
        rows.add([*gpus, *out_of.get(0, [])], -math.inf, node.count * node.gpus)
        rows.add(cpu, -math.inf, node.count * node.cpu_milli)
        rows.add(memory, -math.inf, node.count * node.memory_mib)
    for i, task in enumerate(classes):
        rows.add(by_class[i], -math.inf, task.count)
    variables = len(objective)
    if variables == 0:
        return Solve(0.0, True, 0.0, time.perf_counter() - started, 0, 0, len(types), len(classes))
    matrix = coo_array(
        (rows.vals, (rows.rows, rows.cols)), shape=(len(rows.low), variables)
    ).tocsr()
    options: dict[str, Any] = {"disp": False}
    if time_limit is not None:
        options["time_limit"] = time_limit
    result = milp(
        np.array(objective),
        constraints=LinearConstraint(matrix, np.array(rows.low), np.array(rows.high)),
        bounds=Bounds(0, np.inf),
        integrality=np.full(variables, 1 if integral else 0),
        options=options,
    )
    seconds = time.perf_counter() - started
    if result.x is None and not integral:
        raise RuntimeError(f"the LP bound did not solve: {result.message}")
    found = -float(result.fun) if result.x is not None else 0.0
    optimal = result.status == 0
    if optimal:
        allocated = found
    else:
        dual = getattr(result, "mip_dual_bound", None)
        allocated = -float(dual) if dual is not None and math.isfinite(dual) else math.inf
    return Solve(
        allocated=allocated,
        optimal=optimal,
        found=found,
        seconds=seconds,
        variables=variables,
        constraints=len(rows.low),
        node_types=len(types),
        task_classes=len(classes),
    )


@dataclass(frozen=True)
class BucketBound:
    """A lower bound on a replay's unallocated GPU % at one arrived-workload bucket."""

    unallocated_pct: float
    """Bound on the bucket's value: the mean over its events, as ``report`` takes it."""
    events: int
    solves: tuple[Solve, ...]
    """One per checkpoint (the last is the bucket's last event)."""

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.solves)


def unallocated_bound(
    nodes: Sequence[TraceNode],
    tasks: Sequence[TraceTask],
    *,
    bucket: int = 100,
    checkpoints: int = 8,
    burst: int = 1,
) -> BucketBound | None:
    """A lower bound on the unallocated GPU % a replay of ``tasks`` on ``nodes`` reports at
    ``bucket`` % arrived (``replay.py``: one event per task, binned by the arrived GPU milli
    after it; with ``burst`` tasks arriving at once, all of the burst has arrived at each of its
    events). None when no event falls in or beside the bucket.

    At an event, at most the tasks arrived so far are placed, so the allocation is at most
    :func:`max_allocated` of that prefix, which only grows with the prefix. The LP is solved at
    ``checkpoints`` events spread over the bucket (the last always among them), and each event
    is bounded by the next checkpoint's value: a bound on every event, hence on their mean."""
    capacity = GPU_MILLI * sum(n.gpus for n in nodes)
    arrived_after: list[int] = []
    total = 0
    for task in tasks:
        total += task.total_gpu_milli
        arrived_after.append(total)
    ends = [min(len(tasks), (i // burst + 1) * burst) for i in range(len(tasks))]
    buckets = [round(100 * arrived_after[end - 1] / capacity) for end in ends]
    events = [i for i, b in enumerate(buckets) if b == bucket]
    if not events:
        events = [i for i, b in enumerate(buckets) if abs(b - bucket) <= 1]
    if not events:
        return None
    count = max(1, min(checkpoints, len(events)))
    marks = sorted({events[(len(events) * (k + 1)) // count - 1] for k in range(count)})
    solved = {mark: max_allocated(nodes, tasks[: ends[mark]]) for mark in marks}
    allocated = 0.0
    for event in events:
        mark = next(m for m in marks if m >= event)
        allocated += min(solved[mark].allocated, arrived_after[ends[event] - 1])
    mean_allocated = allocated / len(events)
    return BucketBound(
        unallocated_pct=100 - 100 * mean_allocated / capacity,
        events=len(events),
        solves=tuple(solved[m] for m in marks),
    )
