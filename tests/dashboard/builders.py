"""Builders for dashboard inputs (``tests.harness.wire`` in this directory's order and defaults),
and a synthetic cluster written into a real nats-server.

Also used by ``benchmarks/dashboard.py`` (100 nodes x 8 GPUs) and to draw ``docs/dashboard.png``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord, AssignmentState
from shared.messages.base import GpuSlice
from shared.messages.inventory import GpuHealthState, GpuTelemetry, NodeInventory
from shared.messages.nodes import NodeFacts
from shared.messages.placement import PlacementRejected, RejectionReason
from shared.messages.pods import PodDeleted
from shared.messages.stats import ClusterStats
from shared.runtime.bus import Bus
from tests.harness import wire
from tests.harness.kv import put_facts, put_inventory, put_record

NOW = wire.NOW

MODELS = (("A100-SXM4-80GB", 81920), ("H100-SXM5-80GB", 81920), ("L40S", 46068), ("T4", 15360))


def gpu(
    uuid: str,
    index: int = 0,
    *,
    model: str = "A100-SXM4-80GB",
    total: int = 81920,
    used: int = 0,
    utilization: int = 0,
    health: GpuHealthState = "healthy",
    reason: str = "",
) -> GpuTelemetry:
    """A GPU whose temperature and power follow its utilization."""
    return wire.gpu(
        index,
        uuid=uuid,
        model=model,
        memory_mib=total,
        used_mib=used,
        utilization=utilization,
        temperature_c=40 + utilization // 3,
        power_w=60.0 + 3 * utilization,
        health=health,
        reason=reason,
    )


def inventory(node: str, *gpus: GpuTelemetry, observed_at: float = NOW) -> NodeInventory:
    return wire.inventory(*gpus, node=node, at=observed_at, backend="fake", driver_version="550.54")


def facts(node: str, *, ready: bool = True, schedulable: bool = True) -> NodeFacts:
    return NodeFacts(
        node=node,
        cpu_allocatable_milli=64_000,
        memory_allocatable_mib=262_144,
        ready=ready,
        schedulable=schedulable,
        observed_at=NOW,
    )


def share(uuid: str, index: int = 0, *, memory: int = 10240, cores: int = 25) -> GpuSlice:
    return wire.share(index, uuid=uuid, memory_mib=memory, cores=cores)


def record(
    node: str,
    uid: str,
    *shares: GpuSlice,
    state: AssignmentState = "allocated",
    name: str = "",
    namespace: str = "ml",
    container: str = "main",
    decided_at: float = NOW,
) -> AssignmentRecord:
    """One container's record of no commit, released a second after it was decided."""
    return wire.record(
        uid,
        wire.container(container, *shares, devices=0),
        node=node,
        name=name,
        namespace=namespace,
        state=state,
        decided_at=decided_at,
        released_at=decided_at + 1 if state == "released" else None,
        commit="",
    )


def rejection(
    uid: str,
    *reasons: tuple[str, int],
    name: str = "",
    namespace: str = "ml",
    decided_at: float = NOW,
    message: str = "",
) -> PlacementRejected:
    return PlacementRejected(
        pod_uid=uid,
        namespace=namespace,
        name=name or f"pod-{uid}",
        reasons=tuple(RejectionReason(reason=r, nodes=n) for r, n in reasons)
        or (RejectionReason(reason="insufficient GPU memory", nodes=1),),
        message=message,
        decided_at=decided_at,
        placer_id="placer-0",
    )


def deleted(uid: str, *, at: float = NOW) -> PodDeleted:
    return PodDeleted(uid=uid, namespace="ml", name=f"pod-{uid}", deleted_at=at)


def stats(
    placer_id: str = "placer-0", *, pct: float = 3.5, at: float = NOW, reserved: int = 0
) -> ClusterStats:
    return ClusterStats(
        placer_id=placer_id,
        computed_at=at,
        profile="tessera",
        nodes=2,
        gpus=4,
        gpu_milli_capacity=4000,
        gpu_milli_allocated=1500,
        fragmented_milli=pct * 40,
        fragmentation_pct=pct,
        node_fragmented_milli={"n1": pct * 40},
        pods_reserved=reserved,
    )


# --- a whole cluster ------------------------------------------------------------------------


@dataclass
class Cluster:
    """Inputs for a cluster of nodes, as they would sit in the KV buckets and on the subjects."""

    inventories: list[NodeInventory] = field(default_factory=list)
    facts: list[NodeFacts] = field(default_factory=list)
    records: list[AssignmentRecord] = field(default_factory=list)
    rejections: list[PlacementRejected] = field(default_factory=list)
    stats: list[ClusterStats] = field(default_factory=list)


NAMESPACES = ("research", "inference", "training", "batch")
SIZES = ((81920, 100), (40960, 50), (20480, 25), (10240, 25), (16384, 30), (8192, 10))


def synthetic_cluster(
    nodes: int, gpus_per_node: int, *, seed: int = 7, now: float = NOW, pending: int = 6
) -> Cluster:
    """A deterministic cluster: mixed models, GPUs filled to different levels with whole GPUs and
    slices in every state, one unhealthy GPU, a cordoned node, Pending pods and placer stats."""
    rng = random.Random(seed)
    cluster = Cluster()
    uid = 0
    frag: dict[str, float] = {}
    for n in range(nodes):
        name = f"gpu-node-{n + 1}"
        model, total = MODELS[(n // 3) % len(MODELS)]
        gpus = []
        for i in range(gpus_per_node):
            uuid = f"GPU-{n + 1:03d}-{i}"
            free_mem, free_cores = total, 100
            shares: list[GpuSlice] = []
            target = rng.choice((0.0, 0.3, 0.6, 0.9, 1.0))
            while free_mem > total * (1 - target):
                memory, cores = rng.choice(SIZES)
                memory = min(memory, total)
                if memory > free_mem or cores > free_cores:
                    break
                shares.append(share(uuid, i, memory=memory, cores=cores))
                free_mem -= memory
                free_cores -= cores
            for piece in shares:
                uid += 1
                state: AssignmentState = rng.choice(("allocated",) * 6 + ("bound", "reserved"))
                cluster.records.append(
                    record(
                        name,
                        f"uid-{uid:05d}",
                        piece,
                        state=state,
                        name=f"job-{uid}",
                        namespace=rng.choice(NAMESPACES),
                        decided_at=now - 3600 + uid,
                    )
                )
            used = total - free_mem
            unhealthy = n == 1 and i == gpus_per_node - 1
            gpus.append(
                gpu(
                    uuid,
                    i,
                    model=model,
                    total=total,
                    used=min(total, int(used * rng.uniform(0.5, 1.0))),
                    utilization=rng.randint(0, 99) if shares else 0,
                    health="unhealthy" if unhealthy else "healthy",
                    reason="XID 79: GPU has fallen off the bus" if unhealthy else "",
                )
            )
            if 0 < free_mem < total:
                frag[name] = frag.get(name, 0.0) + 1000 * free_mem / total * 0.4
        cluster.inventories.append(inventory(name, *gpus, observed_at=now))
        cluster.facts.append(facts(name, schedulable=n != 2))
    reasons = (
        ("insufficient GPU memory", nodes - 1),
        ("GPU model excluded", max(1, nodes // 3)),
        ("unhealthy GPU", 1),
    )
    for p in range(pending):
        cluster.rejections.append(
            rejection(
                f"pending-{p}",
                *reasons[: 1 + p % 3],
                name=f"llm-train-{p}",
                namespace=NAMESPACES[p % len(NAMESPACES)],
                decided_at=now - 600 + 60 * p,
                message=f"0/{nodes} nodes fit",
            )
        )
    capacity = 1000 * nodes * gpus_per_node
    fragmented = sum(frag.values())
    cluster.stats.append(
        ClusterStats(
            placer_id="placer-0",
            computed_at=now,
            profile="tessera",
            nodes=nodes,
            gpus=nodes * gpus_per_node,
            gpu_milli_capacity=capacity,
            gpu_milli_allocated=0,
            fragmented_milli=fragmented,
            fragmentation_pct=100 * fragmented / capacity if capacity else 0.0,
            node_fragmented_milli=frag,
        )
    )
    return cluster


async def write_cluster(bus: Bus, cluster: Cluster) -> None:
    """Put every KV value and publish every rejection, as the services would."""
    for inv in cluster.inventories:
        await put_inventory(bus, inv)
    for fact in cluster.facts:
        await put_facts(bus, fact)
    for value in cluster.records:
        await put_record(bus, value)
    for placer in cluster.stats:
        await bus.kv_put(
            subjects.KV_STATS, subjects.stats_key(placer.placer_id), codec.encode(placer)
        )
    for rejected in cluster.rejections:
        await bus.js_publish(subjects.PLACEMENTS_REJECTED, codec.encode(rejected))
