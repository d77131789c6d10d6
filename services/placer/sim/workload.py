"""The FGD methodology's workload for one seed (perf-anchor section 4, steps 2, 3 and 5).

- Tasks: the trace sorted by name, shuffled with the seed, then tuned to ``target`` x cluster
  GPU capacity by appending uniformly drawn clones until the next one would overshoot (or, for a
  trace above the target, by dropping random tasks until it fits).
- Node tie-break order: a permutation of the nodes drawn with the seed.
- Typical tasks: the most frequent specs of the *original* trace covering 95 % of it, each with
  the median memory of its spec's tasks (read only by the ``fgd-fed`` measure).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from services.placer.core.fragmentation import TypicalTask, typical_mix, with_median_memory
from services.placer.sim.trace import TraceNode, TraceTask


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
