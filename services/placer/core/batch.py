"""Many node shapes judged at once, with numpy, for the requests most pods make (issue 23).

:meth:`~.framework.Profile.judge` takes one shape at a time: for a GPU share under Tessera's own
profile it is the fit filter's pass over the GPUs, then the fed fragmentation (``fed_fgd.py``) of
the node before and after the share on each GPU it fits. A request seen for the first time is
judged on every shape of the cluster, and at 1,000 nodes of their own shape that took 25-60 ms:
the scheduler extender's first-time answers and a placer's first decision of a new request.
Here the same judgements are made for every shape still to be judged in one pass of array
operations, per number of GPUs on the node.

**Exact, not approximate.** Every judgement equals what the scalar plugins give, bit for bit
(``tests/placer/test_batch.py`` checks it on random shapes, pods, typical mixes and groups):

- the integer parts (free milli, fits, which GPU a whole GPU goes on, prefix sums) are integers
  here too, and the floating-point parts are the same IEEE operations in the same order (each
  typical task's term added to the total in the mix's order);
- the one function computed differently is the score's sigmoid (numpy's ``exp``, not ``math``'s):
  its value is only truncated to an integer point, and a value that comes within 1e-9 of an
  integer (where an ulp could decide) is taken from the scalar score instead;
- the fit filter's reasons are its checks in its order; a share that is not the paper's
  GPU-sharing task, and whole GPUs, are scored on the GPUs the GPU search would take (the
  candidates with the least free memory, then cores, first);
- what has no array form is left to the scalar code: the profile's other filters (run on each
  shape the fit filter passes, in order), pods whose GPUs more than one container asks for, and
  pods asking amounts beyond :data:`AMOUNT_LIMIT` (:meth:`FgdBatch.judge` says None and the
  profile judges one shape at a time).

Which plugins a profile runs is checked once (:func:`batch_judge`): the fit filter first, FGD over
fed fragmentation as the only score, and GPU filters that read only a GPU's model and groups (the
model and group filters), which lets a GPU's admission be asked once per (model, groups).

The shapes' numbers are copied into arrays once per shape id (:class:`ShapeRows`, kept on the
index and dropped with its ids when it compacts), so a request pays only for the arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from services.placer.core.facts import PodFacts
from services.placer.core.fragmentation import FILL_TIE
from services.placer.core.framework import (
    Filter,
    GpuFilter,
    Judgement,
    Profile,
    gpu_admitted,
)
from services.placer.core.index import ClusterIndex
from services.placer.core.model import GPU_MILLI
from services.placer.core.plugins.fed_fgd import FedFragmentation
from services.placer.core.plugins.fgd import FgdScore
from services.placer.core.plugins.fit import (
    INSUFFICIENT_CPU,
    INSUFFICIENT_MEMORY,
    NO_GPU_ROOM,
    NO_GPUS,
    NO_IDLE_GPUS,
    NODE_UNSCHEDULABLE,
    TOO_FEW_ALLOWED,
    UNHEALTHY_GPU,
    NodeFit,
    by_kind,
)
from services.placer.core.shape import GpuShape, NodeShape

Ints = npt.NDArray[np.int64]
Small = npt.NDArray[np.int32]
"""Amounts bounded by a GPU's 1000 milli times its node's GPUs."""
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

ROWS_KEY: Final = "batch.rows"
"""Where an index keeps its :class:`ShapeRows` (``ClusterIndex.derived``)."""
CHUNK_SHAPES: Final = 2048
"""Shapes judged in one pass: the arrays of a pass are a few MiB (a share's state after each of
a node's GPUs is a row), where 10,000 shapes at once took tens of MiB of a placer's peak RSS."""
AMOUNT_LIMIT: Final = 2**40
"""Pods asking more than this (MiB, milli, percent) are left to the scalar code: nothing that
large fits anywhere, and in 64-bit arrays times 1,000 it could overflow (Python's ints do not)."""
NEAR_INTEGER: Final = 1e-9
"""A score this close to an integer point is taken from the scalar code (see the docstring)."""


class _Rows:
    """The shapes with one number of GPUs: a row each, arrays grown by doubling."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.count = 0
        # Kept in 32 bits (a placer keeps a row per shape it judged: tens of thousands at
        # 10,000 nodes), read in 64: MiB and CPU milli of one node are far below 2**31.
        self.node = np.zeros((0, 4), dtype=np.int32)
        """cpu free, memory free, schedulable, code of the node's set of GPU models."""
        self.gpu = np.zeros((0, 9, gpus), dtype=np.int32)
        """Per GPU (ascending free milli, the shape's order): free milli, memory total, memory
        free, cores free, slots free, healthy, exclusive, idle, code of (model, groups)."""
        self._fragmentation: tuple[object, Floats] = (None, np.zeros(0))
        """The fed fragmentation of each row's node as it is (NaN: not known yet), for the
        typical mix it was computed with: a shape's never changes, whatever the request."""

    def fragmentation(self, mix: object) -> Floats:
        """Each row's fragmentation under ``mix`` as far as known (NaN where not); write what is
        computed into it. Only the latest mix's values are kept."""
        known, values = self._fragmentation
        if known is not mix or len(values) < len(self.node):
            grown = np.full(len(self.node), np.nan)
            if known is mix:
                grown[: len(values)] = values
            self._fragmentation = (mix, grown)
            values = grown
        return values

    def extend(self, nodes: list[tuple[int, ...]], gpus: list[list[tuple[int, ...]]]) -> Ints:
        """Add a row per shape (its node's numbers, and each GPU's in the order of
        :attr:`gpu`'s fields); the rows they took."""
        start, added = self.count, len(nodes)
        if start + added > len(self.node):
            size = max(16, 2 * (start + added))
            self.node = np.resize(self.node, (size, 4))
            self.gpu = np.resize(self.gpu, (size, 9, self.gpus))
        self.node[start : start + added] = np.array(nodes, dtype=np.int32).reshape(added, 4)
        per_gpu = np.array(gpus, dtype=np.int32).reshape(added, self.gpus, 9)
        self.gpu[start : start + added] = per_gpu.transpose(0, 2, 1)
        self.count += added
        return np.arange(start, start + added, dtype=np.int64)


class ShapeRows:
    """An index's interned shapes as array rows, by shape id, filled as shapes are judged."""

    def __init__(self) -> None:
        self._rows: dict[int, _Rows] = {}
        self._gpus_of = np.full(0, -1, dtype=np.int64)
        """Shape id -> its number of GPUs (-1: no row yet)."""
        self._row_of = np.zeros(0, dtype=np.int64)
        """Shape id -> its row among the shapes with as many GPUs."""
        self._kinds: dict[tuple[str, tuple[str, ...]], int] = {}
        self.kind_shapes: list[GpuShape] = []
        """One GPU of each (model, groups) code: what GPU admission is asked of."""
        self._models: dict[frozenset[str], int] = {}
        self.model_sets: list[frozenset[str]] = []
        """Each code's set of GPU models on a node."""

    def _kind(self, gpu: GpuShape) -> int:
        key = (gpu.model, gpu.groups)
        code = self._kinds.get(key)
        if code is None:
            code = self._kinds[key] = len(self.kind_shapes)
            self.kind_shapes.append(gpu)
        return code

    def _model_set(self, models: frozenset[str]) -> int:
        code = self._models.get(models)
        if code is None:
            code = self._models[models] = len(self.model_sets)
            self.model_sets.append(models)
        return code

    def _add(self, sids: list[int], shapes: Sequence[NodeShape]) -> None:
        """Copy the numbers of shapes ``sids`` into rows, by their number of GPUs."""
        new: dict[int, tuple[list[int], list[tuple[int, ...]], list[list[tuple[int, ...]]]]] = {}
        kind, model_set = self._kind, self._model_set
        for sid in sids:
            shape = shapes[sid]
            ids, nodes, gpus = new.setdefault(len(shape.gpus), ([], [], []))
            ids.append(sid)
            nodes.append(
                (
                    shape.cpu_milli_free,
                    shape.memory_mib_free,
                    int(shape.schedulable),
                    model_set(shape.models),
                )
            )
            gpus.append(
                [
                    (
                        g.free_milli,
                        g.memory_total_mib,
                        g.memory_free_mib,
                        g.core_milli_free,
                        g.slots_free,
                        g.healthy,
                        g.exclusive,
                        g.idle,
                        kind(g),
                    )
                    for g in shape.gpus
                ]
            )
        for count, (ids, nodes, gpus) in new.items():
            rows = self._rows.get(count)
            if rows is None:
                rows = self._rows[count] = _Rows(count)
            self._row_of[ids] = rows.extend(nodes, gpus)
            self._gpus_of[ids] = count

    def holds(self, sid: int) -> bool:
        """Whether shape ``sid`` has its row."""
        return sid < len(self._gpus_of) and bool(self._gpus_of[sid] >= 0)

    def by_gpu_count(
        self, shapes: Sequence[NodeShape], sids: Sequence[int]
    ) -> list[tuple[_Rows, Ints, Ints]]:
        """``sids`` grouped by their number of GPUs: (rows, positions in ``sids``, their rows).
        Positions, not ids: a memo keyed by the caller's own ints holds no second copy of each
        (tens of thousands of memo entries at 10,000 nodes)."""
        if len(shapes) > len(self._gpus_of):  # room for every id the index has interned
            grown = max(len(shapes), 2 * len(self._gpus_of))
            self._gpus_of = np.concatenate(
                (self._gpus_of, np.full(grown - len(self._gpus_of), -1, dtype=np.int64))
            )
            self._row_of = np.resize(self._row_of, grown)
        ids = np.array(sids, dtype=np.int64)
        counts = self._gpus_of[ids]
        if (counts < 0).any():
            self._add(ids[counts < 0].tolist(), shapes)
            counts = self._gpus_of[ids]
        groups = []
        for gpus in np.unique(counts).tolist():
            positions = np.flatnonzero(counts == gpus)
            groups.append((self._rows[gpus], positions, self._row_of[ids[positions]]))
        return groups


def shape_rows(cluster: ClusterIndex) -> ShapeRows:
    rows = cluster.derived.get(ROWS_KEY)
    if not isinstance(rows, ShapeRows):
        rows = cluster.derived[ROWS_KEY] = ShapeRows()
    return rows


class TaskArrays:
    """A fed fragmentation's typical tasks as arrays, one entry per task in the mix's order."""

    def __init__(self, model: FedFragmentation) -> None:
        tasks = model.weighted_tasks
        self.unfed_weight = model.unfed_weight
        self.gpu_milli = np.array([min(t.gpu_milli, GPU_MILLI + 1) for t in tasks], dtype=np.int32)[
            :, None, None
        ]
        """Capped above any GPU's free milli, to compare in 32 bits with what fits alike."""
        self.gpu_count = np.array([t.gpu_count for t in tasks], dtype=np.int64)[:, None]
        self.cpu_milli = np.array([t.cpu_milli for t in tasks], dtype=np.int64)[:, None]
        self.memory = np.array(model.memory, dtype=np.int64)[:, None]
        self.first_memory = np.array(model.first_memory, dtype=np.int64)[:, None]
        self.weight = np.array([t.weight for t in tasks], dtype=np.float64)[:, None]
        self.models = tuple(t.models for t in tasks)

    def unmatched(self, model_sets: Sequence[frozenset[str]], codes: Ints) -> Bools:
        """[task, row]: whether the row's node has none of the GPU models the task may run on."""
        by_code = np.array(
            [
                [allowed is not None and not (models & allowed) for models in model_sets]
                for allowed in self.models
            ],
            dtype=np.bool_,
        ).reshape(len(self.models), len(model_sets))
        return by_code[:, codes]


def fed_values(
    tasks: TaskArrays,
    descending: Small,
    cpu_free: Ints,
    memory_free: Ints,
    unmatched: Bools,
    *,
    each: int = 1,
) -> Floats:
    """:meth:`FedFragmentation.node` of each row: ``descending`` holds a node's per-GPU free
    milli, most free first; ``cpu_free``, ``memory_free`` and ``unmatched``
    (:meth:`TaskArrays.unmatched`) are per node, for ``each`` rows in a row (the states a share
    leaves on each of a node's GPUs share the node's free CPU and memory).

    Every task's term is ``FedFragmentation._fed_value``'s, from the same integers by the same
    floating-point operations, and the terms are added up in the mix's order (an accumulation,
    not a pairwise sum), so each value is the scalar one to the last bit."""
    rows, gpus = descending.shape
    # Free milli is 0..1000 a GPU, so the per-row arrays (the large ones) are 32-bit: half the
    # memory traffic. The per-node amounts stay 64-bit until bounded by ``gpus``.
    prefix = np.zeros((rows, gpus + 1), dtype=np.int32)
    for k in range(gpus):  # column by column: a node has few GPUs and many rows
        np.add(prefix[:, k], descending[:, k], out=prefix[:, k + 1])
    idle = prefix[:, gpus]
    # Per node: whether its free CPU or memory or its GPU models rule the task out, and how
    # many GPUs the copies its free CPU and memory allow would take.
    blocked = (
        (tasks.gpu_count == 0)
        | (cpu_free < tasks.cpu_milli)
        | (memory_free < tasks.first_memory)
        | unmatched
    )
    copies = np.maximum(  # one copy wherever one fits (``fed_fgd._copies``)
        np.minimum(
            np.where(tasks.cpu_milli > 0, cpu_free // np.maximum(tasks.cpu_milli, 1), gpus),
            np.where(tasks.memory > 0, memory_free // np.maximum(tasks.memory, 1), gpus),
        ),
        1,
    )
    wanted = (np.minimum(np.maximum(copies, 0), gpus) * tasks.gpu_count).astype(np.int32)
    if each > 1:
        blocked = np.repeat(blocked, each, axis=1)
        wanted = np.repeat(wanted, each, axis=1)
    # A task no row can run (no GPUs asked, none with the CPU for it, too few GPUs free enough
    # anywhere: whole-GPU tasks on a busy cluster) adds ``weight x idle`` to every row; only
    # the others need their sums.
    terms = tasks.weight * idle  # [task, row]: each task's term, by default the idle one
    # The k-th most free GPU of any row: a task asking k GPUs of more than that fits nowhere.
    most = np.append(descending.max(axis=0) if rows else np.zeros(gpus, np.int32), -1)
    kth = most[np.minimum(tasks.gpu_count[:, 0], gpus + 1) - 1]
    fits_somewhere = (tasks.gpu_count[:, 0] > 0) & (kth >= tasks.gpu_milli[:, 0, 0])
    open_tasks = np.flatnonzero(fits_somewhere & ~blocked.all(axis=1))
    if len(open_tasks):
        fitting = _at_least(descending, tasks.gpu_milli[open_tasks])
        idle_only = blocked[open_tasks] | (fitting < tasks.gpu_count[open_tasks])
        fed = np.minimum(wanted[open_tasks], fitting)
        starts = np.arange(rows) * (gpus + 1)
        flat = prefix.reshape(-1)
        at_fitting = np.take(flat, fitting + starts)
        at_fed = np.take(flat, fed + starts)
        fragment = (idle - at_fitting) + tasks.unfed_weight * (at_fitting - at_fed)
        terms[open_tasks] = tasks.weight[open_tasks] * np.where(idle_only, idle, fragment)
    total = np.zeros(rows)
    for term in terms:  # one task after the other, as the scalar loop adds them
        total += term
    return np.where(idle == 0, 0.0, total)


def _at_least(values: Small, needs: Small) -> Small:
    """[need, row]: how many of the row's ``values`` are at least each of ``needs`` (shaped
    ``[need, 1, 1]``). The comparisons are bytes: eight at a time, a row's are counted as the
    set bits of 64-bit words (padding compares false: every need is at least 0)."""
    rows, gpus = values.shape
    width = max(8, -(-gpus // 8) * 8)
    if gpus != width:
        padded = np.full((rows, width), -1, dtype=values.dtype)
        padded[:, :gpus] = values
        values = padded
    words = np.ascontiguousarray(values[None, :, :] >= needs).view(np.uint64)
    counts: Small = np.bitwise_count(words).sum(axis=2, dtype=np.int32)
    return counts


FIT_REASONS: Final = (
    "",
    NODE_UNSCHEDULABLE,
    INSUFFICIENT_CPU,
    INSUFFICIENT_MEMORY,
    NO_GPUS,
    TOO_FEW_ALLOWED,
    UNHEALTHY_GPU,
    NO_IDLE_GPUS,
    NO_GPU_ROOM,
)
"""The fit filter's answers for one container's ask, by code (0: it fits), in the order
``NodeFit.filter`` checks them."""


class FgdBatch:
    """Batch judgements for a profile of the fit filter and FGD over fed fragmentation."""

    def __init__(
        self,
        *,
        fit: NodeFit,
        score: FgdScore,
        model: FedFragmentation,
        weight: float,
        other_filters: tuple[Filter, ...],
    ) -> None:
        self.fit = fit
        self.score = score
        self.weight = weight
        self.other_filters = other_filters
        self._tasks = TaskArrays(model)
        self._waste = (
            np.array(score.fill_waste, dtype=np.int64) if score.fill_waste is not None else None
        )

    def judge(
        self, pod: PodFacts, cluster: ClusterIndex, sids: Sequence[int]
    ) -> dict[int, Judgement] | None:
        """The judgement of each of ``sids`` for ``pod``; None for a request this does not
        judge (see the module docstring)."""
        if len(pod.asks) != 1:
            return None
        ask = pod.asks[0]
        amounts = (pod.cpu_milli, pod.memory_mib, ask.memory_mib or 0, ask.memory_pct or 0)
        if max(*amounts, ask.core_milli, ask.shares) > AMOUNT_LIMIT:
            return None
        table = shape_rows(cluster)
        shapes = cluster.shapes
        judged: dict[int, Judgement] = {}
        weight = self.weight
        for rows, group_positions, group_at in table.by_gpu_count(shapes, sids):
            for start in range(0, len(group_positions), CHUNK_SHAPES):
                positions = group_positions[start : start + CHUNK_SHAPES]
                codes, scores = self._group(
                    pod, table, rows, group_at[start : start + CHUNK_SHAPES]
                )
                # A profile's total is 0.0 plus each plugin's weighted score (Profile.judge).
                judged.update(
                    zip(
                        [sids[p] for p in positions.tolist()],
                        [
                            FIT_REASONS[code] if code else 0.0 + weight * score
                            for code, score in zip(codes.tolist(), scores.tolist(), strict=True)
                        ],
                        strict=True,
                    )
                )
        for sid, judgement in judged.items():
            if isinstance(judgement, str):
                continue
            for extra in self.other_filters:  # after the fit filter, as the profile runs them
                reason = extra.filter(pod, shapes[sid])
                if reason is not None:
                    judged[sid] = reason
                    break
        return judged

    def _admitted(self, pod: PodFacts, table: ShapeRows, filters: tuple[GpuFilter, ...]) -> Bools:
        """Whether each (model, groups) code is admitted (one more entry for an empty table)."""
        return np.array(
            [gpu_admitted(pod, gpu, filters) for gpu in table.kind_shapes] + [False],
            dtype=np.bool_,
        )

    def _group(self, pod: PodFacts, table: ShapeRows, rows: _Rows, at: Ints) -> tuple[Ints, Floats]:
        """Per row: the fit filter's answer (a :data:`FIT_REASONS` code) and, where it fits,
        the score."""
        ask = pod.asks[0]
        shares = ask.shares
        node: Ints = rows.node[at].astype(np.int64)
        gpu: Ints = rows.gpu[at].astype(np.int64)
        free, total_mib, memory_free, cores_free = gpu[:, 0], gpu[:, 1], gpu[:, 2], gpu[:, 3]
        healthy = gpu[:, 5] == 1
        usable = healthy & (gpu[:, 6] == 0) & (cores_free >= ask.core_milli) & (gpu[:, 4] != 0)
        if ask.whole:
            usable &= gpu[:, 7] == 1  # idle; it takes all the memory free, which always fits
            asked = memory_free
        else:
            asked = _memory_on(ask.memory_mib, ask.memory_pct, total_mib)
            usable &= asked <= memory_free
        kinds = gpu[:, 8]
        admitted = self._admitted(pod, table, self.fit.gpu_filters)[kinds]
        fitting = np.count_nonzero(usable & admitted, axis=1)
        codes = np.select(
            [
                node[:, 2] == 0,
                node[:, 0] < pod.cpu_milli,
                node[:, 1] < pod.memory_mib,
                fitting >= shares,
                np.count_nonzero(admitted, axis=1) < shares,
                np.count_nonzero(admitted & healthy, axis=1) < shares,
            ],
            [1, 2, 3, 0, 5 if rows.gpus else 4, 6],
            default=7 if ask.whole else 8,
        )
        scores = np.zeros(len(at), dtype=np.float64)
        keep = np.flatnonzero(codes == 0)
        if not len(keep):
            return codes, scores
        kept: Small = free[keep].astype(np.int32)  # 0..1000 a GPU: see fed_values
        node = node[keep]
        score_admitted = self._admitted(pod, table, self.score.gpu_filters)[kinds[keep]]
        candidates = usable[keep] & score_admitted
        unmatched = self._tasks.unmatched(table.model_sets, node[:, 3])
        known = rows.fragmentation(self._tasks)
        before = known[at[keep]]
        unknown = np.isnan(before)
        if unknown.any():
            before[unknown] = known[at[keep][unknown]] = fed_values(
                self._tasks,
                kept[unknown][:, ::-1],
                node[unknown, 0],
                node[unknown, 1],
                unmatched[:, unknown],
            )
        cpu_after = node[:, 0] - pod.cpu_milli
        memory_after = node[:, 1] - pod.memory_mib
        milli = (
            np.full(kept.shape, GPU_MILLI, dtype=np.int64)
            if ask.whole
            else _milli_on(ask.core_milli, asked[keep], total_mib[keep])
        )
        left: Small = np.maximum(0, kept - milli).astype(np.int32)
        if not pod.fractional:  # on the GPUs the search takes, and no tie-break
            taken = self._taken(kept, left, memory_free[keep], cores_free[keep], candidates, shares)
            after = fed_values(
                self._tasks, -np.sort(-taken, axis=1), cpu_after, memory_after, unmatched
            )
            scores[keep] = self._values(before - after)
            return codes, scores
        gpus = rows.gpus
        each = np.repeat(kept[:, None, :], gpus, axis=1)  # [row, the GPU taking it, GPU]
        each[:, np.arange(gpus), np.arange(gpus)] = left
        descending = -np.sort(-each.reshape(-1, gpus), axis=1)
        on_each = fed_values(
            self._tasks, descending, cpu_after, memory_after, unmatched, each=gpus
        ).reshape(-1, gpus)
        values = self._values(before[:, None] - on_each)
        if self._waste is not None:
            values = values + FILL_TIE * (self._waste[kept] - self._waste[left])
        scores[keep] = np.where(candidates, values, -np.inf).max(axis=1)
        return codes, scores

    @staticmethod
    def _taken(
        free: Small,
        left: Small,
        memory_free: Ints,
        cores_free: Ints,
        candidates: Bools,
        shares: int,
    ) -> Small:
        """The free milli once the pod's ``shares`` shares are where the GPU search puts them
        (``search.assign``): the candidates with the least free memory, then cores, first
        (``search.smallest_first``, a stable sort: position breaks ties), each left with
        ``left``."""
        positions = np.broadcast_to(np.arange(free.shape[1]), free.shape)
        order = np.lexsort((positions, cores_free, memory_free, ~candidates), axis=1)
        taken = order[:, :shares]
        lines = np.arange(len(free))[:, None]
        after = free.copy()
        after[lines, taken] = left[lines, taken]
        return after

    def _values(self, delta: Floats) -> Floats:
        """``FgdScore._value`` of each delta: the point ``int(100 * sigmoid(delta / 1000))``
        (by the score's step); a value within :data:`NEAR_INTEGER` of a point is the scalar's."""
        x = delta / 1000.0
        positive = x >= 0
        e = np.exp(np.where(positive, -x, x))
        value = 100.0 * np.where(positive, 1.0 / (1.0 + e), e / (1.0 + e))
        step = self.score.step
        points = (np.floor(value).astype(np.int64) // step * step).astype(np.float64)
        # At 0 both exps are exactly 1; elsewhere an ulp could cross a point near one.
        near = (np.abs(value - np.rint(value)) < NEAR_INTEGER) & (x != 0)
        if near.any():
            flat = points.reshape(-1)
            for i in np.flatnonzero(near.reshape(-1)):
                flat[i] = self.score._value(float(delta.reshape(-1)[i]))
        return points


def _memory_on(memory_mib: int | None, memory_pct: int | None, total_mib: Ints) -> Ints:
    """``ShareAsk.memory_on`` of each GPU."""
    if memory_mib is not None:
        return np.full(total_mib.shape, memory_mib, dtype=np.int64)
    if memory_pct is not None:
        return total_mib * memory_pct // 100
    return np.zeros(total_mib.shape, dtype=np.int64)


def _milli_on(core_milli: int, memory: Ints, total_mib: Ints) -> Ints:
    """``ShareAsk.milli_on`` of each GPU (a share, not a whole GPU)."""
    sized = np.where(total_mib > 0, total_mib, 1)
    memory_milli = np.where(total_mib > 0, -((-memory * GPU_MILLI) // sized), 0)
    return np.maximum(core_milli, memory_milli)


def batch_judge(profile: Profile) -> FgdBatch | None:
    """The batch judge of ``profile``, or None when it runs a plugin this cannot judge."""
    if profile.normalizing or len(profile.scores) != 1 or not profile.filters:
        return None
    fit, *others = profile.filters
    (score, weight) = profile.scores[0]
    if not isinstance(fit, NodeFit) or not isinstance(score, FgdScore):
        return None
    if type(score.model) is not FedFragmentation or score.exact:
        return None
    gpu_filters = (*fit.gpu_filters, *score.gpu_filters)
    if not by_kind(gpu_filters):
        return None
    return FgdBatch(
        fit=fit,
        score=score,
        model=score.model,
        weight=weight,
        other_filters=tuple(others),
    )
