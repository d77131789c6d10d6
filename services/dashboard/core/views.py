"""What the page and the JSON API show, rendered from a :class:`~.state.State` at a given time.

Every view is a frozen Struct encoded as JSON as it is: ``/api/v1/cluster`` is a
:class:`ClusterView`, ``/api/v1/pods/pending`` a :class:`PendingView`, and the page's live updates
carry the same node views. Pure functions; ``now`` is passed in (staleness and ages depend on it).

Accounting (per GPU, then summed): a GPU's allocated memory and cores are the sums of the slices of
records that hold it (every state but ``released``); free = capacity - allocated on healthy GPUs;
what is not allocated on an unhealthy or vanished GPU is *unavailable*, not free. A GPU whose slices
add up to more than it has is flagged over-committed (it must never happen; the page shows it).
Slices that name a GPU the node's inventory does not list are shown on a GPU row of their own and
left out of the capacity totals.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

import msgspec

from services.dashboard.core.state import (
    INVALID,
    NOT_DECIDED,
    PendingKind,
    PendingPod,
    State,
    freshest_stats,
    live_records,
    node_names,
)
from shared.messages.assignments import AssignmentState, holds_gpus
from shared.messages.inventory import GpuTelemetry
from shared.messages.placement import RejectionReason
from shared.messages.stats import TenantUsage

FULL_CORES = 100


class ViewPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When shown data counts as stale."""

    inventory_stale_s: float = 60.0
    stats_stale_s: float = 120.0


class SliceView(msgspec.Struct, frozen=True, kw_only=True):
    """One container's share of one GPU."""

    pod_uid: str
    namespace: str
    name: str
    container: str
    memory_mib: int
    cores: int
    state: AssignmentState
    decided_at: float


class GpuView(msgspec.Struct, frozen=True, kw_only=True):
    """One physical GPU: what the inventory says about it and the slices booked on it."""

    uuid: str
    index: int
    model: str
    listed: bool
    """False for a GPU that records name but the node's inventory does not list."""
    health: str
    """``healthy``, ``unhealthy``, ``gone`` (from the inventory) or ``unknown`` (not listed)."""
    health_reason: str
    memory_total_mib: int
    memory_used_mib: int
    """Live reading from the inventory (what processes hold now)."""
    utilization_pct: int
    temperature_c: int
    power_w: float
    allocated_memory_mib: int
    allocated_cores: int
    free_memory_mib: int
    free_cores: int
    overcommitted: bool
    slices: tuple[SliceView, ...]
    utilization_history: tuple[tuple[float, int], ...] = ()
    """(observed_at, utilisation %) of the last minutes, oldest first."""


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """One node: readiness, problems an operator should see, and every GPU with its slices."""

    name: str
    ready: bool | None
    """None until node facts arrive."""
    schedulable: bool | None
    problems: tuple[str, ...]
    inventory_observed_at: float | None
    inventory_stale: bool
    backend: str
    driver_version: str
    cpu_allocatable_milli: int
    cpu_requested_milli: int
    memory_allocatable_mib: int
    memory_requested_mib: int
    fragmented_milli: float | None
    """``F_n`` from the freshest placer statistics; None when no placer published any."""
    gpus: tuple[GpuView, ...]


class Totals(msgspec.Struct, frozen=True, kw_only=True):
    """Cluster-wide sums over the node views."""

    nodes: int
    nodes_ready: int
    gpus: int
    gpus_healthy: int
    gpus_unhealthy: int
    gpus_overcommitted: int
    gpu_memory_total_mib: int
    gpu_memory_allocated_mib: int
    gpu_memory_free_mib: int
    gpu_memory_unavailable_mib: int
    gpu_memory_used_mib: int
    gpu_cores_total: int
    gpu_cores_allocated: int
    gpu_cores_free: int
    gpu_cores_unavailable: int
    pods_reserved: int
    pods_bound: int
    pods_allocated: int
    """Pods holding GPU slices, by hand-off state."""
    pods_without_gpus: int
    """Pods Tessera placed that hold no GPU (CPU only): no device plugin allocates them, so they
    are never counted as waiting for an allocation."""
    pods_pending: int
    stray_slices: int
    """Slices on GPUs missing from their node's inventory."""


class FragmentationView(msgspec.Struct, frozen=True, kw_only=True):
    """Fragmentation as the placer measures it, or ``available: false`` ("n/a")."""

    available: bool
    fragmentation_pct: float | None = None
    fragmented_milli: float | None = None
    gpu_milli_capacity: int | None = None
    gpu_milli_allocated: int | None = None
    placer_id: str = ""
    profile: str = ""
    computed_at: float | None = None
    age_s: float | None = None
    stale: bool = False
    queued_pods: int | None = None
    """Pods in that placer's queue."""


class ClusterView(msgspec.Struct, frozen=True, kw_only=True):
    """``/api/v1/cluster``."""

    generated_at: float
    totals: Totals
    fragmentation: FragmentationView
    nodes: tuple[NodeView, ...]
    tenants: tuple[TenantUsage, ...] = ()
    """Per tenant: what it holds and its quota, from the freshest placer statistics."""


class RunningPodView(msgspec.Struct, frozen=True, kw_only=True):
    """A pod Tessera placed (its record is not released): where, what it holds, how far."""

    pod_uid: str
    namespace: str
    name: str
    node: str
    state: AssignmentState
    gpus: int
    """GPU shares (slices) it holds."""
    gpu_memory_mib: int
    gpu_cores: int
    """Percent of a GPU's SMs, summed over its shares."""
    decided_at: float


class RunningView(msgspec.Struct, frozen=True, kw_only=True):
    """``/api/v1/pods/running``: one page of the placed pods matching a filter."""

    generated_at: float
    count: int
    """Pods matching the filter (all pages)."""
    offset: int
    pods: tuple[RunningPodView, ...]


class PendingPodView(msgspec.Struct, frozen=True, kw_only=True):
    """One Pending pod with the counted reasons of its latest rejection."""

    pod_uid: str
    namespace: str
    name: str
    reasons: tuple[RejectionReason, ...]
    message: str
    unresolvable: bool
    placer_id: str
    first_rejected_at: float
    last_rejected_at: float
    rejections: int
    waiting_s: float
    kind: PendingKind = "rejected"
    """``rejected`` by a placer, ``queued`` (not decided yet), ``invalid`` (as written)."""


class ReasonCount(msgspec.Struct, frozen=True, kw_only=True):
    """How many Pending pods give ``reason`` among their rejection reasons."""

    reason: str
    pods: int


class PendingView(msgspec.Struct, frozen=True, kw_only=True):
    """``/api/v1/pods/pending``: oldest first."""

    generated_at: float
    count: int
    reasons: tuple[ReasonCount, ...]
    pods: tuple[PendingPodView, ...]


# --- rendering ------------------------------------------------------------------------------

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that puts ``node-2`` before ``node-10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in _DIGITS.split(name) if part
    )


def duration(seconds: float) -> str:
    """A short human duration: ``45 s``, ``12 min``, ``3 h``, ``2 d``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def sorted_nodes(state: State) -> list[str]:
    """Every shown node, in natural name order."""
    return sorted(node_names(state), key=natural_key)


def inventory_stale(state: State, node: str, *, now: float, policy: ViewPolicy) -> bool:
    """True when the node's latest inventory is older than the policy allows."""
    inventory = state.inventory.get(node)
    return inventory is not None and now - inventory.observed_at > policy.inventory_stale_s


def _gpu_view(
    gpu: GpuTelemetry | None,
    uuid: str,
    index: int,
    slices: list[SliceView],
    history: tuple[tuple[float, int], ...] = (),
) -> GpuView:
    """The view of a listed GPU, or of one only records name (``gpu`` None: no capacity)."""
    allocated_memory = sum(s.memory_mib for s in slices)
    allocated_cores = sum(s.cores for s in slices)
    total = gpu.memory_total_mib if gpu else 0
    usable = gpu is not None and gpu.health == "healthy"
    return GpuView(
        uuid=uuid,
        index=index,
        model=gpu.model if gpu else "",
        listed=gpu is not None,
        health=gpu.health if gpu else "unknown",
        health_reason=gpu.health_reason if gpu else "not in the node's inventory",
        memory_total_mib=total,
        memory_used_mib=gpu.memory_used_mib if gpu else 0,
        utilization_pct=gpu.utilization_pct if gpu else 0,
        temperature_c=gpu.temperature_c if gpu else 0,
        power_w=gpu.power_w if gpu else 0.0,
        allocated_memory_mib=allocated_memory,
        allocated_cores=allocated_cores,
        free_memory_mib=max(0, total - allocated_memory) if usable else 0,
        free_cores=max(0, FULL_CORES - allocated_cores) if usable else 0,
        overcommitted=gpu is not None
        and (allocated_memory > total or allocated_cores > FULL_CORES),
        slices=tuple(
            sorted(slices, key=lambda s: (s.decided_at, s.namespace, s.name, s.container))
        ),
        utilization_history=history if gpu is not None else (),
    )


def node_view(state: State, node: str, *, now: float, policy: ViewPolicy) -> NodeView:
    """The view of ``node`` (which may be known only from its records)."""
    inventory = state.inventory.get(node)
    facts = state.facts.get(node)
    listed = {gpu.uuid: gpu for gpu in inventory.gpus} if inventory else {}
    slices: dict[str, list[SliceView]] = {uuid: [] for uuid in listed}
    stray_index: dict[str, int] = {}
    for record in live_records(state, node):
        for container in record.containers:
            for share in container.gpus:
                if share.uuid not in listed:
                    stray_index.setdefault(share.uuid, share.index)
                slices.setdefault(share.uuid, []).append(
                    SliceView(
                        pod_uid=record.pod_uid,
                        namespace=record.namespace,
                        name=record.name,
                        container=container.container,
                        memory_mib=share.memory_mib,
                        cores=share.cores,
                        state=record.state,
                        decided_at=record.decided_at,
                    )
                )
    gpus = [
        _gpu_view(gpu, gpu.uuid, gpu.index, slices[gpu.uuid], state.utilization.get(gpu.uuid, ()))
        for gpu in listed.values()
    ]
    gpus.sort(key=lambda g: (g.index, g.uuid))
    strays = sorted(stray_index.items(), key=lambda item: (item[1], item[0]))
    gpus.extend(_gpu_view(None, uuid, index, slices[uuid]) for uuid, index in strays)

    stale = inventory_stale(state, node, now=now, policy=policy)
    problems: list[str] = []
    if facts is None:
        problems.append("no node facts yet")
    else:
        if not facts.ready:
            problems.append("not ready")
        if not facts.schedulable:
            problems.append("cordoned")
    if inventory is None:
        problems.append("no GPU inventory")
    elif stale:
        # Not the age itself: a view must not change with every second (the page caches views
        # by version and staleness); ``inventory_observed_at`` gives the age.
        problems.append(f"inventory older than {duration(policy.inventory_stale_s)}")
    unhealthy = [g for g in gpus if g.listed and g.health != "healthy"]
    if unhealthy:
        problems.append(f"{len(unhealthy)} unhealthy GPU{'s' if len(unhealthy) > 1 else ''}")
    over = [g for g in gpus if g.overcommitted]
    if over:
        problems.append("over-committed GPU " + ", ".join(str(g.index) for g in over))
    if strays:
        problems.append(f"slices on {len(strays)} GPU(s) missing from the inventory")

    stats = freshest_stats(state)
    return NodeView(
        name=node,
        ready=facts.ready if facts else None,
        schedulable=facts.schedulable if facts else None,
        problems=tuple(problems),
        inventory_observed_at=inventory.observed_at if inventory else None,
        inventory_stale=stale,
        backend=inventory.backend if inventory else "",
        driver_version=inventory.driver_version if inventory else "",
        cpu_allocatable_milli=facts.cpu_allocatable_milli if facts else 0,
        cpu_requested_milli=facts.cpu_requested_milli if facts else 0,
        memory_allocatable_mib=facts.memory_allocatable_mib if facts else 0,
        memory_requested_mib=facts.memory_requested_mib if facts else 0,
        fragmented_milli=stats.node_fragmented_milli.get(node) if stats else None,
        gpus=tuple(gpus),
    )


def totals(state: State, nodes: Iterable[NodeView]) -> Totals:
    """Cluster totals over ``nodes`` (the views of every shown node)."""
    sums: Counter[str] = Counter()
    for node in nodes:
        sums["nodes"] += 1
        sums["nodes_ready"] += bool(node.ready)
        for gpu in node.gpus:
            if not gpu.listed:
                sums["stray"] += len(gpu.slices)
                continue
            healthy = gpu.health == "healthy"
            sums["gpus"] += 1
            sums["healthy"] += healthy
            sums["overcommitted"] += gpu.overcommitted
            sums["mem_total"] += gpu.memory_total_mib
            sums["mem_alloc"] += gpu.allocated_memory_mib
            sums["mem_free"] += gpu.free_memory_mib
            sums["mem_used"] += gpu.memory_used_mib
            sums["cores_alloc"] += gpu.allocated_cores
            sums["cores_free"] += gpu.free_cores
            if not healthy:
                sums["mem_unavailable"] += max(0, gpu.memory_total_mib - gpu.allocated_memory_mib)
                sums["cores_unavailable"] += max(0, FULL_CORES - gpu.allocated_cores)
    pods: Counter[str] = Counter(
        record.state if holds_gpus(record) else "without_gpus"
        for node in state.records
        for record in live_records(state, node)
    )
    # Placed pods with no record yet are only in the ledger, which the dashboard does not
    # follow (a message per placement): the placers count them in their statistics.
    stats = freshest_stats(state)
    pods["reserved"] += stats.pods_reserved if stats else 0
    return Totals(
        nodes=sums["nodes"],
        nodes_ready=sums["nodes_ready"],
        gpus=sums["gpus"],
        gpus_healthy=sums["healthy"],
        gpus_unhealthy=sums["gpus"] - sums["healthy"],
        gpus_overcommitted=sums["overcommitted"],
        gpu_memory_total_mib=sums["mem_total"],
        gpu_memory_allocated_mib=sums["mem_alloc"],
        gpu_memory_free_mib=sums["mem_free"],
        gpu_memory_unavailable_mib=sums["mem_unavailable"],
        gpu_memory_used_mib=sums["mem_used"],
        gpu_cores_total=FULL_CORES * sums["gpus"],
        gpu_cores_allocated=sums["cores_alloc"],
        gpu_cores_free=sums["cores_free"],
        gpu_cores_unavailable=sums["cores_unavailable"],
        pods_reserved=pods["reserved"],
        pods_bound=pods["bound"],
        pods_allocated=pods["allocated"],
        pods_without_gpus=pods["without_gpus"],
        pods_pending=len(state.pending),
        stray_slices=sums["stray"],
    )


def fragmentation_view(state: State, *, now: float, policy: ViewPolicy) -> FragmentationView:
    """The freshest placer statistics, or ``available: false`` when no placer published any."""
    stats = freshest_stats(state)
    if stats is None:
        return FragmentationView(available=False)
    age = max(0.0, now - stats.computed_at)
    return FragmentationView(
        available=True,
        fragmentation_pct=stats.fragmentation_pct,
        fragmented_milli=stats.fragmented_milli,
        gpu_milli_capacity=stats.gpu_milli_capacity,
        gpu_milli_allocated=stats.gpu_milli_allocated,
        placer_id=stats.placer_id,
        profile=stats.profile,
        computed_at=stats.computed_at,
        age_s=age,
        stale=age > policy.stats_stale_s,
        queued_pods=stats.pending_pods,
    )


def cluster_view(state: State, *, now: float, policy: ViewPolicy) -> ClusterView:
    """``/api/v1/cluster``: totals, fragmentation and every node in natural name order."""
    nodes = tuple(node_view(state, n, now=now, policy=policy) for n in sorted_nodes(state))
    return ClusterView(
        generated_at=now,
        totals=totals(state, nodes),
        fragmentation=fragmentation_view(state, now=now, policy=policy),
        nodes=nodes,
        tenants=tenants_view(state),
    )


def tenants_view(state: State) -> tuple[TenantUsage, ...]:
    """What each tenant holds and may hold, as the freshest placer statistics say."""
    stats = freshest_stats(state)
    return stats.tenants if stats is not None else ()


def running_view(
    state: State, *, now: float, offset: int = 0, limit: int = 50, match: str = ""
) -> RunningView:
    """``/api/v1/pods/running``: placed pods (records not released) whose ``namespace/name`` or
    node contains ``match`` (case-insensitive), by namespace and name, ``limit`` from ``offset``."""
    wanted = match.strip().lower()
    found = []
    for node in state.records:
        for record in live_records(state, node):
            if wanted and wanted not in f"{record.namespace}/{record.name} {node}".lower():
                continue
            shares = [share for c in record.containers for share in c.gpus]
            found.append(
                RunningPodView(
                    pod_uid=record.pod_uid,
                    namespace=record.namespace,
                    name=record.name,
                    node=record.node,
                    state=record.state,
                    gpus=len(shares),
                    gpu_memory_mib=sum(share.memory_mib for share in shares),
                    gpu_cores=sum(share.cores for share in shares),
                    decided_at=record.decided_at,
                )
            )
    found.sort(key=lambda p: (p.namespace, p.name, p.pod_uid))
    return RunningView(
        generated_at=now,
        count=len(found),
        offset=offset,
        pods=tuple(found[offset : offset + limit]),
    )


def pending_reasons(entry: PendingPod) -> set[str]:
    """The reasons a Pending pod counts under: its rejection's, or what it waits for."""
    if entry.kind == "queued":
        return {NOT_DECIDED}
    if entry.kind == "invalid":
        return {INVALID}
    return {r.reason for r in entry.rejection.reasons}


def pending_view(state: State, *, now: float, limit: int | None = None) -> PendingView:
    """``/api/v1/pods/pending``: every Pending pod, oldest first, at most ``limit`` of them.

    ``count`` and ``reasons`` always cover every Pending pod, whatever the limit.
    """
    entries = sorted(
        state.pending.values(),
        key=lambda p: (p.first_rejected_at, p.rejection.namespace, p.rejection.name),
    )
    reasons: Counter[str] = Counter()
    for entry in entries:
        reasons.update(pending_reasons(entry))
    shown = entries if limit is None else entries[:limit]
    return PendingView(
        generated_at=now,
        count=len(entries),
        reasons=tuple(
            ReasonCount(reason=reason, pods=pods)
            for reason, pods in sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
        ),
        pods=tuple(
            PendingPodView(
                pod_uid=p.rejection.pod_uid,
                namespace=p.rejection.namespace,
                name=p.rejection.name,
                reasons=p.rejection.reasons,
                message=p.rejection.message,
                unresolvable=p.rejection.unresolvable,
                placer_id=p.rejection.placer_id,
                first_rejected_at=p.first_rejected_at,
                last_rejected_at=p.rejection.decided_at,
                rejections=p.rejections,
                waiting_s=max(0.0, now - p.first_rejected_at),
                kind=p.kind,
            )
            for p in shown
        ),
    )
