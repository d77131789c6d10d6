"""Builders and KV helpers for placer service tests: the binder's and the inventory's side.

``put_node(bus, "n1", gpus=4)`` writes a node's inventory and node facts the way the inventory
service and the binder do; ``publish_pod(bus, pending("p1", memory_mib=4096))`` publishes a pending
pod; ``cluster_state(bus)`` reads every ledger entry, claim and record back for the invariants.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared import codec, subjects
from shared.commits import record_of
from shared.messages.assignments import AssignmentRecord
from shared.messages.inventory import GpuHealthState, NodeInventory
from shared.messages.ledger import Booking, NodeLedger, PodClaim, TenantLedger
from shared.messages.nodes import NodeFacts
from shared.messages.pods import ContainerRequest, PlacementHints, PodDeleted, PodPending
from shared.runtime.bus import Bus
from tests.harness import wire as harness
from tests.harness.kv import put_facts, put_inventory

NOW = harness.NOW
GPU_MIB = 16_384


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index:02d}"


def inventory(
    node: str,
    gpus: int = 4,
    *,
    memory_mib: int = GPU_MIB,
    model: str = "A100",
    used_mib: Sequence[int] = (),
    health: dict[int, GpuHealthState] | None = None,
    at: float = NOW,
) -> NodeInventory:
    """``node`` with ``gpus`` alike GPUs (UUIDs :func:`gpu_uuid`), GPU ``i`` with ``used_mib[i]``
    in use and of health ``health[i]`` where given."""
    return harness.inventory(
        *(
            harness.gpu(
                i,
                uuid=gpu_uuid(node, i),
                model=model,
                memory_mib=memory_mib,
                used_mib=used_mib[i] if i < len(used_mib) else 0,
                health=(health or {}).get(i, "healthy"),
            )
            for i in range(gpus)
        ),
        node=node,
        at=at,
        sequence=1,
        backend="fake",
    )


def facts(
    node: str,
    *,
    cpu_milli: int = 64_000,
    memory_mib: int = 256 * 1024,
    ready: bool = True,
    schedulable: bool = True,
    slots: int | None = None,
    labels: dict[str, str] | None = None,
    at: float = NOW,
) -> NodeFacts:
    return NodeFacts(
        node=node,
        cpu_allocatable_milli=cpu_milli,
        memory_allocatable_mib=memory_mib,
        labels=labels or {},
        ready=ready,
        schedulable=schedulable,
        observed_at=at,
        extended_allocatable={"tessera.dev/gpu": slots} if slots is not None else {},
    )


def pending(
    uid: str,
    *,
    shares: int = 1,
    memory_mib: int | None = 4096,
    cores: int | None = 25,
    cpu_milli: int = 1000,
    namespace: str = "ml",
    tenant: str = "",
    group: str | None = None,
    priority: int = 0,
    gpu_type: str | None = None,
) -> PodPending:
    resources = {"tessera.dev/gpu": shares} if shares else {}
    return PodPending(
        uid=uid,
        namespace=namespace,
        name=f"pod-{uid}",
        containers=(
            ContainerRequest(
                name="main",
                gpu_shares=shares,
                gpu_memory_mib=memory_mib if shares else None,
                gpu_cores=cores if shares else None,
                cpu_milli=cpu_milli,
                memory_mib=1024,
                resources=resources,
            ),
        ),
        priority=priority,
        hints=PlacementHints(tenant=tenant, group=group, gpu_type=gpu_type),  # type: ignore[arg-type]
        created_at=NOW,
        resource_version="1",
    )


async def put_node(
    bus: Bus,
    node: str,
    gpus: int = 4,
    *,
    at: float | None = None,
    memory_mib: int = GPU_MIB,
    slots: int | None = None,
) -> None:
    """Inventory and facts for ``node``, observed ``at`` (default: now, so they are fresh)."""
    when = time.time() if at is None else at
    await put_inventory(bus, inventory(node, gpus, memory_mib=memory_mib, at=when))
    await put_facts(bus, facts(node, at=when, slots=slots))


async def put_bookings(bus: Bus, *bookings: Booking) -> None:
    """Write ``bookings`` as a placer does, each to its own key (``subjects.booking_key``)."""
    for booking in bookings:
        key = subjects.booking_key(booking.node, booking.pod_uid)
        await bus.kv_put(subjects.KV_LEDGER, key, codec.encode(booking))


async def publish_pod(bus: Bus, pod: PodPending) -> None:
    await bus.js_publish(
        subjects.PODS_PENDING,
        codec.encode(pod),
        msg_id=f"pending.{pod.uid}.{pod.resource_version}",
    )


async def delete_pod(bus: Bus, uid: str, namespace: str = "ml") -> None:
    message = PodDeleted(uid=uid, namespace=namespace, name=f"pod-{uid}", deleted_at=NOW)
    await bus.js_publish(subjects.PODS_DELETED, codec.encode(message), msg_id=f"deleted.{uid}")


@dataclass
class ClusterState:
    """Everything the placer wrote, read back from KV."""

    ledgers: dict[str, NodeLedger] = field(default_factory=dict)
    claims: dict[str, PodClaim] = field(default_factory=dict)
    records: dict[str, AssignmentRecord] = field(default_factory=dict)
    tenants: dict[str, TenantLedger] = field(default_factory=dict)

    def live_records(self) -> list[AssignmentRecord]:
        return [r for r in self.records.values() if r.state != "released"]

    def placements(self) -> list[AssignmentRecord]:
        """Every live placement: the live records, and each placed claim's booking that no
        binder recorded yet (as the record the binder writes for it, ``reserved`` until then),
        unless its record fences it."""
        found = self.live_records()
        recorded = {(r.pod_uid, r.commit) for r in self.records.values()}
        booked = {(b.pod_uid, b.commit) for b in self.bookings()}
        for uid, claim in self.claims.items():
            named = claim.booking
            if claim.state != "placed" or named is None or (uid, named.commit) not in booked:
                continue
            held = self.records.get(subjects.assignment_key(named.node, uid))
            fenced = held is not None and named.commit in held.fenced
            if (uid, named.commit) not in recorded and not fenced:
                found.append(record_of(named, state="reserved"))
        return found

    def placements_of(self, uid: str) -> list[AssignmentRecord]:
        return [r for r in self.placements() if r.pod_uid == uid]

    def bookings(self) -> list[Booking]:
        return [b for ledger in self.ledgers.values() for b in ledger.bookings]


async def claimed(bus: Bus) -> int:
    """How many pods have a claim (in ``tessera-ledger``, beside the bookings)."""
    return sum(key != subjects.claim_uid(key) for key in await bus.kv_keys(subjects.KV_CLAIMS))


async def cluster_state(bus: Bus) -> ClusterState:
    """Read back what the placer wrote, records first: a commit charges its tenant, writes the
    ledger, the claim, then the record, so a record read here has its booking and its charge
    read after it."""
    state = ClusterState()
    for key in await bus.kv_keys(subjects.KV_ASSIGNMENTS):
        entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
        if entry is not None:
            state.records[key] = codec.decode(entry.value, AssignmentRecord)
    for key in await bus.kv_keys(subjects.KV_LEDGER):  # the bookings and the claims
        entry = await bus.kv_get(subjects.KV_LEDGER, key)
        if entry is None:
            continue
        if key != subjects.claim_uid(key):
            state.claims[subjects.claim_uid(key)] = codec.decode(entry.value, PodClaim)
            continue
        node, _ = subjects.booking_of_key(key)
        booking = codec.decode(entry.value, Booking)
        held = state.ledgers[node].bookings if node in state.ledgers else ()
        state.ledgers[node] = NodeLedger(node=node, bookings=(*held, booking))
    for key in await bus.kv_keys(subjects.KV_TENANTS):
        entry = await bus.kv_get(subjects.KV_TENANTS, key)
        if entry is not None:
            ledger = codec.decode(entry.value, TenantLedger)
            state.tenants[ledger.tenant] = ledger
    return state


Piece = tuple[int, int, int, bool]
"""(GPU index, MiB, core milli, exclusive) of one share."""


def _check_pieces(
    pieces: dict[str, list[Piece]],
    inventories: dict[str, NodeInventory],
    slots: dict[str, int] | None,
    what: str,
) -> None:
    for node, inv in inventories.items():
        memory: dict[int, int] = {}
        cores: dict[int, int] = {}
        shares: dict[int, int] = {}
        exclusive: dict[int, int] = {}
        for index, mib, core_milli, whole in pieces.get(node, []):
            memory[index] = memory.get(index, 0) + mib
            cores[index] = cores.get(index, 0) + core_milli
            shares[index] = shares.get(index, 0) + 1
            exclusive[index] = exclusive.get(index, 0) + int(whole)
        for gpu in inv.gpus:
            i = gpu.index
            assert memory.get(i, 0) <= gpu.memory_total_mib, f"{what}: {node} GPU {i} memory"
            assert cores.get(i, 0) <= 1000, f"{what}: {node} GPU {i} cores"
            if exclusive.get(i, 0):
                assert shares[i] == 1, f"{what}: {node} GPU {i} held whole and shared"
        total = (slots or {}).get(node)
        if total is not None:
            assert sum(shares.values()) <= total, f"{what}: {node} logical devices"


def check_capacity(
    state: ClusterState, inventories: dict[str, NodeInventory], slots: dict[str, int] | None = None
) -> None:
    """No GPU over-committed (memory, cores, logical slots, exclusivity), counting the ledger's
    bookings and, separately, the live assignment records (what the device plugin hands out)."""
    booked: dict[str, list[Piece]] = {}
    for booking in state.bookings():
        for container in booking.containers:
            for p in container.gpus:
                booked.setdefault(booking.node, []).append(
                    (p.index, p.memory_mib, p.core_milli, p.exclusive)
                )
    _check_pieces(booked, inventories, slots, "ledger")
    recorded: dict[str, list[Piece]] = {}
    for record in state.live_records():
        for slices in record.containers:
            for g in slices.gpus:
                recorded.setdefault(record.node, []).append(
                    (g.index, g.memory_mib, g.cores * 10, False)
                )
    _check_pieces(recorded, inventories, slots, "records")


def check_safety(
    state: ClusterState, inventories: dict[str, NodeInventory], slots: dict[str, int] | None = None
) -> None:
    """What holds at every moment, commits in flight or not: nothing over-committed, at most one
    live record per pod."""
    check_capacity(state, inventories, slots)
    pods = [r.pod_uid for r in state.live_records()]
    twice = sorted({p for p in pods if pods.count(p) > 1})
    assert not twice, f"pods with two live records: {twice}"


def check_invariants(
    state: ClusterState,
    inventories: dict[str, NodeInventory],
    slots: dict[str, int] | None = None,
    *,
    bound: bool = False,
) -> None:
    """Nothing over-committed, one live record per pod, every live record booked and every
    booking placed (``bound``: recorded, as once a binder bound everything), every placed claim
    booked (raises AssertionError naming the fault)."""
    check_safety(state, inventories, slots)
    live = state.live_records() if bound else state.placements()
    booked = {(b.node, b.pod_uid, b.commit) for b in state.bookings()}
    recorded = {(r.node, r.pod_uid, r.commit) for r in live}
    assert recorded <= booked, f"live records without a booking: {sorted(recorded - booked)[:5]}"
    assert booked <= recorded, f"bookings not placed: {sorted(booked - recorded)[:5]}"
    for uid, claim in state.claims.items():
        if claim.state == "placed":
            assert claim.booking is not None
            assert (claim.booking.node, uid, claim.booking.commit) in booked, uid
        else:
            held = claim.booking
            assert held is None or (held.node, uid, held.commit) not in booked, uid


async def settled_state(
    bus: Bus,
    inventories: dict[str, NodeInventory],
    slots: dict[str, int] | None = None,
    *,
    timeout: float = 30.0,
) -> ClusterState:
    """The cluster state once the commits in flight have finished (a booking is written before
    its record): :func:`check_safety` holds at every read, and bookings, claims and records must
    agree within ``timeout`` seconds (else the last disagreement is raised)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        state = await cluster_state(bus)
        check_safety(state, inventories, slots)
        try:
            check_invariants(state, inventories, slots)
            return state
        except AssertionError as error:
            if loop.time() > deadline:
                raise AssertionError(f"not settled after {timeout:g} s: {error}") from None
        await asyncio.sleep(0.1)


def record_shares(records: Sequence[AssignmentRecord]) -> tuple[int, int]:
    """GPU shares and GPU memory (MiB) ``records`` hold."""
    slices = [g for r in records for c in r.containers for g in c.gpus]
    return len(slices), sum(g.memory_mib for g in slices)


def check_quotas(state: ClusterState, quotas: dict[str, tuple[int | None, int | None]]) -> None:
    """For each tenant with a quota (GPU shares, GPU MiB; None = no limit), the live placements
    of its pods (:meth:`ClusterState.placements`) hold no more than the quota. A record's tenant
    is its booking's (else its namespace)."""
    tenant_of = {b.commit: b.tenant for b in state.bookings()}
    for tenant, (gpus, memory) in quotas.items():
        live = [r for r in state.placements() if tenant_of.get(r.commit, r.namespace) == tenant]
        held_gpus, held_mib = record_shares(live)
        assert gpus is None or held_gpus <= gpus, (
            f"tenant {tenant} over its quota: live records hold {held_gpus} of {gpus} GPUs"
        )
        assert memory is None or held_mib <= memory, (
            f"tenant {tenant} over its quota: live records hold {held_mib} of {memory} MiB"
        )


def check_charges(state: ClusterState, quotas: dict[str, tuple[int | None, int | None]]) -> None:
    """What keeps quotas exact: each tenant's charges (``tessera-tenants``) add up to no more
    than its quota, and every live placement of its pods that holds GPUs is charged (by
    commit)."""
    tenant_of = {b.commit: b.tenant for b in state.bookings()}
    for tenant, (gpus, memory) in quotas.items():
        ledger = state.tenants.get(tenant)
        charges = ledger.charges if ledger else ()
        charged_gpus = sum(c.gpus for c in charges)
        charged_mib = sum(c.gpu_memory_mib for c in charges)
        assert gpus is None or charged_gpus <= gpus, f"{tenant}: {charged_gpus} GPUs charged"
        assert memory is None or charged_mib <= memory, f"{tenant}: {charged_mib} MiB charged"
        listed = {c.commit for c in charges}
        uncharged = sorted(
            r.pod_uid
            for r in state.placements()
            if tenant_of.get(r.commit, r.namespace) == tenant
            and r.commit not in listed
            and record_shares([r]) != (0, 0)
        )
        assert not uncharged, f"tenant {tenant}: live records not charged: {uncharged[:5]}"
