"""Node shapes: the placement-relevant state of a node, without its identity.

Filters and scores see a :class:`NodeShape`, never a :class:`~.model.NodeState`. Two nodes with the
same shape therefore pass the same filters and get the same scores, which is what lets the
framework evaluate each distinct shape once per request instead of every node (see ``index.py``);
at 10,000 mostly similar nodes that is the difference between hundreds and thousands of decisions a
second. What is *not* in a shape (GPU indices, UUIDs, topology, holders) only matters when choosing
GPUs inside the node already chosen, which works on the real ``NodeState``.
"""

from __future__ import annotations

import functools

import msgspec

from services.placer.core.model import GPU_MILLI, GpuState, NodeState


class GpuShape(msgspec.Struct, frozen=True, gc=False, order=True, kw_only=True):
    """A GPU as filters and scores see it. Ordered by free GPU milli first."""

    free_milli: int
    """Smaller of free compute and free memory, in thousandths of the GPU; 0 if unusable."""
    model: str
    memory_total_mib: int
    memory_free_mib: int
    core_milli_free: int
    slots_free: int
    """-1 = no slot limit."""
    idle: bool
    exclusive: bool
    healthy: bool
    utilization_pct: int
    groups: tuple[str, ...]
    """Sorted, so that shapes stay totally ordered."""


def free_milli(memory_free_mib: int, memory_total_mib: int, core_milli_free: int) -> int:
    """GPU milli a new share could still use on a healthy GPU nobody holds whole: the smaller of
    its free compute and free memory, in thousandths of the GPU."""
    memory_milli = memory_free_mib * GPU_MILLI // memory_total_mib if memory_total_mib else 0
    return max(0, min(core_milli_free, memory_milli))


def gpu_free_milli(gpu: GpuState) -> int:
    """How much of ``gpu`` a new share could still use, in GPU milli (0 when it takes nothing)."""
    if not gpu.healthy or gpu.exclusive:
        return 0
    return free_milli(gpu.memory_free_mib, gpu.memory_total_mib, gpu.core_milli_free)


def gpu_shape(gpu: GpuState) -> GpuShape:
    # GpuState's properties read once each, inline: this runs for every GPU of every node
    # state the index takes and of every node a decision lands on.
    memory_total = gpu.memory_total_mib
    memory_free = gpu.memory_free_mib
    core_free = gpu.core_milli_free
    exclusive = gpu.exclusive
    healthy = gpu.healthy
    groups = gpu.groups
    return GpuShape(
        free_milli=free_milli(memory_free, memory_total, core_free)
        if healthy and not exclusive
        else 0,
        model=gpu.model,
        memory_total_mib=memory_total,
        memory_free_mib=memory_free,
        core_milli_free=core_free,
        slots_free=gpu.slots_free,
        idle=gpu.core_milli_reserved == 0 and gpu.memory_reserved_mib == 0 and not exclusive,
        exclusive=exclusive,
        healthy=healthy,
        utilization_pct=gpu.utilization_pct,
        groups=tuple(sorted(groups)) if groups else (),
    )


class NodeShape(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A node as filters and scores see it: free CPU and memory, its GPUs in canonical order."""

    cpu_milli_free: int
    memory_mib_free: int
    cpu_milli_total: int
    memory_mib_total: int
    gpus: tuple[GpuShape, ...]
    """Sorted ascending (least free first), so equal nodes have equal shapes."""
    schedulable: bool
    groups: frozenset[str]
    gpu_task_kinds: tuple[tuple[str, int], ...]
    free_milli: tuple[int, ...]
    """``gpus[i].free_milli`` for each GPU, ascending: what the GPU-milli policies read."""
    models: frozenset[str]

    @property
    def gpu_free_milli_total(self) -> int:
        return sum(self.free_milli)


def node_shape(node: NodeState) -> NodeShape:
    gpus = tuple(sorted(gpu_shape(g) for g in node.gpus))
    return NodeShape(
        cpu_milli_free=node.cpu_milli_free,
        memory_mib_free=node.memory_mib_free,
        cpu_milli_total=node.cpu_milli_total,
        memory_mib_total=node.memory_mib_total,
        gpus=gpus,
        schedulable=node.schedulable,
        groups=node.groups,
        gpu_task_kinds=node.gpu_task_kinds,
        free_milli=tuple(g.free_milli for g in gpus),
        models=_models(tuple(g.model for g in gpus)),
    )


@functools.lru_cache(maxsize=1024)
def _models(models: tuple[str, ...]) -> frozenset[str]:
    """One frozenset per mix of GPU models, shared by every shape (a frozenset is scanned by
    each full garbage collection, and a placer keeps a shape per node state it has seen)."""
    return frozenset(models)
