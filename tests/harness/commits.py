"""What a placer writes to commit a placement, for tests that play the placer: the pod's booking
on the node (``subjects.booking_key``, in ``tessera-ledger``) and its claim (``subjects.claim_key``)
naming the booking's commit. The binder binds a placed claim's booking by writing its record;
the device plugin grants, and the binder's ambiguity gate waits for, only records that match
their booking (``shared.commits.booking_problem``)."""

from __future__ import annotations

from shared import codec, subjects
from shared.commits import CORE_MILLI_PER_PERCENT
from shared.messages.assignments import AssignmentRecord
from shared.messages.ledger import BookedContainer, BookedSlice, Booking, PodClaim
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


def bookings_of(*records: AssignmentRecord) -> dict[str, Booking]:
    """The bookings of ``records`` (on their nodes), by pod UID."""
    return {r.pod_uid: booking_of(r) for r in records}


async def commit(bus: Bus, record: AssignmentRecord) -> None:
    """Commit ``record``'s placement as a placer does: its booking, then its claim (the binder
    then binds it)."""
    await bus.kv_put(
        subjects.KV_LEDGER,
        subjects.booking_key(record.node, record.pod_uid),
        codec.encode(booking_of(record)),
    )
    await bus.kv_put(
        subjects.KV_CLAIMS, subjects.claim_key(record.pod_uid), codec.encode(claim_of(record))
    )
