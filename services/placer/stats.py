"""Pure: the cluster statistics a placer publishes for the dashboard (``ClusterStats``).

Fragmentation is measured as the placement core measures it (FGD, Weng et al., ATC '23): for the
typical task mix the placer currently learns (``mix.py``), each placeable node's ``F_n`` is the
expected GPU milli no typical task could use there, and the cluster's is their sum. Capacity
counts the healthy GPUs of placeable nodes, 1000 milli each; allocated counts what Tessera booked
on them, each share the larger of its compute and memory fractions (a whole GPU is 1000).
"""

from __future__ import annotations

from collections.abc import Iterable

from services.placer.core.fragmentation import FragmentationModel
from services.placer.core.model import GPU_MILLI, GpuState, NodeState
from services.placer.core.shape import node_shape
from shared.messages.stats import ClusterStats


def booked_milli(gpu: GpuState) -> int:
    """What Tessera booked on ``gpu``, in GPU milli."""
    if gpu.exclusive:
        return GPU_MILLI
    memory = (
        -(-gpu.memory_reserved_mib * GPU_MILLI // gpu.memory_total_mib)
        if gpu.memory_total_mib
        else 0
    )
    return min(GPU_MILLI, max(gpu.core_milli_reserved, memory))


def cluster_stats(
    nodes: Iterable[NodeState],
    model: FragmentationModel,
    *,
    placer_id: str,
    profile: str,
    typical_tasks: int,
    pending_pods: int,
    now: float,
) -> ClusterStats:
    """The statistics of ``nodes`` as one placer sees them at ``now``."""
    count = gpus = capacity = allocated = 0
    per_node: dict[str, float] = {}
    for node in nodes:
        healthy = [g for g in node.gpus if g.healthy]
        if not node.schedulable or not healthy:
            continue
        count += 1
        gpus += len(healthy)
        capacity += GPU_MILLI * len(healthy)
        allocated += sum(booked_milli(g) for g in healthy)
        shape = node_shape(node)
        per_node[node.name] = model.node(
            shape.models, shape.cpu_milli_free, shape.memory_mib_free, shape.free_milli
        )
    fragmented = sum(per_node.values())
    return ClusterStats(
        placer_id=placer_id,
        computed_at=now,
        profile=profile,
        nodes=count,
        gpus=gpus,
        gpu_milli_capacity=capacity,
        gpu_milli_allocated=allocated,
        fragmented_milli=fragmented,
        fragmentation_pct=100 * fragmented / capacity if capacity else 0.0,
        node_fragmented_milli=per_node,
        typical_tasks=typical_tasks,
        pending_pods=pending_pods,
    )
