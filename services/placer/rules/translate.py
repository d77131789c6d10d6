"""Wire messages to the placement core's values and back (pure: no I/O, time passed in).

In: ``PodPending`` -> :class:`PodRequest`; a node's ``NodeInventory`` + ``NodeFacts`` + ledger
bookings -> :class:`NodeState`. Out: a core :class:`Decision` -> :class:`Booking` (what the ledger
holds); a core :class:`Rejection` -> ``PlacementRejected``.

Rules the node translation applies (docs/design.md §3 and §5, issue 10 item 7):

- **Placeable or not.** A node is placed on only when it has node facts (else "no node facts yet"),
  is ready and not cordoned, and its GPU inventory is fresh: an inventory older than
  ``inventory_stale_s`` means its heartbeat was missed ("GPU inventory stale"). A node without an
  inventory is a node without GPUs (it can still take pods that ask for none). A node that is not
  placeable stays in the index as unschedulable, and :func:`refine_reasons` puts these reasons in
  place of the core's generic "node unschedulable" count.
- **Foreign memory.** Memory the GPU reports in use beyond what Tessera reserved on it is held by
  processes Tessera did not place, and is not free: ``foreign = used - reserved`` (at least 0),
  rounded *up* to ``gpustates.FOREIGN_STEP_MIB``, so a GPU's free memory is never more than what it
  reports free. (Tessera pods that have not yet touched their reservation make this an
  underestimate; their reservation is still counted in full.)
- **Health.** A GPU the inventory reports ``unhealthy`` or ``gone`` takes no new work; what is
  booked on it stays booked until released.
- **Logical devices.** When the binder reports the node's ``tessera.dev/gpu`` allocatable (what
  the device plugin advertised through the kubelet), each GPU's slot limit is that total split
  over the GPUs in proportion to their memory (largest remainder), which is how the device
  plugin's logical mode splits them; shares booked on a GPU never exceed its slots.
- **Memory units.** When the binder reports the node's ``tessera.dev/gpu-memory`` allocatable
  (the device plugin's memory-units mode: one device per unit of memory), the kubelet hands a
  container one device per MiB its limit asks for, so a GPU can hold at most its share of those
  devices (split as above) in MiB: with a unit of 1 MiB that is all of its memory, with a unit
  of N MiB (chosen for a node too large for 1 MiB devices) 1/N of it. Each GPU's memory is
  taken as that much, so no pod is bound that the kubelet would refuse.
- **Which containers a memory-units node can serve.** Its kubelet calls the device plugin only
  for ``tessera.dev/gpu-memory``, so a pod with a GPU container that does not ask for it (whole
  GPUs, or a slice given as a percentage or cores only) is never placed there
  (:func:`needs_gpu_devices`, :data:`MEMORY_UNITS_ONLY`; ``decider.py`` keeps such nodes out).
- **CPU and memory.** ``NodeFacts`` counts the requests of every non-terminated pod on the node
  and, apart, the part of it held by Tessera's pods. The node's reservation is the requests of
  the other pods (the difference) plus every Tessera booking, so a Tessera pod is counted once
  whether the binder has seen it bound yet or not.
- **Labels, taints, pods.** A node's labels and taints come from its facts; its pods are the
  facts' pods (those Tessera did not place) and its bookings (those it did, with their labels
  and pod affinity), which is what node-aware rules read (``core/nodeaware.py``).
- **Live readings.** GPU utilisation is rounded to ``gpustates.UTILIZATION_STEP_PCT`` (it only
  orders GPUs; finer readings would make every node a shape of its own and defeat the shape
  memo).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from services.placer.core.facts import pod_facts
from services.placer.core.model import (
    GPU_MILLI,
    ContainerPlacement,
    ContainerRequest,
    GpuSlice,
    NodeState,
    PodOnNode,
    PodRequest,
    Rejection,
    RejectionReason,
    Reservation,
)
from services.placer.rules.gpustates import GpuMemo, gpu_states
from shared import annotations as names
from shared.commits import record_of
from shared.dra.claims import ClaimPlan, claim_of_container, plan_claims
from shared.dra.devices import DEFAULT_POLICY, DRA_API, NODE_API_LABEL
from shared.messages.assignments import AssignmentRecord, settled
from shared.messages.constraints import Constraints
from shared.messages.inventory import NodeInventory
from shared.messages.ledger import BookedContainer, BookedSlice, Booking
from shared.messages.nodes import ClaimedGpu, NodeFacts
from shared.messages.placement import PlacementRejected
from shared.messages.placement import RejectionReason as WireReason
from shared.messages.pods import PodPending, PodRestore

GPU_RESOURCE = names.GPU
GPU_MEMORY_RESOURCE = names.GPU_MEMORY
HOSTNAME_LABEL = "kubernetes.io/hostname"

MEMORY_UNITS_ONLY = "memory-units mode (ask tessera.dev/gpu-memory to run there)"
"""Why a memory-units node cannot take a GPU container that asks no ``tessera.dev/gpu-memory``."""

NO_FACTS = "no node facts yet"
NOT_READY = "node not ready"
CORDONED = "node cordoned"
STALE = "GPU inventory stale (heartbeat missed)"
UNSCHEDULABLE = "node unschedulable"
"""The core's reason for a node that is not schedulable (``plugins/fit.py``)."""


# --- pods ------------------------------------------------------------------------------------


def pod_request(pod: PodPending) -> PodRequest:
    """The core's view of a pending pod (hints were validated by the binder at its edge).

    Its tenant is its namespace and the ``tessera.dev/tenant`` label only a request: the
    tenancy applies the operator's file to both at every decision (``Tenancy.resolve``).
    """
    hints = pod.hints
    claimed, constraints, selectors = _claims(pod)
    return PodRequest(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        containers=tuple(
            ContainerRequest(
                name=c.name,
                shares=c.gpu_shares,
                share_memory_mib=c.gpu_memory_mib,
                share_memory_pct=c.gpu_memory_pct,
                share_core_milli=None if c.gpu_cores is None else c.gpu_cores * GPU_MILLI // 100,
                cpu_milli=c.cpu_milli,
                memory_mib=c.memory_mib,
            )
            for c in pod.containers
        )
        + claimed,
        gpu_models=hints.gpu_models,
        gpu_models_excluded=hints.gpu_models_excluded,
        gpu_type=hints.gpu_type,
        gpu_policy=hints.gpu_policy,
        node_policy=hints.node_policy,
        group=hints.group,
        tenant=pod.namespace,
        tenant_label=hints.tenant,
        priority=pod.priority,
        labels=tuple(sorted(pod.labels.items())),
        constraints=constraints,
        gpu_selectors=selectors,
    )


def _claims(
    pod: PodPending,
) -> tuple[tuple[ContainerRequest, ...], Constraints | None, tuple[str, ...]]:
    """The containers of the pod's ``gpu.tessera.dev`` claims' asks, and its constraints with
    the nodes they may go to: DRA nodes (``tessera.dev/gpu-api=dra``), and the node of a claim
    allocated already (one it shares). The binder refused the pod if its claims cannot be
    honoured; the placer takes them as they come then, asking nothing it cannot read. The
    selectors: every ask's (each GPU of the pod satisfies them all)."""
    if not pod.claims:
        return (), pod.constraints, ()
    plan = plan_claims(pod.claims, policy=DEFAULT_POLICY)
    if isinstance(plan, tuple) or not plan.claims:
        return (), pod.constraints, ()
    wanted = [(NODE_API_LABEL, DRA_API)]
    if plan.node:
        wanted.append((HOSTNAME_LABEL, plan.node))
    constraints = pod.constraints or Constraints()
    selector = tuple(sorted({*constraints.node_selector, *wanted}))
    # In order (a class's before a request's), as Kubernetes runs them: the first false or
    # erring one ends a GPU's judgement.
    selectors = tuple(dict.fromkeys(s for ask in plan.asks for s in ask.selectors))
    return (
        claim_containers(plan),
        msgspec.structs.replace(constraints, node_selector=selector),
        selectors,
    )


def claim_containers(plan: ClaimPlan) -> tuple[ContainerRequest, ...]:
    """The asks of a pod's ``gpu.tessera.dev`` claims as the core's containers: ``count``
    shares, each on a distinct GPU, of the rounded memory and compute, or whole GPUs
    (docs/design.md §14). A memory left out is all of the GPU's, as DRA's default for it is."""
    return tuple(
        ContainerRequest(
            name=ask.container,
            shares=ask.count,
            share_memory_mib=ask.memory_mib,
            share_memory_pct=100 if ask.memory_mib is None and not ask.whole else None,
            share_core_milli=None if ask.compute is None else ask.compute * GPU_MILLI // 100,
        )
        for ask in plan.asks
    )


def needs_gpu_devices(pod: PodRequest) -> bool:
    """Whether a container holds GPU shares without asking ``tessera.dev/gpu-memory``: a node in
    memory-units mode advertises only that resource, and its kubelet asks the device plugin for
    a container's GPUs only for it, so such a container would run there without its GPUs (the
    kubelet ignores extended resources its node does not advertise)."""
    return any(c.shares and c.share_memory_mib is None for c in pod.containers)


def memory_units_only(facts: NodeFacts | None) -> bool:
    """Whether the node's device plugin runs in memory-units mode (``tessera.dev/gpu-memory``
    advertised, ``tessera.dev/gpu`` not)."""
    advertised = facts.extended_allocatable if facts is not None else {}
    return GPU_MEMORY_RESOURCE in advertised and GPU_RESOURCE not in advertised


# --- nodes -----------------------------------------------------------------------------------


def placement_reason(
    inventory: NodeInventory | None, facts: NodeFacts | None, *, now: float, stale_s: float
) -> str:
    """Why nothing new may be placed on the node now; empty when it may."""
    if facts is None:
        return NO_FACTS
    if not facts.ready:
        return NOT_READY
    if not facts.schedulable:
        return CORDONED
    if inventory is not None and now - inventory.observed_at > stale_s:
        return STALE
    return ""


def foreign_claims(facts: NodeFacts | None, bookings: Sequence[Booking]) -> list[ClaimedGpu]:
    """What claims allocated by another allocator hold on the node (``NodeFacts.claimed``),
    less any claim a booking here holds already (a claim Tessera allocated, its pod just gone
    from the binder's view): counted once either way."""
    if facts is None or not facts.claimed:
        return []
    booked = {
        f"{b.namespace}/{named[0]}"
        for b in bookings
        for c in b.containers
        if (named := claim_of_container(c.container)) is not None
    }
    return [gpu for gpu in facts.claimed if gpu.claim not in booked]


def node_state(
    name: str,
    inventory: NodeInventory | None,
    facts: NodeFacts | None,
    bookings: Sequence[Booking],
    *,
    placeable: bool,
    memo: GpuMemo | None = None,
) -> NodeState:
    """The core's state of node ``name`` (see the module docstring for each rule).

    ``placeable``: :func:`placement_reason` found nothing against the node. ``memo``: what the
    last call for this node kept (:class:`GpuMemo`); it is brought up to date. The state is the
    same with or without it.
    """
    advertised = facts.extended_allocatable.get(GPU_RESOURCE) if facts else None
    units = facts.extended_allocatable.get(GPU_MEMORY_RESOURCE) if facts else None
    if memo is None:
        memo = GpuMemo()
    if not memo.holds(inventory, advertised, units):
        memo.reset(inventory, advertised, units)
    cpu_booked = sum(b.cpu_milli for b in bookings)
    memory_booked = sum(b.memory_mib for b in bookings)
    if facts is not None:
        other_cpu = max(0, facts.cpu_requested_milli - facts.tessera_cpu_requested_milli)
        other_memory = max(0, facts.memory_requested_mib - facts.tessera_memory_requested_mib)
        cpu_total, memory_total = facts.cpu_allocatable_milli, facts.memory_allocatable_mib
    else:
        other_cpu = other_memory = cpu_total = memory_total = 0
    kinds: dict[str, int] = {}
    for booking in bookings:
        if booking.kind:
            kinds[booking.kind] = kinds.get(booking.kind, 0) + 1
    pods: tuple[PodOnNode, ...] = (*facts.pods, *bookings) if facts is not None else tuple(bookings)
    return NodeState(
        name=name,
        cpu_milli_total=cpu_total,
        memory_mib_total=memory_total,
        cpu_milli_reserved=other_cpu + cpu_booked,
        memory_mib_reserved=other_memory + memory_booked,
        gpus=gpu_states(memo, bookings, foreign_claims(facts, bookings)),
        schedulable=placeable,
        gpu_task_kinds=tuple(sorted(kinds.items())),
        labels=facts.labels if facts is not None else {},
        taints=facts.taints if facts is not None else (),
        pods=pods,
    )


# --- reservations and bookings ---------------------------------------------------------------


def reservation_of(booking: Booking) -> Reservation:
    """The core's reservation a booking stands for."""
    return Reservation(
        pod_uid=booking.pod_uid,
        node=booking.node,
        cpu_milli=booking.cpu_milli,
        memory_mib=booking.memory_mib,
        containers=tuple(
            ContainerPlacement(
                container=c.container,
                # The same five fields on both sides: the ledger's copy of the core's slice.
                gpus=tuple(GpuSlice(**msgspec.structs.asdict(s)) for s in c.gpus),
            )
            for c in booking.containers
        ),
        kind=booking.kind,
    )


def booking_of(
    reservation: Reservation,
    pod: PodPending,
    *,
    tenant: str,
    commit: str,
    decided_at: float,
    placer_id: str,
) -> Booking:
    """The ledger booking of a decided reservation for ``pod`` of ``tenant`` (as the tenancy
    resolved it when deciding: what its quota is charged under)."""
    resources = {c.name: c.resources for c in pod.containers}
    constraints = pod.constraints
    return Booking(
        pod_uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        node=reservation.node,
        commit=commit,
        tenant=tenant,
        cpu_milli=reservation.cpu_milli,
        memory_mib=reservation.memory_mib,
        kind=reservation.kind,
        containers=tuple(
            BookedContainer(
                container=c.container,
                gpus=tuple(BookedSlice(**msgspec.structs.asdict(g)) for g in c.gpus),
                resources=dict(resources.get(c.container, {})),
            )
            for c in reservation.containers
        ),
        decided_at=decided_at,
        placer_id=placer_id,
        labels=dict(pod.labels),
        affinity=constraints.pod_affinity if constraints is not None else None,
        anti_affinity=constraints.pod_anti_affinity if constraints is not None else None,
    )


def restored_booking(restore: PodRestore, *, tenant: str) -> Booking:
    """The booking of a placement restored from the Kubernetes API (docs/design.md §12): the
    pod's request as its spec says (CPU, memory, whole or shared GPUs), on the GPU slices its
    ``tessera.dev/assignment`` names, charged to ``tenant`` (as the tenancy resolves it)."""
    facts = pod_facts(pod_request(restore.pod))
    asks = {ask.container: ask for ask in facts.asks}
    containers = []
    for placed in restore.containers:
        ask = asks.get(placed.container)
        whole = ask is not None and ask.whole
        # The share of SMs from the request when it says (the annotation rounds to percents).
        core_milli = GPU_MILLI if whole else ask.core_milli if ask is not None else 0
        containers.append(
            ContainerPlacement(
                container=placed.container,
                gpus=tuple(
                    GpuSlice(
                        index=s.index,
                        uuid=s.uuid,
                        memory_mib=s.memory_mib,
                        core_milli=core_milli or s.cores * GPU_MILLI // 100,
                        exclusive=whole,
                    )
                    for s in placed.gpus
                ),
            )
        )
    reservation = Reservation(
        pod_uid=restore.pod.uid,
        node=restore.node,
        cpu_milli=facts.cpu_milli,
        memory_mib=facts.memory_mib,
        containers=tuple(containers),
        kind=facts.kind,
    )
    return booking_of(
        reservation,
        restore.pod,
        tenant=tenant,
        commit=restore.commit,
        decided_at=restore.decided_at,
        placer_id=restore.placer_id,
    )


def restored_record(booking: Booking, restore: PodRestore) -> AssignmentRecord:
    """The assignment record of a restored placement, as far as the hand-off had come; an
    allocated one with every GPU container answered (the device IDs the kubelet was handed are
    not known here), as the binder settles a record: without, it read as invalid."""
    record = record_of(booking, state=restore.state, bound_at=restore.bound_at)
    if restore.state != "allocated":
        return record
    return settled(record, now=restore.bound_at or restore.decided_at)


# --- rejections ------------------------------------------------------------------------------


def refine_reasons(
    reasons: Sequence[RejectionReason], unplaceable: Mapping[str, int]
) -> tuple[RejectionReason, ...]:
    """``reasons`` with the core's "node unschedulable" count replaced by why each node is.

    ``unplaceable``: how many unschedulable nodes the shell knows of per reason. Whatever the
    breakdown does not cover keeps the core's wording.
    """
    counts: dict[str, int] = {}
    for reason in reasons:
        if reason.reason == UNSCHEDULABLE:
            left = reason.nodes
            for why, n in unplaceable.items():
                taken = min(n, left)
                if taken:
                    counts[why] = counts.get(why, 0) + taken
                    left -= taken
            if left:
                counts[UNSCHEDULABLE] = counts.get(UNSCHEDULABLE, 0) + left
        else:
            counts[reason.reason] = counts.get(reason.reason, 0) + reason.nodes
    return tuple(
        RejectionReason(reason=why, nodes=n)
        for why, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )


def rejection_message(
    pod: PodPending,
    reasons: Sequence[RejectionReason],
    *,
    nodes: int,
    unresolvable: bool,
    decided_at: float,
    placer_id: str,
) -> PlacementRejected:
    """What the binder reads on ``tessera.placements.rejected``."""
    parts = ", ".join(f"{r.nodes} {r.reason}" for r in reasons)
    message = f"0/{nodes} nodes are available" + (f": {parts}." if parts else ".")
    return PlacementRejected(
        pod_uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        reasons=tuple(WireReason(reason=r.reason, nodes=r.nodes) for r in reasons),
        message=message,
        unresolvable=unresolvable,
        decided_at=decided_at,
        placer_id=placer_id,
    )


def rejection_of(rejection: Rejection, reasons: Sequence[RejectionReason]) -> Rejection:
    """``rejection`` with its reasons replaced (after :func:`refine_reasons`)."""
    return msgspec.structs.replace(rejection, reasons=tuple(reasons))
