"""What a placer writes before an assignment record, for tests that play the placer: the pod's
claim (``subjects.claim_key``) naming the record's commit and its booking in the node's ledger entry
(``tessera-ledger``). The device plugin grants, and the binder's ambiguity gate waits for, only
records that match such a commit (``shared.commits``)."""

from __future__ import annotations

from shared import codec, subjects
from shared.commits import CORE_MILLI_PER_PERCENT
from shared.messages.assignments import AssignmentRecord
from shared.messages.ledger import BookedContainer, BookedSlice, Booking, NodeLedger, PodClaim
from shared.runtime.bus import Bus


def booking_of(record: AssignmentRecord) -> Booking:
    """The ledger booking a placer wrote for ``record`` (its slices, its commit)."""
    return Booking(
        pod_uid=record.pod_uid,
        namespace=record.namespace,
        name=record.name,
        node=record.node,
        commit=record.commit,
        containers=tuple(
            BookedContainer(
                container=c.container,
                gpus=tuple(
                    BookedSlice(
                        index=s.index,
                        uuid=s.uuid,
                        memory_mib=s.memory_mib,
                        core_milli=s.cores * CORE_MILLI_PER_PERCENT,
                    )
                    for s in c.gpus
                ),
                resources=c.resources,
            )
            for c in record.containers
        ),
        decided_at=record.decided_at,
        placer_id=record.placer_id,
    )


def claim_of(record: AssignmentRecord) -> PodClaim:
    """The ``placed`` claim naming ``record``'s commit."""
    return PodClaim(
        pod_uid=record.pod_uid, state="placed", booking=booking_of(record), updated_at=0.0
    )


def ledger_of(*records: AssignmentRecord) -> NodeLedger:
    """The ledger entry of the node of ``records`` (one node) booking them."""
    (node,) = {r.node for r in records}
    return NodeLedger(node=node, bookings=tuple(booking_of(r) for r in records))


async def commit(bus: Bus, record: AssignmentRecord) -> None:
    """Write ``record``'s claim, and add its booking to its node's ledger entry (by
    compare-and-set, so concurrent commits keep each other's bookings)."""
    await bus.kv_put(
        subjects.KV_CLAIMS, subjects.claim_key(record.pod_uid), codec.encode(claim_of(record))
    )
    key = subjects.ledger_key(record.node)
    while True:
        entry = await bus.kv_get(subjects.KV_LEDGER, key)
        held = codec.decode(entry.value, NodeLedger).bookings if entry is not None else ()
        kept = tuple(b for b in held if b.pod_uid != record.pod_uid)
        data = codec.encode(NodeLedger(node=record.node, bookings=(*kept, booking_of(record))))
        if entry is None:
            written = await bus.kv_create(subjects.KV_LEDGER, key, data)
        else:
            written = await bus.kv_update(subjects.KV_LEDGER, key, data, revision=entry.revision)
        if written is not None:
            return
