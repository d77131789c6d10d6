"""One replay: a task list through the placement core, with the paper's metrics after every task.

Every task is one ``decide`` + ``reserve`` on a ``ClusterIndex``: the simulator exercises the same
core the placer service runs. Per task it records the arrived GPU milli (failed tasks included),
the allocated GPU milli and the cluster's fragmentation under the typical task mix, and bins them
by ``round(100 * arrived / capacity)`` (half to even) into per-bucket curves.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from services.placer.core.cycle import decide
from services.placer.core.fragmentation import FragmentationModel, TypicalTask
from services.placer.core.framework import Profile
from services.placer.core.index import ClusterIndex
from services.placer.core.model import (
    ContainerRequest,
    Decision,
    GpuState,
    NodeState,
    PodRequest,
)
from services.placer.sim.trace import TraceNode, TraceTask

SIM_GPU_MEMORY_MIB = 16_000
"""Traces give GPU shares as fractions; each simulated GPU gets this much memory and a share of
``m`` milli asks for ``m`` thousandths of it and of the cores, so both dimensions agree."""


def node_state(node: TraceNode) -> NodeState:
    return NodeState(
        name=node.name,
        cpu_milli_total=node.cpu_milli,
        memory_mib_total=node.memory_mib,
        gpus=tuple(
            GpuState(
                index=i,
                uuid=f"{node.name}-gpu{i}",
                model=node.model,
                memory_total_mib=SIM_GPU_MEMORY_MIB,
            )
            for i in range(node.gpus)
        ),
    )


def pod_request(task: TraceTask, uid: str) -> PodRequest:
    fractional = task.gpu_count == 1 and task.gpu_milli < 1000
    container = ContainerRequest(
        name="main",
        shares=task.gpu_count,
        share_memory_mib=task.gpu_milli * SIM_GPU_MEMORY_MIB // 1000 if fractional else None,
        share_core_milli=task.gpu_milli if fractional else None,
        cpu_milli=task.cpu_milli,
        memory_mib=task.memory_mib,
    )
    return PodRequest(uid=uid, containers=(container,), gpu_models=task.models)


@dataclass
class Curves:
    """Per arrived-workload bucket (percent of capacity): sums and counts of the metrics."""

    alloc_sum: dict[int, float] = field(default_factory=dict)
    frag_sum: dict[int, float] = field(default_factory=dict)
    count: dict[int, int] = field(default_factory=dict)

    def add(self, bucket: int, alloc_pct: float, frag_pct: float) -> None:
        self.alloc_sum[bucket] = self.alloc_sum.get(bucket, 0.0) + alloc_pct
        self.frag_sum[bucket] = self.frag_sum.get(bucket, 0.0) + frag_pct
        self.count[bucket] = self.count.get(bucket, 0) + 1

    def _at(self, sums: dict[int, float], bucket: int) -> float | None:
        if self.count.get(bucket):
            return sums[bucket] / self.count[bucket]
        near = [b for b in (bucket - 1, bucket, bucket + 1) if self.count.get(b)]
        if not near:
            return None
        return sum(sums[b] for b in near) / sum(self.count[b] for b in near)

    def alloc_at(self, bucket: int) -> float | None:
        return self._at(self.alloc_sum, bucket)

    def frag_at(self, bucket: int) -> float | None:
        return self._at(self.frag_sum, bucket)

    def buckets(self) -> list[int]:
        return sorted(self.count)


@dataclass
class ReplayResult:
    policy: str
    seed: int
    tasks: int
    failed: int
    curves: Curves
    wall_s: float
    decisions_per_s: float


def replay(
    nodes: Sequence[TraceNode],
    tasks: Sequence[TraceTask],
    profile: Profile,
    *,
    order: Sequence[str],
    typical: Sequence[TypicalTask],
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay ``tasks`` in order on a fresh cluster of ``nodes`` with ``profile``."""
    states = [node_state(n) for n in nodes]
    cluster = ClusterIndex(states, order=order)
    capacity = 1000 * sum(n.gpus for n in nodes)
    metric = FragmentationModel(typical)
    frag: dict[str, float] = {}
    for state in states:
        shape = cluster.shape_of(state.name)
        frag[state.name] = metric.node(
            shape.models, shape.cpu_milli_free, shape.memory_mib_free, shape.free_milli
        )
    frag_total = sum(frag.values())
    rng = random.Random(seed * 104_729 + 3)
    arrived = 0
    allocated = 0
    failed = 0
    curves = Curves()
    started = time.perf_counter()
    decide_s = 0.0
    for i, task in enumerate(tasks):
        arrived += task.total_gpu_milli
        pod = pod_request(task, f"task-{i}")
        t0 = time.perf_counter()
        outcome = decide(pod, cluster, profile, now=float(i), rng=rng)
        decide_s += time.perf_counter() - t0
        if isinstance(outcome, Decision):
            problem = cluster.reserve(outcome.reservation)
            if problem is not None:  # the core chose something the ledger refuses: a bug
                raise AssertionError(f"task {task.name}: ledger refused the decision: {problem}")
            allocated += task.total_gpu_milli
            name = outcome.node
            shape = cluster.shape_of(name)
            new = metric.node(
                shape.models, shape.cpu_milli_free, shape.memory_mib_free, shape.free_milli
            )
            frag_total += new - frag[name]
            frag[name] = new
        else:
            failed += 1
        curves.add(
            round(100 * arrived / capacity), 100 * allocated / capacity, 100 * frag_total / capacity
        )
        if progress is not None:
            progress(i + 1)
    wall = time.perf_counter() - started
    return ReplayResult(
        policy=profile.name,
        seed=seed,
        tasks=len(tasks),
        failed=failed,
        curves=curves,
        wall_s=wall,
        decisions_per_s=len(tasks) / decide_s if decide_s else 0.0,
    )
