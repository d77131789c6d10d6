"""Pure: the cluster statistics a placer publishes for the dashboard (``ClusterStats``).

Fragmentation is measured as the placement core measures it (FGD, Weng et al., ATC '23): for the
typical task mix the placer currently learns (``mix.py``), each placeable node's ``F_n`` is the
expected GPU milli no typical task could use there, and the cluster's is their sum. Capacity
counts the healthy GPUs of placeable nodes, 1000 milli each; allocated counts what Tessera booked
on them, each share the larger of its compute and memory fractions (a whole GPU is 1000).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from services.placer.core.fragmentation import FragmentationModel
from services.placer.core.groups import TenantQuota
from services.placer.core.model import GPU_MILLI, GpuState, NodeState
from services.placer.core.shape import node_shape
from services.placer.rules.repairs import RecordFacts
from shared.messages.ledger import Booking, PodClaim
from shared.messages.stats import ClusterStats, TenantUsage
from shared.subjects import assignment_key


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
    tenants: tuple[TenantUsage, ...] = (),
    pods_reserved: int = 0,
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
        pods_reserved=pods_reserved,
        tenants=tenants,
    )


def reserved_pods(claims: Mapping[str, PodClaim], records: Mapping[str, RecordFacts]) -> int:
    """Pods whose claim names a booking no record of that commit follows yet (``reserved``)."""
    count = 0
    for uid, claim in claims.items():
        booking = claim.booking
        if claim.state != "placed" or booking is None:
            continue
        record = records.get(assignment_key(booking.node, uid))
        count += record is None or record.commit != booking.commit
    return count


def tenant_usage(
    ledgers: Mapping[str, Iterable[Booking]], quotas: Iterable[TenantQuota]
) -> tuple[TenantUsage, ...]:
    """What each tenant holds in ``ledgers`` (every node's bookings) with its quota, by name:
    every tenant with a booking or a quota. Shares count one each, as quotas count them."""
    held: dict[str, dict[str, int]] = {}
    for bookings in ledgers.values():
        for booking in bookings:
            tenant = booking.tenant or booking.namespace
            usage = held.setdefault(tenant, {"pods": 0, "gpus": 0, "memory": 0, "cores": 0})
            usage["pods"] += 1
            for container in booking.containers:
                for piece in container.gpus:
                    usage["gpus"] += 1
                    usage["memory"] += piece.memory_mib
                    usage["cores"] += GPU_MILLI if piece.exclusive else piece.core_milli
    limits = {quota.tenant: quota for quota in quotas}
    return tuple(
        TenantUsage(
            tenant=tenant,
            pods=held.get(tenant, {}).get("pods", 0),
            gpus=held.get(tenant, {}).get("gpus", 0),
            gpu_memory_mib=held.get(tenant, {}).get("memory", 0),
            core_milli=held.get(tenant, {}).get("cores", 0),
            quota_gpus=limits[tenant].gpus if tenant in limits else None,
            quota_gpu_memory_mib=limits[tenant].gpu_memory_mib if tenant in limits else None,
        )
        for tenant in sorted(set(held) | set(limits))
    )
