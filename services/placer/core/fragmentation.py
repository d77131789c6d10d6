"""GPU fragmentation of a node for a typical task mix (Weng et al., ATC '23; perf-anchor sec. 4).

For a typical task ``m`` with probability ``p_m``, the fragment ``F_n(m)`` of node ``n`` is the GPU
milli that ``m`` could not use: all idle GPU milli when ``m`` needs no GPU, may not run on the
node's model, or does not fit (CPU or GPUs); otherwise the free milli of the GPUs too small for
it. ``F_n = sum_m p_m F_n(m)``. Memory is ignored, as in the paper (the interface passes the
node's free memory for measures that use it, ``plugins/fed_fgd.py``).

:func:`fill_waste` is a second, per-GPU view of the same mix: how small a hole typical sizes can
pack a GPU's free milli down to. FGD's score and GPU choice may break ties with it
(:data:`FILL_TIE`).

The value depends only on the node's GPU models, which CPU thresholds its free CPU passes, and the
multiset of per-GPU free milli, so it is memoised on exactly that key: the FGD score and the
simulator's cluster metric ask for the same few thousand states again and again.
"""

from __future__ import annotations

import bisect
import functools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from services.placer.core.model import GPU_MILLI, NodeState


class TypicalTask(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of the typical task mix."""

    cpu_milli: int
    gpu_count: int
    gpu_milli: int
    """Per GPU; 1000 for whole GPUs."""
    models: tuple[str, ...] = ()
    """Allowed GPU models; empty = any."""
    weight: float
    memory_mib: int = 0
    """Typical memory ask, 0 = unknown (read by ``plugins/fed_fgd.py``; FGD ignores it)."""
    assumed: bool = False
    """No pod seen asked for it: a prior's guess in a learned mix (``rules/mix.py``), which the
    fed measure's scarce hosts do not weigh more."""


class HostKind(msgspec.Struct, frozen=True, kw_only=True):
    """Nodes of one capacity in the cluster: what an empty one offers, and how many there are."""

    cpu_milli: int
    memory_mib: int
    gpus: int
    models: tuple[str, ...] = ()
    count: int = 1


def host_kinds(nodes: Iterable[NodeState]) -> tuple[HostKind, ...]:
    """The cluster's GPU nodes grouped by capacity (allocatable CPU, memory, GPUs, models)."""
    counts: dict[HostKind, int] = {}
    for node in nodes:
        if not node.gpus:
            continue
        kind = HostKind(
            cpu_milli=node.cpu_milli_total,
            memory_mib=node.memory_mib_total,
            gpus=len(node.gpus),
            models=tuple(sorted({g.model for g in node.gpus})),
        )
        counts[kind] = counts.get(kind, 0) + 1
    return counted_kinds(counts)


def counted_kinds(counts: Mapping[HostKind, int]) -> tuple[HostKind, ...]:
    """``counts``' kinds with their counts, sorted (equal clusters give equal kinds)."""
    return tuple(
        msgspec.structs.replace(kind, count=n)
        for kind, n in sorted(counts.items(), key=lambda kv: msgspec.structs.astuple(kv[0]))
    )


Key = TypeVar("Key")

MEMO_LIMIT = 500_000
"""States memoised before the memo starts over (a long-running placer must not grow without end)."""


@functools.lru_cache(maxsize=1024)
def models_key(models: frozenset[str]) -> str:
    """``models`` as a memo key: a string, as a key holding a frozenset would stay tracked by the
    garbage collector (frozensets always are), and memos hold up to :data:`MEMO_LIMIT` keys that
    every full collection would scan (``tests/shared/test_untracked.py``). Few distinct model
    sets exist (one per mix of GPU models on a node), so each is joined once."""
    return "\n".join(sorted(models))


class BoundedMemo(dict[Key, float]):
    """Fragmentation values by node state; cleared once it holds :data:`MEMO_LIMIT` states."""

    def put(self, key: Key, value: float) -> float:
        if len(self) >= MEMO_LIMIT:
            self.clear()
        self[key] = value
        return value


@dataclass(frozen=True, slots=True)
class WeightedTask:
    cpu_milli: int
    gpu_count: int
    gpu_milli: int
    models: frozenset[str] | None
    weight: float


class FragmentationModel:
    """Expected fragmented GPU milli of a node under a fixed typical task mix (memoised)."""

    def __init__(self, tasks: Iterable[TypicalTask]) -> None:
        listed = list(tasks)
        total = sum(t.weight for t in listed)
        if listed and total <= 0:
            raise ValueError("typical task weights must add up to more than 0")
        self.tasks: tuple[TypicalTask, ...] = tuple(listed)
        self._tasks = tuple(
            WeightedTask(
                cpu_milli=t.cpu_milli,
                gpu_count=t.gpu_count,
                gpu_milli=t.gpu_milli,
                models=frozenset(t.models) if t.models else None,
                weight=t.weight / total,
            )
            for t in listed
        )
        self._cpu_levels = sorted({t.cpu_milli for t in listed})
        self._memo = BoundedMemo[tuple[str, int, tuple[int, ...]]]()

    @property
    def weighted_tasks(self) -> tuple[WeightedTask, ...]:
        """The mix with weights adding up to 1 and allowed models as a set (None = any)."""
        return self._tasks

    def node(
        self,
        models: frozenset[str],
        cpu_milli_free: int,
        memory_mib_free: int,
        free_milli: Sequence[int],
    ) -> float:
        """``F_n`` for a node with these GPU models, free CPU and memory (ignored here) and
        per-GPU free milli (any order)."""
        ordered = tuple(sorted(free_milli))
        key = (models_key(models), bisect.bisect_right(self._cpu_levels, cpu_milli_free), ordered)
        value = self._memo.get(key)
        if value is None:
            value = self._memo.put(key, self._compute(models, cpu_milli_free, ordered))
        return value

    def _compute(self, models: frozenset[str], cpu_free: int, free: tuple[int, ...]) -> float:
        idle = sum(free)
        if idle == 0:
            return 0.0
        total = 0.0
        for task in self._tasks:
            if (
                task.gpu_count == 0
                or cpu_free < task.cpu_milli
                or (task.models is not None and not (models & task.models))
            ):
                total += task.weight * idle
                continue
            need = task.gpu_milli
            fitting = 0
            stranded = 0
            for milli in free:
                if milli >= need:
                    fitting += 1
                else:
                    stranded += milli
            total += task.weight * (stranded if fitting >= task.gpu_count else idle)
        return total


FILL_TIE = 1e-4
"""Weight of a fill-waste tie-break: ``|W(before) - W(after)| <= 1000``, so at most 0.1 point."""


def fill_waste(tasks: Iterable[TypicalTask]) -> tuple[int, ...]:
    """``W[h]`` for ``h`` in 0..1000: the least free milli a GPU with ``h`` free can end up with
    after packing it with the single-GPU sizes of ``tasks`` (shares and whole GPUs)."""
    sizes = sorted({t.gpu_milli for t in tasks if t.gpu_count == 1 and t.gpu_milli > 0})
    waste = [0] * (GPU_MILLI + 1)
    for h in range(GPU_MILLI + 1):
        fitting = [s for s in sizes if s <= h]
        waste[h] = min((waste[h - s] for s in fitting), default=h)
    return tuple(waste)


def typical_mix(
    tasks: Iterable[tuple[int, int, int, tuple[str, ...]]], *, coverage: float = 0.95
) -> tuple[TypicalTask, ...]:
    """The paper's typical tasks: the most frequent specs covering ``coverage`` of all tasks.

    ``tasks`` yields ``(cpu_milli, gpu_milli, gpu_count, models)`` per task (memory is ignored).
    Specs are sorted by count, then larger CPU, GPU milli and GPU count first; the kept specs'
    weights are renormalised to add up to 1.
    """
    counts: dict[tuple[int, int, int, tuple[str, ...]], int] = {}
    for spec in tasks:
        counts[spec] = counts.get(spec, 0) + 1
    total = sum(counts.values())
    if total == 0:
        return ()
    ordered = sorted(
        counts.items(), key=lambda kv: (-kv[1], -kv[0][0], -kv[0][1], -kv[0][2], kv[0][3])
    )
    kept: list[tuple[tuple[int, int, int, tuple[str, ...]], int]] = []
    covered = 0
    for spec, count in ordered:
        if covered >= coverage * total:
            break
        kept.append((spec, count))
        covered += count
    return tuple(
        TypicalTask(
            cpu_milli=cpu,
            gpu_milli=min(gpu_milli, GPU_MILLI),
            gpu_count=gpu_count,
            models=models,
            weight=count / covered,
        )
        for (cpu, gpu_milli, gpu_count, models), count in kept
    )


def with_median_memory(
    mix: Iterable[TypicalTask], tasks: Iterable[tuple[int, int, int, tuple[str, ...], int]]
) -> tuple[TypicalTask, ...]:
    """``mix`` with each typical task's ``memory_mib`` set to the median (low) memory of its spec.

    ``tasks`` yields ``(cpu_milli, gpu_milli, gpu_count, models, memory_mib)`` per task, the same
    tasks :func:`typical_mix` counted; GPU milli above a whole GPU is capped as there.
    """
    memory: dict[tuple[int, int, int, tuple[str, ...]], list[int]] = {}
    for cpu, gpu_milli, gpu_count, models, memory_mib in tasks:
        memory.setdefault((cpu, min(gpu_milli, GPU_MILLI), gpu_count, models), []).append(
            memory_mib
        )
    return tuple(
        msgspec.structs.replace(
            t,
            memory_mib=statistics.median_low(
                memory.get((t.cpu_milli, t.gpu_milli, t.gpu_count, t.models), [0])
            ),
        )
        for t in mix
    )
