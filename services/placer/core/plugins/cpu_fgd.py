"""CPU-fed fragmentation: FGD's measure, with free GPUs usable only as far as free CPU feeds them.

FGD (``fragmentation.py``) asks, per typical task ``m``, whether *one* more ``m`` fits the node;
if so, every GPU with enough free milli counts as usable. CPU enters only as that one-task
threshold, so a node with 8 idle GPUs and 20 free cores looks unfragmented for a task asking
11 cores and a GPU, although at most one more such task can ever start there: the other 7 GPUs
are stranded by CPU. On the Alibaba trace's 8-GPU nodes (12 cores per GPU against typical asks
of 11 to 19 cores per GPU, plus CPU-only tasks that land on GPU nodes) that is where a good part
of FGD's unallocated GPUs end up.

Here the number of copies of ``m`` the node's free CPU can run, ``k = cpu_free // cpu_m``, decides
which fitting GPUs are *fed*: the ``k x gpu_count`` with the most free milli. The free milli of
the fitting GPUs left unfed is added to FGD's fragment with weight ``unfed_weight``:
``F_n(m) = FGD's F_n(m) + unfed_weight x (free milli of fitting but unfed GPUs)``. At weight 1 a
GPU no CPU can feed is as lost as one too small; 0.5 (the default) hedges between that and FGD,
and measured best (at 1 the 8-GPU tasks of the multigpu20 trace lose the whole nodes they need
more often; benchmarks/RESULTS.md). With CPU to spare (``k`` at least the number of fitting GPUs)
the value equals FGD's, and it is never smaller.

The FGD score (``plugins/fgd.py``) and the FGD GPU choice use this model unchanged through the
:class:`FragmentationModel` interface (plugin and GPU choice ``fgd-cpu``). Profile ``tessera``
used it until ``fed_fgd.py`` (``fgd-fed``) extended it with memory and a fill tie-break.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from services.placer.core.fragmentation import BoundedMemo, FragmentationModel, TypicalTask

NAME = "fgd-cpu"


class CpuFedFragmentation(FragmentationModel):
    """Expected GPU milli a typical task could not use, counting only GPUs free CPU can feed."""

    def __init__(self, tasks: Iterable[TypicalTask], *, unfed_weight: float = 0.5) -> None:
        if not 0 <= unfed_weight <= 1:
            raise ValueError("unfed_weight must be in 0..1")
        super().__init__(tasks)
        self.unfed_weight = unfed_weight
        # The value depends on free CPU only through the copies each distinct CPU ask allows.
        self._cpu_asks = tuple(sorted({t.cpu_milli for t in self.tasks if t.gpu_count}))
        self._fed_memo = BoundedMemo[tuple[frozenset[str], tuple[int, ...], tuple[int, ...]]]()

    def node(self, models: frozenset[str], cpu_milli_free: int, free_milli: Sequence[int]) -> float:
        ordered = tuple(sorted(free_milli, reverse=True))
        gpus = len(ordered)
        copies = tuple(
            min(cpu_milli_free // ask, gpus) if ask > 0 else gpus for ask in self._cpu_asks
        )
        key = (models, copies, ordered)
        value = self._fed_memo.get(key)
        if value is None:
            value = self._fed_memo.put(key, self._fed(models, cpu_milli_free, ordered))
        return value

    def _fed(self, models: frozenset[str], cpu_free: int, ordered: tuple[int, ...]) -> float:
        """``ordered`` = per-GPU free milli, most free first."""
        idle = sum(ordered)
        if idle == 0:
            return 0.0
        total = 0.0
        for spec in self._tasks:
            if (
                spec.gpu_count == 0
                or cpu_free < spec.cpu_milli
                or (spec.models is not None and not (models & spec.models))
            ):
                total += spec.weight * idle
                continue
            fitting = [milli for milli in ordered if milli >= spec.gpu_milli]
            if len(fitting) < spec.gpu_count:
                total += spec.weight * idle
                continue
            fragment: float = idle - sum(fitting)
            if spec.cpu_milli > 0:
                fed = cpu_free // spec.cpu_milli * spec.gpu_count
                fragment += self.unfed_weight * sum(fitting[fed:])
            total += spec.weight * fragment
        return total
