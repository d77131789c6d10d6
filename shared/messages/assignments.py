"""Assignment records, KV bucket ``tessera-assignments`` keyed ``<node>.<pod uid>``.

The single source of truth for the hand-off between placer, binder and device plugin
(docs/design.md §4). A record only moves forward, each step a compare-and-set on its KV revision
(or a create-only write):

    reserved -> bound -> allocated -> released

:func:`moves_forward` is that rule, the one every reader applies to a rewrite of a record it
holds (``shared.validation.transition_problem``, through every record mirror: the binder's
ambiguity gate as the device plugin): a version moved back is refused, whoever wrote it.

``reserved``: the placer decided and booked it; that stage is the pod's booking and claim in
``tessera-ledger`` (``shared.messages.ledger``), and the record is first written ``bound``
(placers before this protocol wrote ``reserved`` records, which the binder still binds).
``bound``: the binder annotated the pod and bound it to the node. ``allocated``: the device
plugin answered Allocate for every GPU container. ``released``: the placement was given back
(the pod is gone, or placed again); its GPUs are free again, and the record fences its commit.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from shared.messages.base import ContainerSlices, Message

AssignmentState = Literal["reserved", "bound", "allocated", "released"]

STATE_ORDER: Final[dict[AssignmentState, int]] = {
    "reserved": 0,
    "bound": 1,
    "allocated": 2,
    "released": 3,
}


def moves_forward(current: AssignmentState, new: AssignmentState) -> bool:
    """Whether a record of one commit in state ``current`` may be rewritten in state ``new``:
    the same state (the binder touching it, one more container answered) or a later one, never
    an earlier one."""
    return STATE_ORDER[new] >= STATE_ORDER[current]


class ContainerAllocation(Message, frozen=True, kw_only=True):
    """What the device plugin answered for one container of the record."""

    container: str
    device_ids: tuple[str, ...]
    allocated_at: float


class AssignmentRecord(Message, frozen=True, kw_only=True):
    """One pod's decided slices on one node and how far the hand-off has come."""

    pod_uid: str
    namespace: str
    name: str
    node: str
    containers: tuple[ContainerSlices, ...]
    state: AssignmentState
    decided_at: float
    placer_id: str
    bound_at: float | None = None
    allocated: tuple[ContainerAllocation, ...] = ()
    """Containers already answered, in container order; the next one is ``containers[len(...)]``
    among those with GPUs."""
    allocated_at: float | None = None
    released_at: float | None = None
    commit: str = ""
    """The placer commit that made this record (its ledger booking and pod claim carry the same
    id); empty in records written before the placer recorded it."""
    fenced: tuple[str, ...] = ()
    """Other commits of this pod released at this key before (or beside) this record's: none of
    them may ever take the key again (``shared.validation.may_replace``). A release fences its
    commit by leaving a released record; where the key already holds another commit's released
    record, the commit is added here instead of replacing that fence, and a new placement over a
    released record carries its fences on."""


class RecordView(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """An assignment record as a reader holds it: with the KV key and the revision it was read
    at (what its next compare-and-set is made on). Not a wire message."""

    key: str
    revision: int
    record: AssignmentRecord


def released(record: AssignmentRecord, *, now: float) -> AssignmentRecord:
    """``record`` released at ``now``: the one transition every release writes (a placer's, and
    the binder's withdrawal of a record whose pod ended before its GPUs were allocated)."""
    return msgspec.structs.replace(record, state="released", released_at=now)


def settled(record: AssignmentRecord, *, now: float) -> AssignmentRecord:
    """``record`` of a pod the kubelet admitted although no Allocate moved the record: every
    GPU-holding container counts as allocated at ``now``. The device IDs the kubelet handed those
    containers are unknown here (they went into the record an Allocate was served from), so the
    containers not answered yet get none."""
    answered = {a.container for a in record.allocated}
    return with_answers(
        record,
        tuple(
            ContainerAllocation(container=c.container, device_ids=(), allocated_at=now)
            for c in record.containers
            if c.gpus and c.container not in answered
        ),
        now=now,
    )


def with_answers(
    record: AssignmentRecord, added: tuple[ContainerAllocation, ...], *, now: float
) -> AssignmentRecord:
    """``record`` with ``added`` answered too, ``allocated`` at ``now`` once every GPU-holding
    container is answered."""
    allocated = record.allocated + added
    answered = {a.container for a in allocated}
    done = all(c.container in answered for c in record.containers if c.gpus)
    return msgspec.structs.replace(
        record,
        allocated=allocated,
        state="allocated" if done else record.state,
        allocated_at=now if done else record.allocated_at,
    )


def holds_gpus(record: AssignmentRecord) -> bool:
    """Whether any container of the record has a GPU slice. A record without one (a pod Tessera
    placed that asks for no GPU) is never allocated by a device plugin: the kubelet has nothing
    to ask it, so its ``bound`` state is final and nobody waits for an allocation."""
    return any(container.gpus for container in record.containers)
