"""Pure: what to do to bind one placement, given the pod and the assignment records.

The binder's work is a placed claim's booking (``shared.messages.ledger``): what a placer
committed, the assignment at its ``reserved`` stage. ``plan_bind(booking, pod, record,
node_records, ...)`` returns one of:

- :class:`Drop`: nothing to do and nothing to tell the placer: the booking was given back (its
  record is released: a fence), or a live record of another commit holds its key (a placer's
  reconciliation releases that one, and the binder looks again when it changes). Publishing
  ``failed`` here could release a *newer* placement of the same pod, so the binder stays silent.
- :class:`Report`: tell the placer ``gone`` (the pod was deleted or replaced) or ``failed``
  (bound elsewhere by someone else); or ``bound`` (already done: a placement seen again).
- :class:`Wait`: the ambiguity gate (docs/design.md §4) holds this pod back (see below).
- :class:`Bind`: write the record ``bound`` (``write``: create-only at revision 0, or a
  compare-and-set over the revision read; None when the record is ``bound`` already: a binder
  that stopped after its write continues), then create the Binding with ``annotations`` unless
  the pod is on the node already (``binding`` False: a ``reserved`` record an earlier placer
  wrote). A pod bound with no record at all is a restore's (a store that lost its records): the
  restore writes the record, as far as the hand-off had come, and the binder writes nothing.
  The record's write is what makes a bind happen once, however often the binder looks at the
  claim.

The ambiguity gate. The kubelet's Allocate names no pod; the device plugin takes the oldest
``bound`` record on its node whose next device-holding container asks for exactly as many
devices. Two bound, not yet allocated records on one node whose containers ask for the same
number of devices of a resource the node's plugin hands out, with different GPU slices, are
ambiguous: the kubelet may admit them in either order. So a record may only become ``bound``
when no container of it has the same device count as a not yet allocated container of another
bound record on the node (with different slices); otherwise it waits until that record is
allocated (or released). Comparing every remaining container, not only the next one, keeps the
rule true while multi-container pods are being allocated one container at a time.

A pod that ends before its GPUs are allocated (the kubelet rejected it at admission, or it was
deleted once bound) leaves a ``bound`` record that no Allocate of its own will ever take. Until a
placer releases it, a device plugin could serve another pod's Allocate of the same size from it,
and that pod's own record would then stay ``bound`` for good, holding the gate of its node shut.
So the binder withdraws such a record itself (:func:`stranded`, then
``shared.messages.assignments.released``) before it
publishes ``PodDeleted``. The binder can be late: the kubelet rejects pods by itself while a
device plugin is down, and the plugin, back up, may serve a live pod from such a record first.
That pod then runs with its own record ``bound`` while the dead pod's record is ``allocated``,
so the binder settles such a surplus record of an admitted pod (:func:`served_elsewhere`, then
``shared.messages.assignments.settled``). Both leave ``bound`` only while a record of the shape
is left for every pod still waiting (:func:`surplus`): an identical pod may have taken the
record, and then the one left ``bound`` is the waiting pod's.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from shared import annotations as names
from shared.commits import placed_over, record_action, record_of
from shared.kubeobjects import Pod
from shared.messages.assignments import AssignmentRecord, RecordView, holds_gpus
from shared.messages.bindings import BindOutcome
from shared.messages.ledger import Booking


class ObservedPod(msgspec.Struct, frozen=True, kw_only=True):
    """What the binder knows of the pod it binds."""

    uid: str
    namespace: str
    name: str
    node: str
    terminating: bool = False


def observe(pod: Pod) -> ObservedPod:
    return ObservedPod(
        uid=pod.metadata.uid,
        namespace=pod.metadata.namespace,
        name=pod.metadata.name,
        node=pod.node,
        terminating=pod.terminating,
    )


class Drop(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    reason: str


class Report(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    outcome: BindOutcome
    reason: str = ""


class Wait(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    blocker: RecordView
    reason: str


class Bind(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    write: int | None
    """The record's revision to write ``record`` at (0: create it); None: it is written."""
    record: AssignmentRecord
    annotations: dict[str, str]
    binding: bool = True
    """Whether the Binding is still to create (False: the pod is on the node already)."""


BindPlan = Drop | Report | Wait | Bind


Repair = Literal["deleted"]


def repair(record: AssignmentRecord, pod: Pod | None) -> Repair | None:
    """What a new leader finishes of what a previous one left half done with ``record``: its
    pod is gone -> ``"deleted"`` (publish ``PodDeleted``). Binds left half done are finished
    from the claims (:func:`plan_bind` looks at the record)."""
    return "deleted" if pod is None else None


def gate_resources(
    extended_allocatable: Mapping[str, int], record: AssignmentRecord
) -> frozenset[str]:
    """The resources whose device counts the kubelet hands to Allocate on this node: those the
    node advertises; every Tessera resource the record names while that is not known."""
    advertised = frozenset(
        r for r, n in extended_allocatable.items() if n > 0 and r.startswith(names.PREFIX)
    )
    if advertised:
        return advertised
    return frozenset(r for c in record.containers for r, n in c.resources.items() if n > 0)


Slices = tuple[tuple[str, int, int], ...]


def _device_containers(
    record: AssignmentRecord, resource: str, *, remaining: bool
) -> list[tuple[int, Slices]]:
    containers = [c for c in record.containers if c.resources.get(resource, 0) > 0]
    if remaining:
        containers = containers[len(record.allocated) :]
    return [
        (c.resources[resource], tuple((g.uuid, g.memory_mib, g.cores) for g in c.gpus))
        for c in containers
    ]


def ambiguous(
    mine: Sequence[tuple[str, list[tuple[int, Slices]]]],
    pod_uid: str,
    other: AssignmentRecord,
) -> bool:
    """Whether binding pod ``pod_uid``, whose GPU containers are ``mine`` (per gate resource,
    :func:`_device_containers`), beside the bound ``other`` could let Allocate confuse them.

    The placer mirrors this rule when it spreads a burst (``ClusterView.waits_at_gate`` in
    ``services/placer/rules/state.py``); a change here belongs there too."""
    if other.state != "bound" or other.pod_uid == pod_uid:
        return False
    for resource, ours in mine:
        theirs = _device_containers(other, resource, remaining=True)
        if any(n == m and a != b for n, a in ours for m, b in theirs):
            return True
    return False


def blocker(
    record: AssignmentRecord, node_records: Iterable[RecordView], resources: Collection[str]
) -> RecordView | None:
    """The earliest bound record on the node that ``record`` would be ambiguous with."""
    # Its own containers once, not once per record on the node: a burst of identical pods keeps
    # dozens of records bound on a node at a time, and every bind asks about each.
    mine = [
        (resource, ours)
        for resource in resources
        if (ours := _device_containers(record, resource, remaining=False))
    ]
    uid = record.pod_uid
    candidates = [v for v in node_records if ambiguous(mine, uid, v.record)]
    return min(
        candidates,
        key=lambda v: (v.record.bound_at or v.record.decided_at, v.record.pod_uid),
        default=None,
    )


def stranded(record: AssignmentRecord) -> bool:
    """Whether ``record``, whose pod has ended (gone, or finished: ``Failed`` at admission), is
    one the binder withdraws: ``bound`` with GPU slices, so its devices were never all
    allocated and no Allocate of its own pod will come (see the module docstring). A record
    without GPUs is final at ``bound``; a placer releases it, as every other record."""
    return record.state == "bound" and holds_gpus(record)


Admission = Literal["waiting", "admitted", "ended"]
"""Where the kubelet is with a pod: ``admitted`` (``Running``: it allocated every container's
devices at admission, before any started), ``ended`` (gone or finished) or ``waiting``."""


def admission_of(pod: Pod | None) -> Admission:
    if pod is None or pod.terminal:
        return "ended"
    return "admitted" if pod.status.phase == "Running" else "waiting"


def same_shape(a: AssignmentRecord, b: AssignmentRecord) -> bool:
    """Whether a device plugin cannot tell ``a`` and ``b`` apart: the same device counts and
    slices in each GPU-holding container, in order (container names never reach Allocate)."""
    return _shape(a) == _shape(b)


def _shape(record: AssignmentRecord) -> tuple[object, ...]:
    return tuple(
        (tuple(sorted(c.resources.items())), tuple((g.uuid, g.memory_mib, g.cores) for g in c.gpus))
        for c in record.containers
        if c.gpus
    )


def surplus(
    record: AssignmentRecord,
    node_records: Iterable[AssignmentRecord],
    admission: Mapping[str, Admission],
) -> bool:
    """Whether ``record`` (``bound``) may leave ``bound``: with it, the node's ``bound`` records
    of its shape outnumber the pods still waiting for an Allocate.

    Allocate serves the oldest matching record, whoever's: pods of identical slices are served
    from each other's records, harmlessly, as each admission takes one record. So it is the count
    that must hold: every pod still waiting needs one ``bound`` record of its shape, and when
    none is left its Allocate is refused (or served the slices of a pod the gate has let in
    since). ``admission`` maps the records' pod UIDs (a UID it lacks counts as waiting) as seen
    before ``node_records`` were read; those must show the ``bound`` ones as read after it."""
    bound = 1
    waiting = 0
    for other in node_records:
        if other.pod_uid == record.pod_uid or not same_shape(other, record):
            continue
        bound += other.state == "bound"
        waiting += admission.get(other.pod_uid, "waiting") == "waiting" and other.state in (
            "bound",
            "allocated",
        )
    return bound > waiting


def served_elsewhere(
    record: AssignmentRecord,
    node_records: Iterable[AssignmentRecord],
    admission: Mapping[str, Admission],
) -> bool:
    """Whether the binder settles ``record`` as allocated: its pod was admitted but the record
    still waits for an Allocate (``bound``, with GPU slices), and it is a :func:`surplus`.

    The pod was then served from another record of its shape. When that record's pod is still
    waiting, it will be served from this one; when it ended first (the kubelet rejected it while
    the plugin was down), this record is one too many, and left ``bound`` it would hold the
    node's gate shut for good."""
    return (
        stranded(record)
        and admission.get(record.pod_uid) == "admitted"
        and surplus(record, node_records, admission)
    )


def withdrawable(
    record: AssignmentRecord,
    node_records: Iterable[AssignmentRecord],
    admission: Mapping[str, Admission],
) -> bool:
    """Whether the binder withdraws ``record``, whose pod ended: :func:`stranded` and a
    :func:`surplus`. A pod that ran after an identical pod's Allocate took its record ends with
    its own ``bound``, and that pod may still be waiting: the record is then kept for it (its
    Allocate takes it) and withdrawn only once it is one too many."""
    return stranded(record) and surplus(record, node_records, admission)


def binding_annotations(record: AssignmentRecord, *, now: float) -> dict[str, str]:
    """``tessera.dev/assignment`` and ``tessera.dev/bind-time`` for the Binding."""
    return {
        names.ASSIGNMENT: names.assignment_value(
            node=record.node,
            containers=record.containers,
            decided_at=record.decided_at,
            placer_id=record.placer_id,
            commit=record.commit,
        ),
        names.BIND_TIME: names.time_value(now),
    }


def plan_bind(
    *,
    booking: Booking,
    pod: ObservedPod | None,
    record: RecordView | None,
    node_records: Iterable[RecordView],
    resources: Collection[str],
    now: float,
) -> BindPlan:
    """The next step to bind ``booking`` (see the module docstring); ``record``: the latest
    version of its key (released ones included; None: none)."""
    current = record.record if record is not None else None
    action = record_action(current, booking.commit)
    if action == "released":
        return Drop(reason="the placement was given back before the pod was bound")
    if action == "blocked":
        return Drop(reason="a live record of another commit holds the pod's key on the node")
    if pod is None or pod.uid != booking.pod_uid:
        return Report(outcome="gone", reason="the pod no longer exists")
    if pod.node and pod.node != booking.node:
        return Report(outcome="failed", reason=f"the pod is already bound to node {pod.node}")
    written = current if action == "done" and current is not None else None
    if written is not None and written.state != "reserved":
        if pod.node:
            return Report(outcome="bound", reason="already bound")
        if pod.terminating:
            return Report(outcome="gone", reason="the pod is being deleted")
        return Bind(write=None, record=written, annotations=binding_annotations(written, now=now))
    if pod.terminating and not pod.node:
        return Report(outcome="gone", reason="the pod is being deleted")
    bound = (
        msgspec.structs.replace(written, state="bound", bound_at=now)
        if written is not None  # a ``reserved`` record an earlier placer wrote
        else placed_over(current, record_of(booking, bound_at=now))
    )
    revision = record.revision if record is not None and current is not None else 0
    if pod.node:
        if written is None:  # bound before any record: a restore, which writes the record
            return Drop(reason="the pod is bound already: its restore writes its record")
        return Bind(write=revision, record=bound, annotations={}, binding=False)
    held = blocker(bound, node_records, resources)
    if held is not None:
        other = held.record
        return Wait(
            blocker=held,
            reason=f"waits for {other.namespace}/{other.name} on node {other.node} to be "
            "allocated first: their containers ask for the same number of devices with "
            "different GPU slices",
        )
    return Bind(write=revision, record=bound, annotations=binding_annotations(bound, now=now))
