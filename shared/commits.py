"""The commit rules the placer, the binder and the device plugin share (pure).

**What a record of a booking is.** A placer commits a pod by its booking (``tessera-ledger``,
``subjects.booking_key``) and the pod's claim naming it (``subjects.claim_key``): that is the
assignment at its first stage, ``reserved``. The binder binds it by writing its record
(``tessera-assignments``, ``subjects.assignment_key``) in state ``bound`` (:func:`record_of`),
create-only, or over a released record of another commit that does not fence this one
(:func:`record_action`, :func:`placed_over`): the record's write is what makes a bind happen once.

**Does a record stand for a placer's commit?** (issue 19, finding 2b) The bus's permissions
decide who may write what; this is the defence behind them. Only placers write the ledger
(bookings and claims), so a record is believed only when it is what a placer committed:

the record names a commit, and the pod's booking on the record's node is of that commit, for the
same pod and node, with exactly the record's container slices (:func:`booking_problem`). A device
plugin grants only such records (from the node's bookings it mirrors), and the binder's ambiguity
gate waits only for them. The binder writes a record only for a booking its pod's claim names,
and every release fences the record of its commit before the booking goes, so a record a binder
wrote always has its booking. A well-formed record that any writer of ``tessera-assignments`` made
up (a pod that does not exist, slices on a GPU another pod holds whole, the slices of a real pod
moved to another node) fails :func:`booking_problem`.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from shared.messages.assignments import AssignmentRecord, AssignmentState
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.ledger import Booking
from shared.validation import may_replace

CORE_MILLI_PER_PERCENT: Final = 10
"""A booking counts thousandths of a GPU's SMs; a record percent (``tessera.dev/gpu-cores``)."""


def record_containers(booking: Booking) -> tuple[ContainerSlices, ...]:
    """The container slices the record of ``booking`` carries (cores rounded up to a percent)."""
    return tuple(
        ContainerSlices(
            container=c.container,
            gpus=tuple(
                GpuSlice(
                    uuid=s.uuid,
                    index=s.index,
                    memory_mib=s.memory_mib,
                    cores=-(-s.core_milli // CORE_MILLI_PER_PERCENT),
                )
                for s in c.gpus
            ),
            resources=c.resources,
        )
        for c in booking.containers
    )


def record_of(
    booking: Booking, *, state: AssignmentState = "bound", bound_at: float | None = None
) -> AssignmentRecord:
    """The assignment record of ``booking`` in ``state`` (the binder writes it ``bound``)."""
    return AssignmentRecord(
        pod_uid=booking.pod_uid,
        namespace=booking.namespace,
        name=booking.name,
        node=booking.node,
        containers=record_containers(booking),
        state=state,
        decided_at=booking.decided_at,
        placer_id=booking.placer_id,
        commit=booking.commit,
        bound_at=bound_at,
    )


RecordAction = Literal["write", "done", "released", "blocked"]
"""For writing the first record of a commit at its key: ``write`` it (create-only when the key is
empty, else compare-and-set over a released record of an older commit); ``done``: the record of
this commit is there (live); ``released``: this commit was released already (a fence): never
write it; ``blocked``: a live record of another commit holds the key (a placer's reconciliation
sorts it out first)."""


def record_action(current: AssignmentRecord | None, commit: str) -> RecordAction:
    if current is not None and current.commit == commit:
        return "released" if current.state == "released" else "done"
    if current is not None and commit in current.fenced:
        return "released"
    return "write" if may_replace(current, commit) else "blocked"


def placed_over(current: AssignmentRecord | None, record: AssignmentRecord) -> AssignmentRecord:
    """``record``, a new placement written over ``current`` (nothing, or a released record of
    another commit: ``record_action`` said ``write``), carrying on the fences ``current`` holds."""
    if current is None or not current.commit:
        return record
    return msgspec.structs.replace(record, fenced=(*current.fenced, current.commit))


def booking_problem(record: AssignmentRecord, booking: Booking | None) -> str | None:
    """Why ``record`` is not the record of ``booking`` (the pod's booking on the record's node
    in ``tessera-ledger``; None: there is none); None when it is."""
    pod = f"{record.namespace}/{record.name}"
    if not record.commit:
        return f"the record of {pod} names no commit"
    if booking is None or booking.commit != record.commit:
        held = f"commit {booking.commit}" if booking is not None else "nothing"
        return f"node {record.node}'s ledger holds {held} for pod {pod}, not commit {record.commit}"
    if (booking.namespace, booking.name, booking.node) != (
        record.namespace,
        record.name,
        record.node,
    ):
        return f"commit {record.commit} booked {booking.namespace}/{booking.name} on {booking.node}"
    if record_containers(booking) != record.containers:
        return f"the record's slices of pod {pod} are not the ones commit {record.commit} booked"
    return None
