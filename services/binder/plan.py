"""Pure: what to do with one placement decision, given the pod and the assignment records.

``plan_bind(decision, pod, record, node_records, ...)`` returns one of:

- :class:`AwaitRecord`: no record of this decision's commit yet. The placer publishes a decision
  beside its record's write, so the decision may come first. The binder waits a few seconds for
  the record, then asks the pod's claim: while it names this commit the record is on its way (a
  late write, a placer's repair) and the decision is delivered again later
  (:func:`record_on_its_way`); once it names none, the decision is dropped.
- :class:`Drop`: nothing to do and nothing to tell the placer (a released record, or a record
  that no longer matches this decision: a stale or duplicate message; or no record after the
  wait). Publishing ``failed`` here could release a *newer* booking of the same pod, so the
  binder stays silent.
- :class:`Report`: tell the placer ``bound`` (already done: a redelivery), ``gone`` (the pod was
  deleted or replaced) or ``failed`` (bound elsewhere by someone else).
- :class:`Advance`: the pod is already on the decided node but the record still says
  ``reserved``: move the record to ``bound``.
- :class:`Wait`: the ambiguity gate (DESIGN section 4) holds this pod back (see below).
- :class:`Bind`: move the record ``reserved -> bound`` by compare-and-set (``claim``; None when
  the record is already ``bound``: a binder that crashed after its compare-and-set continues),
  then create the Binding with ``annotations``.

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
deleted once bound) leaves a ``bound`` record that no Allocate of its own will ever claim. Until a
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
from shared.kubeobjects import Pod
from shared.messages.assignments import AssignmentRecord, RecordView, holds_gpus
from shared.messages.bindings import BindOutcome
from shared.messages.ledger import PodClaim
from shared.messages.placement import PlacementDecision


class ObservedPod(msgspec.Struct, frozen=True, kw_only=True):
    """What the binder knows of the pod a decision is for."""

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


class AwaitRecord(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    reason: str
    after: int
    """The revision of the key found (0: none): the record to wait for is a newer one."""


class Drop(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    reason: str


class Report(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    outcome: BindOutcome
    reason: str = ""


class Advance(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    claim: RecordView
    record: AssignmentRecord


class Wait(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    blocker: RecordView
    reason: str


class Bind(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    claim: RecordView | None
    record: AssignmentRecord
    annotations: dict[str, str]


BindPlan = AwaitRecord | Drop | Report | Advance | Wait | Bind


def claim_of(plan: BindPlan) -> tuple[RecordView, AssignmentRecord] | None:
    """The record compare-and-set a plan needs before its API work: (read at, write)."""
    if isinstance(plan, (Advance, Bind)) and plan.claim is not None:
        return plan.claim, plan.record
    return None


def record_on_its_way(decision: PlacementDecision, claim: PodClaim | None) -> bool:
    """Whether a record of ``decision``'s commit is still to come: the pod's claim
    (``subjects.claim_key``) names that commit as placed. Its record's write lands, or a placer's
    repair writes it, unless the commit is released first (the claim then moves on). A decision
    that names no commit (an older placer's) is never waited for past the first wait."""
    return (
        bool(decision.commit)
        and claim is not None
        and claim.state == "placed"
        and claim.booking is not None
        and claim.booking.commit == decision.commit
    )


def of_commit(record: AssignmentRecord, decision: PlacementDecision) -> bool:
    """Whether ``record`` is of the commit ``decision`` announced (any commit for a decision
    that names none)."""
    return not decision.commit or record.commit == decision.commit


def matches(record: AssignmentRecord, decision: PlacementDecision) -> bool:
    """Whether ``record`` is the booking ``decision`` announced."""
    return (
        of_commit(record, decision)
        and record.pod_uid == decision.pod_uid
        and record.node == decision.node
        and record.containers == decision.containers
    )


def decision_of(record: AssignmentRecord) -> PlacementDecision:
    """The decision a record carries (to finish a bind from the record alone, on restart)."""
    return PlacementDecision(
        pod_uid=record.pod_uid,
        namespace=record.namespace,
        name=record.name,
        node=record.node,
        containers=record.containers,
        decided_at=record.decided_at,
        placer_id=record.placer_id,
        commit=record.commit,
    )


Repair = Literal["deleted", "bind"]


def repair(record: AssignmentRecord, pod: Pod | None) -> Repair | None:
    """What a new leader finishes of what a previous one left half done with ``record``: its
    pod is gone -> ``"deleted"`` (publish ``PodDeleted``); ``reserved`` but the pod already bound
    there, or ``bound`` but the pod not bound yet -> ``"bind"`` (handle its decision again)."""
    if pod is None:
        return "deleted"
    if (record.state == "reserved" and pod.node) or (record.state == "bound" and not pod.node):
        return "bind"
    return None


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
    ``services/placer/state.py``); a change here belongs there too."""
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
    decision: PlacementDecision,
    pod: ObservedPod | None,
    record: RecordView | None,
    node_records: Iterable[RecordView],
    resources: Collection[str],
    now: float,
) -> BindPlan:
    """The next step for ``decision`` (see the module docstring)."""
    if record is None or not of_commit(record.record, decision):
        # None yet, or an older commit's (released, and the record of this one replaces it; or
        # live, and reconciliation sorts the two out before this commit's record is written).
        return AwaitRecord(
            reason="no assignment record of this decision's commit",
            after=record.revision if record is not None else 0,
        )
    current = record.record
    if current.state == "released":
        return Drop(reason="the assignment record was released before the pod was bound")
    if not matches(current, decision):
        return Drop(reason="the assignment record no longer matches this decision")
    if pod is None or pod.uid != decision.pod_uid:
        return Report(outcome="gone", reason="the pod no longer exists")
    if pod.node and pod.node != decision.node:
        return Report(outcome="failed", reason=f"the pod is already bound to node {pod.node}")
    if pod.node:
        if current.state == "reserved":
            bound = msgspec.structs.replace(current, state="bound", bound_at=now)
            return Advance(claim=record, record=bound)
        return Report(outcome="bound", reason="already bound")
    if pod.terminating:
        return Report(outcome="gone", reason="the pod is being deleted")
    if current.state != "reserved":
        return Bind(claim=None, record=current, annotations=binding_annotations(current, now=now))
    held = blocker(current, node_records, resources)
    if held is not None:
        other = held.record
        return Wait(
            blocker=held,
            reason=f"waits for {other.namespace}/{other.name} on node {other.node} to be "
            "allocated first: their containers ask for the same number of devices with "
            "different GPU slices",
        )
    bound = msgspec.structs.replace(current, state="bound", bound_at=now)
    return Bind(claim=record, record=bound, annotations=binding_annotations(bound, now=now))
