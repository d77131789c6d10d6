"""The FGD methodology's workload for one seed (perf-anchor section 4, steps 2, 3 and 5).

- Tasks: the trace sorted by name, shuffled with the seed, then tuned to ``target`` x cluster
  GPU capacity by appending uniformly drawn clones until the next one would overshoot (or, for a
  trace above the target, by dropping random tasks until it fits).
- Node tie-break order: a permutation of the nodes drawn with the seed.
- Typical tasks: the most frequent specs of the *original* trace covering 95 % of it, each with
  the median memory of its spec's tasks (read only by the ``fgd-fed`` measure).
- Multi-GPU variants (:func:`with_multi_gpu_share`): the FGD artifact's ``multigpu*`` traces are
  the default trace with copies of its own multi-GPU tasks appended (drawn uniformly, with
  replacement) until multi-GPU tasks carry a given share of the GPU demand; the stored
  ``multigpu20`` is built so (every default task unchanged, 172 copies, 20.4 %), and the
  unstored 30 / 40 / 50 % ones have 356 / ~580 / 909 copies.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path

from services.placer.core.fragmentation import TypicalTask, typical_mix, with_median_memory
from services.placer.sim.trace import TraceError, TraceNode, TraceTask, load_tasks


def cluster_gpu_milli(nodes: Sequence[TraceNode]) -> int:
    return 1000 * sum(n.gpus for n in nodes)


def tuned_tasks(
    original: Sequence[TraceTask], capacity_milli: int, *, seed: int, target: float = 1.3
) -> list[TraceTask]:
    """The seed's task list: shuffled trace, then clones up to ``target`` x capacity."""
    rng = random.Random(seed)
    tasks = list(original)
    rng.shuffle(tasks)
    goal = target * capacity_milli
    total = sum(t.total_gpu_milli for t in tasks)
    if total > goal:
        while total > goal and tasks:
            dropped = tasks.pop(rng.randrange(len(tasks)))
            total -= dropped.total_gpu_milli
        return tasks
    if not any(t.gpu_milli for t in original):
        return tasks
    clone = 0
    while True:
        pick = original[rng.randrange(len(original))]
        # The paper's simulator tests the per-GPU milli against the target but adds the total.
        if total + pick.gpu_milli > goal:
            break
        clone += 1
        tasks.append(
            TraceTask(
                name=f"{pick.name}-clone-{clone}",
                cpu_milli=pick.cpu_milli,
                memory_mib=pick.memory_mib,
                gpu_count=pick.gpu_count,
                gpu_milli=pick.gpu_milli,
                models=pick.models,
                tenant=pick.tenant,
            )
        )
        total += pick.total_gpu_milli
    return tasks


def with_multi_gpu_share(
    original: Sequence[TraceTask], share: float, *, seed: int = 0
) -> list[TraceTask]:
    """``original`` plus copies of its multi-GPU tasks until they carry ``share`` of the GPU
    demand (module docstring); copies are named on from the trace's highest ``openb-pod-NNNN``."""
    if not 0 <= share < 1:
        raise ValueError("share must be in [0, 1)")
    multi = [t for t in original if t.gpu_count > 1]
    total = sum(t.total_gpu_milli for t in original)
    carried = sum(t.total_gpu_milli for t in multi)
    if not multi or carried >= share * total:
        return list(original)
    rng = random.Random(seed)
    numbers = [
        int(t.name.rsplit("-", 1)[1]) for t in original if t.name.rsplit("-", 1)[-1].isdigit()
    ]
    number = max(numbers, default=len(original) - 1)
    tasks = list(original)
    while carried < share * total:
        pick = multi[rng.randrange(len(multi))]
        number += 1
        tasks.append(
            TraceTask(
                name=f"openb-pod-{number:04d}",
                cpu_milli=pick.cpu_milli,
                memory_mib=pick.memory_mib,
                gpu_count=pick.gpu_count,
                gpu_milli=pick.gpu_milli,
                models=pick.models,
                tenant=pick.tenant,
            )
        )
        carried += pick.total_gpu_milli
        total += pick.total_gpu_milli
    return tasks


def named_trace(data: Path, name: str) -> list[TraceTask]:
    """The tasks of trace ``name`` in ``data`` (``openb_pod_list_NAME.csv``); a ``multigpuNN``
    trace that is not stored there is built from the default trace (:func:`with_multi_gpu_share`,
    ``NN`` % of the GPU demand on multi-GPU tasks)."""
    path = data / f"openb_pod_list_{name}.csv"
    match = re.fullmatch(r"multigpu(\d\d)", name)
    if path.exists() or match is None:
        return load_tasks(path)
    share = int(match.group(1)) / 100
    if share >= 1:
        raise TraceError(f"{name}: multi-GPU share must be below 100 %")
    return with_multi_gpu_share(load_tasks(data / "openb_pod_list_default.csv"), share)


def node_order(nodes: Sequence[TraceNode], *, seed: int) -> list[str]:
    """Tie-break order for the seed: a random permutation of the node names."""
    names = [n.name for n in nodes]
    random.Random(seed * 7919 + 17).shuffle(names)
    return names


def typical_tasks(original: Sequence[TraceTask]) -> tuple[TypicalTask, ...]:
    mix = typical_mix((t.cpu_milli, t.gpu_milli, t.gpu_count, t.models) for t in original)
    return with_median_memory(
        mix, ((t.cpu_milli, t.gpu_milli, t.gpu_count, t.models, t.memory_mib) for t in original)
    )
