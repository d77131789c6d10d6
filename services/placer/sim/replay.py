"""One replay: a task list through the placer's path, with the paper's metrics after every task.

Every task goes the way a pod goes through the placer service: admitted to the queue in seed
002's order (``core/queue.py``), decided by the placement cycle (``core/cycle.py``: validation,
the tenancy's groups, permissions and quota, the profile's filters, scores and GPU choice) and
booked in the ledger and its tenant's usage (``Tenancy.reserve``). Only what the service needs
NATS for is left out (commits by compare-and-set between replicas).

- **Arrivals.** Tasks arrive in list order, ``burst`` at a time, and each burst is placed in the
  queue's order (priority, then larger pods first, then arrival); one at a time (the default) is
  list order, as in the FGD methodology.
- **No departures.** A trace replay only adds pods, so a pod that does not fit when it is tried
  never fits later: it would wait for ever, and counts as failed (as in the FGD methodology).
- **Task mix.** ``mix="trace"``: FGD and the tessera profile score with the typical task mix of the
  whole trace, known in advance (as the FGD artifact does). ``mix="online"``: with the mix the
  service learns from what it placed (``mix.py``: a window of the newest placed pods blended with
  a prior), the profile compiled again whenever that mix moved, checked every
  :data:`MIX_CHECK_TASKS` tasks (the service checks every few seconds). The fragmentation metric
  always measures with the trace's mix.
- **Tenancy.** With a tenancy config, groups, permissions and quotas apply as in the service;
  a task's tenant is ``TraceTask.tenant``, and each node carries the label
  :data:`MODEL_LABEL` with its GPU model, for groups that select nodes by label.

Per task it records the arrived GPU milli (failed tasks included), the allocated GPU milli and the
cluster's fragmentation under the typical task mix, and bins them by
``round(100 * arrived / capacity)`` (half to even) into per-bucket curves; at the end, each
tenant's pods placed and waiting and what it holds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from services.placer.core import cycle
from services.placer.core.fragmentation import FragmentationModel, TypicalTask, host_kinds
from services.placer.core.groups import TenancyConfig
from services.placer.core.index import ClusterIndex
from services.placer.core.model import (
    ClusterSnapshot,
    ContainerRequest,
    Decision,
    GpuState,
    NodeState,
    PodRequest,
    Rejection,
)
from services.placer.core.profiles import ProfileSpec, build_profile
from services.placer.core.queue import PlacementQueue, reference_node
from services.placer.core.tenancy import Tenancy
from services.placer.rules import mix as task_mix
from services.placer.rules.poolplan import pool_of
from services.placer.sim.trace import TraceNode, TraceTask

SIM_GPU_MEMORY_MIB = 16_000
"""Traces give GPU shares as fractions; each simulated GPU gets this much memory and a share of
``m`` milli asks for ``m`` thousandths of it and of the cores, so both dimensions agree."""
MODEL_LABEL = "nvidia.com/gpu.product"
"""The node label carrying a simulated node's GPU model (as NVIDIA's GPU feature discovery sets)."""
MIX_CHECK_TASKS = 100
"""With ``mix="online"``, how many tasks apart the learned mix is compared with the profile's."""

Mix = Literal["trace", "online"]


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
    return PodRequest(
        uid=uid,
        namespace=task.tenant,
        containers=(container,),
        gpu_models=task.models,
        tenant=task.tenant,
    )


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
class TenantResult:
    """One tenant at the end of a replay."""

    placed: int = 0
    waiting: int = 0
    """Pods that never fitted (for want of room, quota or a group with room)."""
    gpu_milli: int = 0
    """GPU milli of its placed pods (the paper's measure)."""
    gpus: int = 0
    """GPU shares it holds (what a quota's ``gpus`` counts)."""
    gpu_memory_mib: int = 0


@dataclass
class ReplayResult:
    policy: str
    seed: int
    tasks: int
    failed: int
    curves: Curves
    wall_s: float
    decisions_per_s: float
    tenants: dict[str, TenantResult] = field(default_factory=dict)
    profile_builds: int = 1


def replay(
    nodes: Sequence[TraceNode],
    tasks: Sequence[TraceTask],
    policy: ProfileSpec | str,
    *,
    order: Sequence[str],
    typical: Sequence[TypicalTask],
    seed: int,
    mix: Mix = "trace",
    tenancy: TenancyConfig | None = None,
    burst: int = 1,
    pools: int = 1,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay ``tasks`` on a fresh cluster of ``nodes`` with ``policy`` (module docstring).

    ``pools`` above 1: each task is decided as a placer replica holding one node pool
    (``services/placer/rules/poolplan.py``) decides it: on the nodes of the pool of the replica
    that took
    it (a draw), and on every node when none of those fits."""
    states = [node_state(n) for n in nodes]
    names = frozenset(n.name for n in nodes)
    outside = [
        names - {name for name in names if pool_of(name, pools) == pool} for pool in range(pools)
    ]
    takers = random.Random(seed * 7_919 + 11)  # apart from ``rng``: policies draw the same
    cluster = ClusterIndex(states, order=order)
    tenants = Tenancy()
    tenants.configure(
        tenancy or TenancyConfig(),
        cluster,
        node_labels={n.name: {MODEL_LABEL: n.model} for n in nodes},
    )
    hosts = host_kinds(states)
    learned = task_mix.TaskMix(window=task_mix.WINDOW)
    mixed = tuple(typical) if mix == "trace" else learned.typical()
    profile = build_profile(policy, typical_tasks=mixed, hosts=hosts, **tenants.plugins())
    builds = 1
    queue = PlacementQueue(reference=reference_node(ClusterSnapshot(nodes=tuple(states))))
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
    results: dict[str, TenantResult] = {}
    curves = Curves()
    started = time.perf_counter()
    decide_s = 0.0
    done = 0
    for start in range(0, len(tasks), burst):
        pending: dict[str, tuple[int, TraceTask]] = {}
        for i in range(start, min(start + burst, len(tasks))):
            task = tasks[i]
            arrived += task.total_gpu_milli
            request = pod_request(task, f"task-{i}")
            pending[request.uid] = (i, task)
            queued = queue.push(request, created_at=float(i))
            if isinstance(queued, Rejection):  # load_tasks checked every task
                raise AssertionError(f"task {task.name}: {queued.message}")
        while (entry := queue.pop()) is not None:
            i, task = pending.pop(entry.uid)
            tenant = results.setdefault(task.tenant, TenantResult())
            t0 = time.perf_counter()
            if pools > 1:
                avoid = outside[takers.randrange(pools)]
                outcome = cycle.decide(
                    entry.request, cluster, profile, tenants, now=float(i), rng=rng, avoid=avoid
                )
                if not isinstance(outcome, Decision):
                    outcome = cycle.decide(
                        entry.request, cluster, profile, tenants, now=float(i), rng=rng
                    )
            else:
                outcome = cycle.decide(
                    entry.request, cluster, profile, tenants, now=float(i), rng=rng
                )
            decide_s += time.perf_counter() - t0
            if isinstance(outcome, Decision):
                problem = tenants.reserve(entry.request, outcome, cluster)
                if problem is not None:  # the cycle chose what the ledger refuses: a bug
                    raise AssertionError(f"task {task.name}: reserving the decision: {problem}")
                allocated += task.total_gpu_milli
                tenant.placed += 1
                tenant.gpu_milli += task.total_gpu_milli
                name = outcome.node
                shape = cluster.shape_of(name)
                new = metric.node(
                    shape.models, shape.cpu_milli_free, shape.memory_mib_free, shape.free_milli
                )
                frag_total += new - frag[name]
                frag[name] = new
                if mix == "online":
                    spec = task_mix.task_spec(outcome.reservation, _sim_gpu_memory)
                    learned.observe(entry.uid, spec, float(i))
            else:
                failed += 1
                tenant.waiting += 1
            curves.add(
                round(100 * arrived / capacity),
                100 * allocated / capacity,
                100 * frag_total / capacity,
            )
            done += 1
            if mix == "online" and done % MIX_CHECK_TASKS == 0:
                now_mixed = learned.typical()
                if now_mixed != mixed:
                    cluster.memos.pop(profile, None)  # of no use any more
                    for stale in profile.node_policies.values():
                        cluster.memos.pop(stale, None)
                    mixed = now_mixed
                    profile = build_profile(
                        policy, typical_tasks=mixed, hosts=hosts, **tenants.plugins()
                    )
                    builds += 1
            if progress is not None:
                progress(done)
    wall = time.perf_counter() - started
    for name, used in tenants.usage.tenants().items():
        held = results.setdefault(name, TenantResult())
        held.gpus, held.gpu_memory_mib = used.gpus, used.gpu_memory_mib
    return ReplayResult(
        policy=profile.name,
        seed=seed,
        tasks=len(tasks),
        failed=failed,
        curves=curves,
        wall_s=wall,
        decisions_per_s=len(tasks) / decide_s if decide_s else 0.0,
        tenants=results,
        profile_builds=builds,
    )


def _sim_gpu_memory(node: str, index: int) -> int:
    return SIM_GPU_MEMORY_MIB
