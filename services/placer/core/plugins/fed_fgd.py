"""Fed fragmentation: FGD over the GPUs free CPU *and memory* can feed, plus a hole-fill tie-break.

FGD (``fragmentation.py``) asks, per typical task ``m``, whether *one* more ``m`` fits the node;
if so, every GPU with enough free milli counts as usable. CPU and memory enter only as that
one-task threshold, so a node with 8 idle GPUs and 20 free cores looks unfragmented for a task
asking 11 cores and a GPU, although at most one more such task can ever start there: the other 7
GPUs are stranded. Found by looking at where the unallocated GPUs of the Alibaba 2023 trace end up
(seed 42, default trace, at 100 % arrived; benchmarks/RESULTS.md), three changes:

0. **CPU feeds GPUs** (plugin and GPU choice ``fgd-cpu``: this measure with ``memory_margin=0``;
   profile ``tessera`` before the next two changes). On the trace's 8-GPU nodes (12 cores per GPU
   against typical asks of 11 to 19 cores per GPU, plus CPU-only tasks that land on GPU nodes) a
   good part of FGD's unallocated GPUs were idle GPUs no CPU was left for. The copies of ``m`` the
   node's free CPU can run, ``k = cpu_free // cpu_m``, decide which fitting GPUs are *fed*: the
   ``k x gpu_count`` with the most free milli. The free milli of the fitting GPUs left unfed is
   added to FGD's fragment with weight ``unfed_weight``: ``F_n(m) = FGD's F_n(m) + unfed_weight x
   (free milli of fitting but unfed GPUs)``. At weight 1 a GPU nothing can feed is as lost as one
   too small; 0.5 (the default) hedges between that and FGD, and measured best (at 1 the 8-GPU
   tasks of the multigpu20 trace lose the whole nodes they need more often). With CPU and memory
   to spare the value equals FGD's, and it is never smaller.

1. **Memory feeds GPUs too.** On the trace's G2 nodes (8 GPUs, 384 GiB) a typical whole-GPU task
   asks 48 GiB, exactly an eighth of the node: memory runs out as often as CPU does, and whole
   GPUs were left idle beside a few hundred MiB of free memory. So ``k = min(cpu_free // cpu_m,
   memory_free // memory_m)``, and a node without the memory for one copy of ``m`` cannot run
   ``m`` at all (all its idle milli is ``m``'s fragment, as FGD does for CPU). A typical task's
   memory is the median of its spec's tasks (``TypicalTask.memory_mib``; 0 leaves memory out, as
   does ``memory_margin=0``, which gives exactly the CPU-fed values of change 0). The medians are
   taken ``memory_margin`` times (1.2 by default): tasks of one spec ask up to 1.6 x the median,
   and a margin that calls memory tight a little early measured better than none (3 seeds:
   1.0 -> 4.36 %, 1.2 -> 4.23 %, 6 quick seeds: 1.1 / 1.3 / 1.5 -> 4.31 / 4.27 / 4.31).
   The margin counts from the second copy on (``first_copy_exact``, the default): one copy fits
   wherever the typical ask itself does. Margined from the first copy, the trace's 8-GPU task
   of 720 GiB (864 GiB with the margin) could never run on the 768 GiB G3 nodes that are the only
   ones to hold it, so nothing kept their GPUs for it, and on the multi-GPU heavy mixes up to 28
   of them failed by 100 % arrived while other tasks took the G3 nodes.

2. **Among equal integer scores, keep holes fillable.** FGD's integer score ties often, and the
   node tie-break is then the seed order. For a GPU-sharing pod this plugin breaks ties (node and
   GPU alike) by how much the placement lowers the *fill waste* of the GPU it lands on: ``W(h)``,
   the least free milli a GPU with ``h`` free can be left with after packing it with typical
   single-GPU sizes (for the trace: a 190 hole can still take a 160 share, a 130 hole nothing).
   ``W(before) - W(after)`` is largest where the share fills a hole exactly or leaves one that
   frequent sizes can fill, so holes of 120 / 130 milli (a 650 beside a 220 / 230) became half as
   common. Whole-GPU and CPU-only pods keep the seed order: every deterministic tie-break tried
   for them (most / least CPU per idle GPU, fewest / most idle GPUs) lost 0.04..0.13 points.

3. **Scarce hosts** (argument ``scarcity``, 1 by default, 0 = off). Given the cluster's node
   kinds (``hosts``, ``fragmentation.HostKind``; without them nothing changes), a typical task
   whose hosts (the nodes an empty one of which fits it) hold less than half the cluster's GPUs
   (:data:`SCARCE_FROM`) weighs ``(all GPUs / its hosts' GPUs) ** scarcity`` times more
   (:func:`rarity`): the trace's 8-GPU 720 GiB task fits only the 39 G3 nodes (20 x), so a pod
   that fits elsewhere no longer takes a whole G3 node from it. Multi-GPU mixes, seeds 42..46,
   mix learned online: multigpu30 / 40 / 50 3.48 / 3.10 / 2.82 -> 3.46 / 3.03 / 2.72; every
   task weighed so (no threshold): 3.50 / 3.15 / 2.74; exponent 2: 3.51 / 3.22 / 2.84. The five
   stored traces did not move (benchmarks/RESULTS.md). A task of a learned mix that no pod
   asked for (the prior's, ``TypicalTask.assumed``) is not weighed so: on a small cluster, where
   one node is a kind of its own, the prior's 8-GPU task kept the one 8-GPU node free for pods
   that never came.

Plugin and GPU choice ``fgd-fed`` are FGD's own score and GPU choice (``plugins/fgd.py``,
``gpu_choice.Fgd``) over this model, with the fill-waste tie-break of ``fragmentation.py``:
``int(100 * sigmoid((F_n - F_n') / 1000)) + FILL_TIE x (W(before) - W(after))`` with
``FILL_TIE x 1000 < 1``, so the tie-break never overrides a whole point of FGD. It uses only the
current task, the cluster state and the typical mix, as FGD does. Measured (10 seeds,
unallocated GPU % at 100 % arrived, default trace): FGD 4.78, CPU-fed 4.46, this 4.26; better
than FGD on every variant trace too (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence

from services.placer.core.fragmentation import (
    BoundedMemo,
    FragmentationModel,
    HostKind,
    TypicalTask,
    models_key,
)

COPIES_MEMO_LIMIT = 100_000
"""Free CPU and memory states whose copies are memoised before that memo starts over."""
SCARCE_FROM = 2.0
"""A typical task's hosts are scarce when they hold less than 1 / this of the cluster's GPUs:
only then does ``scarcity`` weigh it more (the trace's 8-GPU tasks that G2 nodes hold too,
on 78 % of the GPUs, weighed 1.27 x made the multi-GPU mixes worse)."""


class FedFragmentation(FragmentationModel):
    """Expected GPU milli a typical task could not use; only GPUs free CPU and memory feed count."""

    def __init__(
        self,
        tasks: Iterable[TypicalTask],
        *,
        unfed_weight: float = 0.5,
        memory_margin: float = 1.2,
        first_copy_exact: bool = True,
        hosts: Sequence[HostKind] = (),
        scarcity: float = 1.0,
    ) -> None:
        if not 0 <= unfed_weight <= 1:
            raise ValueError("unfed_weight must be in 0..1")
        if memory_margin < 0:
            raise ValueError("memory_margin must be >= 0")
        super().__init__(tasks)
        if scarcity < 0:
            raise ValueError("scarcity must be >= 0")
        self.scarcity = scarcity
        self.hosts = tuple(hosts)
        if hosts and scarcity:
            self._tasks = tuple(
                dataclasses.replace(w, weight=w.weight * factor)
                for w, factor in zip(
                    self._tasks, rarity(self.tasks, self.hosts, scarcity), strict=True
                )
            )
        self.unfed_weight = unfed_weight
        self.memory_margin = memory_margin
        self.first_copy_exact = first_copy_exact
        self._memory = tuple(int(t.memory_mib * memory_margin) for t in self.tasks)
        # The memory one copy needs to fit at all: the margined ask, or (first_copy_exact) the
        # typical ask itself, the margin then counting from the second copy on.
        self._first = tuple(
            min(t.memory_mib, margined) if first_copy_exact else margined
            for t, margined in zip(self.tasks, self._memory, strict=True)
        )
        # The value depends on free CPU and memory only through the copies each distinct ask
        # allows, so those copies (not the free amounts) key the memo.
        self._asks = tuple(
            sorted(
                {
                    (t.cpu_milli, first, memory)
                    for t, first, memory in zip(self.tasks, self._first, self._memory, strict=True)
                    if t.gpu_count
                }
            )
        )
        self._fed_memo = BoundedMemo[tuple[str, tuple[int, ...], tuple[int, ...]]]()
        # Free CPU and memory repeat across nodes and decisions (pods take fixed amounts), and
        # the copies key costs a pass over every distinct ask: worth a memo of its own. Few
        # distinct copies tuples exist, so each is kept once (the fed memo's keys share them).
        self._copies_memo: dict[tuple[int, int, int], tuple[int, ...]] = {}
        self._copies_interned: dict[tuple[int, ...], tuple[int, ...]] = {}
        # The last node's models, free CPU and memory, GPU count, and their key parts: an FGD
        # score asks for one node after another GPU's share, the same but the GPUs' free milli.
        self._last_node: tuple[frozenset[str], int, int, int, str, tuple[int, ...]] = (
            frozenset(),
            -1,
            -1,
            -1,
            "",
            (),
        )

    @property
    def memory(self) -> tuple[int, ...]:
        """Each typical task's memory ask as this measure counts it (the margin applied)."""
        return self._memory

    @property
    def first_memory(self) -> tuple[int, ...]:
        """The memory each typical task's first copy needs to fit at all."""
        return self._first

    def node(
        self,
        models: frozenset[str],
        cpu_milli_free: int,
        memory_mib_free: int,
        free_milli: Sequence[int],
    ) -> float:
        """``F_n`` for a node with these GPU models, free CPU and memory, and per-GPU free milli."""
        ordered = tuple(sorted(free_milli, reverse=True))
        last = self._last_node
        if (
            last[0] is models
            and last[1] == cpu_milli_free
            and last[2] == memory_mib_free
            and last[3] == len(ordered)
        ):
            key = (last[4], last[5], ordered)
        else:
            key = (
                models_key(models),
                self._copies(cpu_milli_free, memory_mib_free, len(ordered)),
                ordered,
            )
            self._last_node = (
                models,
                cpu_milli_free,
                memory_mib_free,
                len(ordered),
                key[0],
                key[1],
            )
        value = self._fed_memo.get(key)
        if value is None:
            value = self._fed_memo.put(
                key, self._fed_value(models, cpu_milli_free, memory_mib_free, ordered)
            )
        return value

    def _copies(self, cpu_free: int, memory_free: int, gpus: int) -> tuple[int, ...]:
        """How many copies of each distinct ask the free CPU and memory allow (at most ``gpus``)."""
        state = (cpu_free, memory_free, gpus)
        copies = self._copies_memo.get(state)
        if copies is None:
            if len(self._copies_memo) >= COPIES_MEMO_LIMIT:
                self._copies_memo.clear()
                self._copies_interned.clear()
            copies = tuple(
                _copies(cpu_free, memory_free, gpus, cpu, first, memory)
                for cpu, first, memory in self._asks
            )
            copies = self._copies_memo[state] = self._copies_interned.setdefault(copies, copies)
        return copies

    def _fed_value(
        self, models: frozenset[str], cpu_free: int, memory_free: int, ordered: tuple[int, ...]
    ) -> float:
        """``ordered`` = per-GPU free milli, most free first."""
        idle = sum(ordered)
        if idle == 0:
            return 0.0
        # The GPUs a task fits are a prefix of ``ordered``: prefix sums and a search on the
        # ascending copy give each task's sums without a pass over the GPUs (integers: exact).
        ascending = ordered[::-1]
        gpus = len(ordered)
        prefix = [0]
        for milli in ordered:
            prefix.append(prefix[-1] + milli)
        total = 0.0
        for spec, first, memory in zip(self._tasks, self._first, self._memory, strict=True):
            copies = (
                _copies(cpu_free, memory_free, gpus, spec.cpu_milli, first, memory)
                if spec.gpu_count
                else 0
            )
            if copies == 0 or (spec.models is not None and not (models & spec.models)):
                total += spec.weight * idle
                continue
            fitting = gpus - bisect.bisect_left(ascending, spec.gpu_milli)
            if fitting < spec.gpu_count:
                total += spec.weight * idle
                continue
            fed = min(fitting, copies * spec.gpu_count)
            fragment = idle - prefix[fitting] + self.unfed_weight * (prefix[fitting] - prefix[fed])
            total += spec.weight * fragment
        return total


def _copies(cpu_free: int, memory_free: int, gpus: int, cpu: int, first: int, memory: int) -> int:
    """Copies of a task asking ``cpu`` and ``memory`` (``first`` for the first copy) that free CPU
    and memory can run, at most ``gpus``; 0 when not even one fits."""
    if cpu_free < cpu or memory_free < first:
        return 0
    return max(
        1,
        min(
            cpu_free // cpu if cpu > 0 else gpus,
            memory_free // memory if memory > 0 else gpus,
            gpus,
        ),
    )


def rarity(
    tasks: Sequence[TypicalTask],
    hosts: Sequence[HostKind],
    exponent: float,
    scarce_from: float = SCARCE_FROM,
) -> tuple[float, ...]:
    """Per typical task, ``(all GPUs / GPUs of the nodes an empty one of which fits it) **
    exponent``: 1 for a task any GPU node can run, large for one only a few nodes can, 1 for a
    task no pod was seen asking for (``TypicalTask.assumed``)."""
    total = sum(h.gpus * h.count for h in hosts)
    factors = []
    for t in tasks:
        if t.assumed:  # a guess about the tasks: no reason to keep hosts for it
            factors.append(1.0)
            continue
        fitting = sum(
            h.gpus * h.count
            for h in hosts
            if t.gpu_count
            and h.gpus >= t.gpu_count
            and h.cpu_milli >= t.cpu_milli
            and h.memory_mib >= t.memory_mib
            and (not t.models or set(t.models) & set(h.models))
        )
        ratio = total / fitting if fitting else 1.0
        factors.append(ratio**exponent if ratio >= scarce_from else 1.0)
    return tuple(factors)
