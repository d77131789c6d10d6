"""Does an assignment record stand for a placer's commit? (pure; issue 19, finding 2b)

The bus's permissions decide who may write what; this is the defence behind them. Only placers
write the ledger and the claims (``tessera-ledger``), so a record is believed only when it is what
a placer committed (``services/placer/commit.py``):

- the record names a commit, and the pod's claim (``subjects.claim_key``) is ``placed`` by that
  commit;
- the pod's booking on the record's node (``subjects.booking_key`` in ``tessera-ledger``) is of
  that commit, for the same pod and node, and the record's container slices are exactly the
  ones booked.

A well-formed record that any writer of ``tessera-assignments`` made up (a pod that does not
exist, slices on a GPU another pod holds whole, the slices of a real pod moved to another node)
fails one of these, and :func:`commit_problem` says which. The device plugin grants only records
that pass, the binder's ambiguity gate waits only for records that pass or that a placer is
withdrawing (:func:`withdrawing`), and the placer releases live records that match no commit.
"""

from __future__ import annotations

from typing import Final

from shared.messages.assignments import AssignmentRecord
from shared.messages.base import ContainerSlices, GpuSlice
from shared.messages.ledger import Booking, PodClaim

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


def commit_problem(
    record: AssignmentRecord, *, claim: PodClaim | None, booking: Booking | None
) -> str | None:
    """Why ``record`` is not what a placer committed; None when it is.

    ``claim``: the pod's claim (None: there is none); ``booking``: the pod's booking on the
    record's node in ``tessera-ledger`` (None: there is none).
    """
    pod = f"{record.namespace}/{record.name}"
    if not record.commit:
        return f"the record of {pod} names no commit"
    if claim is None:
        return f"no placer claimed pod {pod} (uid {record.pod_uid}): it has no claim"
    if claim.state != "placed" or claim.booking is None:
        return f"the claim of pod {pod} is {claim.state}, not placed"
    if claim.booking.commit != record.commit:
        return (
            f"the claim of pod {pod} names commit {claim.booking.commit}, the record "
            f"{record.commit}"
        )
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


def withdrawing(record: AssignmentRecord, *, claim: PodClaim | None) -> bool:
    """Whether ``record`` is of a commit a placer made and is now taking back: the pod's claim
    (only placers write claims) still names the record's commit on its node but is no longer
    ``placed`` (the pod was deleted: the claim turns ``deleted`` before the record is fenced).

    Such a record fails :func:`commit_problem`, yet a device plugin that read the claim while it
    was ``placed`` may still grant it until the record is fenced ``released``; so the binder's
    ambiguity gate keeps waiting for it, or two bound records on a node would be ambiguous.
    """
    return (
        bool(record.commit)
        and claim is not None
        and claim.state != "placed"
        and claim.booking is not None
        and claim.booking.commit == record.commit
        and claim.booking.node == record.node
    )
