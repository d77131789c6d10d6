"""The commit protocol as pure functions: what to write to KV, and what to repair (no I/O).

A decision for pod P on node N is committed in three writes, each a compare-and-set or a
create-only write (the first two in one batch on a replicated store), the decision published
beside the last one, then the pod message is acked;
when P's tenant has a quota, a fourth write comes first:

0. **Charge** (``tessera-tenants``, the tenant's entry, compare-and-set): the charge of P's commit
   (GPU shares and memory) is added only if every charge of the entry *as read*, plus this one,
   fits in the quota (:func:`~.charges.charge_all`); a lost compare-and-set reads the entry again
   and checks again (the node choice does not depend on it, so P is not decided again unless the
   quota is full: then P waits like any pod over its quota). This is what makes a quota exact
   across replicas, the way the ledger makes GPUs exact: every replica's view may lag, the entry
   cannot. A tenant without a quota writes nothing here (no cost, no contention); the commits of a
   tenant with one serialise on its entry (those of one replica go in one write, like bookings),
   which lists one charge per placed pod that takes from the quota (at most
   :data:`~.charges.MAX_TENANT_CHARGES`). Why charge *before* booking: a pod over its quota costs
   no ledger write and never holds node capacity, not even for a moment; and every booking of a
   charged commit is covered, so a release gives the booking back first and the charge after
   (:func:`~.charges.without_charge`): usage never counts less than is held.
1. **Book** (``tessera-ledger``, P's booking under N, ``book.<N>.<P>``, written only if the
   latest revision among N's bookings is still the one the decision saw: a compare-and-set on the
   node's bookings as a whole, one booking per write, so an entry never grows with the node;
   the bookings of several decisions for N are checked together, :func:`book_all`, and written
   in one batch on a replicated store, one after the other on one server): the booking takes the
   capacity. Before the write, :func:`check_booking` books it on N's state as
   the ledger holds it (never on this replica's guesses), so a write that would over-commit a
   GPU's memory, cores, logical slots or exclusivity is never attempted. A lost compare-and-set
   means another replica booked on N first: refresh N and decide P again.
2. **Claim** (``tessera-ledger`` too, P's claim, ``claim.<P>``, create-only; or compare-and-set
   from ``requeued``): the claim names the one booking that places P. On a replicated store
   (``Store.book``) steps 1 and 2 are one atomic batch (:func:`book_and_claim`), one round trip:
   two replicas that decided P at the same moment on two nodes cannot both land theirs; the loser
   lands nothing, reads P's claim and finds the winner's commit there. On a single server the
   claim is the next write: both book, but only one claim is created, :func:`claim_verdict` tells
   the other that it lost, and it gives its booking back. Either way, this is what makes "one
   pod, one record" hold.
3. **Record** (``tessera-assignments``, ``<N>.<P>``, create-only): the ``reserved`` record the
   binder and the device plugin read, carrying the same commit id. A released record of an older
   commit at that key may be overwritten (P placed on N again after a requeue) unless it fences
   this commit too; the new record carries its fences on (:func:`placed_over`). The decision is
   published at the same time, not after the record's write came back (one serial round trip
   fewer): the binder binds a record, never a decision alone. It waits for a record that has
   not reached it yet for as long as P's claim names this commit (the record comes: its write
   lands late, or the repair of a placer stopped between the two writes it), and drops the
   decision once the claim names none (the commit was released: no record will come).

A release moves the other way and leaves a **fence**: the record of the released commit ends in
state ``released`` (written ``released`` when it did not exist yet), so a commit still on its way
cannot create its record afterwards (:func:`record_action`). Where the key holds a released
record of another commit, the commit joins that record's fences (``AssignmentRecord.fenced``)
instead of replacing it, which would lift the other commit's fence. Order of the writes:

- pod deleted, or the binder says ``gone``: claim -> ``deleted``, fence the record, unbook;
- binder ``failed``, or a ``reserved`` record never bound within the reserve timeout: record ->
  ``released`` (for the timeout, only from ``reserved``: the binder's ``reserved -> bound``
  compare-and-set fences the timeout), claim -> ``requeued``, unbook, put the pod back on
  ``tessera.pods.pending`` (not a pod placed through the scheduler extender: kube-scheduler
  schedules it again, and its next bind takes the ``requeued`` claim).

Every release also gives the charge back, after the booking. The quota invariant (what the protocol
model checks after every step): a tenant's charges never add up to more than its quota, and every
live record of a tenant with a quota is charged. A charge is only ever taken off after its commit's
record was fenced or given back (or the claim names another commit, so that commit never gets a
record), which is why a commit slower than reconciliation cannot end with a live record whose
charge another pod's commit has taken since.

Every step is idempotent and every later step can be redone from what the earlier ones wrote, so a
placer killed between two writes leaves a state :func:`~.repairs.plan_repairs` (and, for charges,
:func:`~.repairs.plan_charge_repairs`) recognises (it runs at start, before the placer is ready,
and then periodically); and the un-acked pod message comes back to a replica that finds P's booking
and finishes the commit instead of deciding again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from services.placer.core.ledger import book
from services.placer.core.model import NodeState
from services.placer.translate import record_of, reservation_of
from shared.messages.assignments import AssignmentRecord, released
from shared.messages.ledger import Booking, NodeLedger, PodClaim
from shared.messages.pods import PodPending
from shared.validation import may_replace

# --- ledger ----------------------------------------------------------------------------------


def booking_in(ledger: NodeLedger | None, pod_uid: str) -> Booking | None:
    """``pod_uid``'s booking on the ledger's node, if any."""
    if ledger is None:
        return None
    return next((b for b in ledger.bookings if b.pod_uid == pod_uid), None)


def check_booking(committed: NodeState, booking: Booking) -> str:
    """Empty when ``booking`` fits on the node as the ledger holds it, else why it does not."""
    booked = book(committed, reservation_of(booking))
    return booked if isinstance(booked, str) else ""


def book_all(
    ledger: NodeLedger | None,
    committed: NodeState | None,
    bookings: Sequence[Booking],
    *,
    now: float,
    seen: Mapping[str, frozenset[str]] | None = None,
) -> tuple[NodeLedger | None, dict[str, str]]:
    """The node's ledger with every booking of ``bookings`` that fits, one after the other, on
    the node as the ledger holds it (``committed``); None when there is nothing to write.

    Also returns why each refused booking (by commit id) does not fit. A booking already in the
    ledger counts as booked (a retry). Several decisions for one node are committed by one
    compare-and-set this way (a group commit).

    ``seen``: for a booking's commit, the bookings (commit ids) on the node when it was decided.
    The write goes at the entry's latest revision, not the decision's, so a decision may have
    been made before another placer booked on the same GPUs: it would still fit, but was chosen
    on a state that is gone (two ``spread`` pods on one GPU). It is refused (:func:`stale_by`)
    and decided again on the node as it is.
    """
    refused: dict[str, str] = {}
    accepted: list[Booking] = []
    state = committed
    held = {b.pod_uid: b.commit for b in (ledger.bookings if ledger else ())}
    for booking in bookings:
        if booking.pod_uid in held:
            if held[booking.pod_uid] != booking.commit:
                refused[booking.commit] = (
                    f"pod already booked on {booking.node} by commit {held[booking.pod_uid]}"
                )
            continue
        if state is None:
            refused[booking.commit] = "node left the cluster"
            continue
        known = (seen or {}).get(booking.commit)
        newer = stale_by(ledger, booking, known) if known is not None else None
        if newer is not None:
            refused[booking.commit] = (
                f"commit {newer.commit} of {newer.placer_id} booked the same GPUs after this "
                "decision"
            )
            continue
        booked = book(state, reservation_of(booking))
        if isinstance(booked, str):
            refused[booking.commit] = booked
            continue
        state = booked
        held[booking.pod_uid] = booking.commit
        accepted.append(booking)
    if not accepted:
        return None, refused
    kept = ledger.bookings if ledger else ()
    return (
        NodeLedger(node=accepted[0].node, bookings=(*kept, *accepted), updated_at=now),
        refused,
    )


def added_bookings(ledger: NodeLedger | None, written: NodeLedger | None) -> list[Booking]:
    """The bookings ``written`` (a ledger :func:`book_all` gave) holds and ``ledger`` does not:
    what is left to write, each to its own key."""
    if written is None:
        return []
    held = {b.pod_uid for b in (ledger.bookings if ledger else ())}
    return [b for b in written.bookings if b.pod_uid not in held]


def book_and_claim(
    ledger: NodeLedger | None,
    committed: NodeState | None,
    bookings: Sequence[Booking],
    claims: Mapping[str, PodClaim | None],
    requests: Mapping[str, PodPending | None],
    *,
    now: float,
    seen: Mapping[str, frozenset[str]] | None = None,
) -> tuple[NodeLedger | None, dict[str, PodClaim], dict[str, str]]:
    """What one atomic batch writes to commit ``bookings`` on one node (steps 1 and 2): the
    node's ledger with those that fit (:func:`book_all`; None: unchanged) and, by pod UID, the
    claim naming each one booked; and why each refused booking (by commit id) was refused.

    ``claims``: each pod's claim as last read; ``requests``: each commit's pod as pending. A
    booking whose pod's claim names another commit, or says the pod is gone, is neither booked
    nor refused: committing it goes on to find that in the claim (``claim_verdict``). One whose
    claim names it already (a retry whose batch landed) has nothing left to write.
    """
    to_book = [b for b in bookings if claim_verdict(claims.get(b.pod_uid), b) in ("create", "take")]
    written, refused = book_all(ledger, committed, to_book, now=now, seen=seen)
    claimed = {
        b.pod_uid: placed_claim(b, requests.get(b.commit), now=now)
        for b in to_book
        if b.commit not in refused
    }
    return written, claimed, refused


def stale_by(ledger: NodeLedger | None, booking: Booking, seen: frozenset[str]) -> Booking | None:
    """A booking of another placer on one of ``booking``'s GPUs that its decision did not see
    (not in ``seen``), or None. This placer's own bookings never count: each of its decisions
    counts the ones before it (tentative in its view) and is counted by the ones after."""
    if ledger is None:
        return None
    gpus = {s.uuid for c in booking.containers for s in c.gpus}
    for other in ledger.bookings:
        if other.placer_id == booking.placer_id or other.commit in seen:
            continue
        if any(s.uuid in gpus for c in other.containers for s in c.gpus):
            return other
    return None


def with_booking(ledger: NodeLedger | None, booking: Booking, *, now: float) -> NodeLedger:
    """The node's ledger with ``booking`` added (replacing an older booking of the same pod)."""
    kept = tuple(b for b in (ledger.bookings if ledger else ()) if b.pod_uid != booking.pod_uid)
    return NodeLedger(node=booking.node, bookings=(*kept, booking), updated_at=now)


def without_booking(
    ledger: NodeLedger | None, pod_uid: str, *, commit: str | None, now: float
) -> NodeLedger | None:
    """The ledger without ``pod_uid``'s booking (of ``commit``, when given); None: unchanged."""
    if ledger is None:
        return None
    kept = tuple(
        b
        for b in ledger.bookings
        if not (b.pod_uid == pod_uid and (commit is None or b.commit == commit))
    )
    if len(kept) == len(ledger.bookings):
        return None
    return NodeLedger(node=ledger.node, bookings=kept, updated_at=now)


# --- claims ----------------------------------------------------------------------------------

ClaimVerdict = Literal["create", "take", "mine", "lost", "deleted"]
"""What to do about P's claim when committing a booking of P:

- ``create``: no claim yet; create it (create-only);
- ``take``: the claim is ``requeued``; take it by compare-and-set at its revision;
- ``mine``: the claim already names this booking (a retry, or a repair got there first);
- ``lost``: the claim names another booking: give this one back;
- ``deleted``: the pod is gone: give this booking back."""


def claim_verdict(claim: PodClaim | None, booking: Booking) -> ClaimVerdict:
    if claim is None:
        return "create"
    if claim.state == "deleted":
        return "deleted"
    if claim.state == "requeued":
        return "take"
    if claim.booking is not None and claim.booking.commit == booking.commit:
        return "mine"
    return "lost"


def placed_claim(booking: Booking, request: PodPending | None, *, now: float) -> PodClaim:
    return PodClaim(
        pod_uid=booking.pod_uid, state="placed", booking=booking, request=request, updated_at=now
    )


def requeued_claim(claim: PodClaim, *, reason: str, now: float) -> PodClaim:
    return msgspec.structs.replace(
        claim, state="requeued", reason=reason, updated_at=now, requeue_published=False
    )


def deleted_claim(pod_uid: str, claim: PodClaim | None, *, reason: str, now: float) -> PodClaim:
    """The tombstone: keeps the last booking so the release steps can still be redone."""
    return PodClaim(
        pod_uid=pod_uid,
        state="deleted",
        booking=claim.booking if claim is not None else None,
        request=None,
        updated_at=now,
        reason=reason,
    )


# --- records ---------------------------------------------------------------------------------

RecordAction = Literal["write", "done", "released", "blocked"]
"""For creating the ``reserved`` record of a booking: ``write`` it (create-only when the key is
empty, else compare-and-set over a released record of an older commit); ``done``: it exists;
``released``: this commit was already released (a fence): do not publish; ``blocked``: a live
record of another commit holds the key (a repair must sort it out first)."""


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


FenceAction = Literal["write", "done", "blocked"]


def fence_action(current: AssignmentRecord | None, commit: str) -> FenceAction:
    """For releasing the record of ``commit``: ``write`` the released record (create it, or
    compare-and-set over the live one, or add ``commit`` to the fences of a released one of
    another commit); ``done``; ``blocked``: a live record of another commit (not this commit's
    to release)."""
    if current is None:
        return "write"
    if current.commit == commit or not current.commit:
        return "done" if current.state == "released" else "write"
    if current.state != "released":
        return "blocked"
    return "done" if commit in current.fenced else "write"


def released_record(
    current: AssignmentRecord | None, booking: Booking, *, now: float
) -> AssignmentRecord:
    """The fence for ``booking``: its record (or a fresh one) in state ``released``; where the key
    holds a released record of another commit, that record with ``booking``'s commit added to
    its fences. Replacing it would lift its own fence: a commit of it still on its way (a
    roll-forward that read its claim while it was placed) could then write its record again
    after its booking was given back (the protocol model's explore run found that)."""
    if (
        current is not None
        and current.commit
        and current.commit != booking.commit
        and current.state == "released"
    ):
        return msgspec.structs.replace(current, fenced=(*current.fenced, booking.commit))
    base = current if current is not None and current.commit == booking.commit else None
    return released(base or record_of(booking), now=now)


# --- message ids -----------------------------------------------------------------------------


def decision_msg_id(booking: Booking) -> str:
    """JetStream de-duplication id of a decision: every replica that publishes the same commit
    (a retry, a repair) publishes the same id."""
    return f"decision.{booking.pod_uid}.{booking.commit}"


def requeue_msg_id(booking: Booking) -> str:
    return f"requeue.{booking.pod_uid}.{booking.commit}"
