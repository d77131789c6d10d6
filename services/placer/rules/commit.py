"""The commit protocol as pure functions: what to write to KV, and what to repair (no I/O).

A decision for pod P on node N is committed by two writes to ``tessera-ledger`` (one atomic
batch on a replicated store), then the pod message is acked; when P's tenant has a quota, its
charge comes first:

0. **Charge** (``tessera-tenants``, the tenant's entry, compare-and-set): the charge of P's commit
   (GPU shares and memory) is added only if every charge of the entry *as read*, plus this one,
   fits in the quota (:func:`~.charges.charge_all`); a lost compare-and-set reads the entry again
   and checks again. This makes a quota exact across replicas, as the ledger makes GPUs exact. A
   tenant without a quota writes nothing here; the commits of one with one serialise on its entry
   (those of one replica in one write, like bookings). Charging *before* booking means a pod over
   its quota never holds node capacity, and every booking is covered: a release gives the booking
   back first and the charge after (:func:`~.charges.without_charge`).
1. **Book** (``book.<N>.<P>``, written only if the latest revision among N's bookings is still
   the one this replica holds: a compare-and-set on the node's bookings as a whole, one booking
   per write; the bookings of several decisions for N are checked together, :func:`book_all`).
   The booking takes the capacity. :func:`book_all` books it on N as the ledger holds it (never on
   this replica's guesses), and refuses it when N changed since the decision in a way that
   may change its choice of GPUs (:func:`stale_by`); a lost compare-and-set means another
   writer changed N first: N is read again and P decided again.
2. **Claim** (``claim.<P>``, create-only, or compare-and-set from ``requeued``): the claim names
   the one booking that places P. On a replicated store steps 1 and 2 are one atomic batch
   (:func:`book_and_claim`): two replicas that decided P at once on two nodes cannot both land
   theirs. On a single server the claim is the next write: both may book, but only one claim is
   created; :func:`claim_verdict` tells the other it lost, and it gives its booking back.

That is the whole commit: the booking of the commit P's claim names is the assignment at its
first stage, ``reserved``. The binder takes its work from the claims (a KV watch, and its
reconciliation when it becomes leader): it binds a placed claim's booking by writing its record
(``tessera-assignments``, ``<N>.<P>``) ``bound``, create-only (``shared.commits.record_action``),
so a bind happens once however often the binder sees the claim.

A release moves the other way and leaves a **fence**: the record of the released commit ends in
state ``released`` (written ``released`` when it did not exist yet), so a bind still on its way
cannot write its record afterwards. Where the key holds a released record of another commit, the
commit joins that record's fences (``AssignmentRecord.fenced``) instead of replacing it, which
would lift the other commit's fence. Order of the writes:

- pod deleted, or the binder says ``gone``: claim -> ``deleted``, fence the record, unbook;
- binder ``failed``, or a placed claim not bound within the reserve timeout: fence the record
  (for the timeout, only where the binder has not written it: the binder's write of the record
  and the fence are both first-writer-wins), claim -> ``requeued``, unbook, put the pod back on
  ``tessera.pods.pending`` (not a pod placed through the scheduler extender: kube-scheduler
  schedules it again, and its next bind takes the ``requeued`` claim).

Every release also gives the charge back, after the booking. The quota invariant (what the protocol
model checks after every step): a tenant's charges never add up to more than its quota, and every
live record of a tenant with a quota is charged. A charge is only ever taken off after its commit's
record was fenced or given back (or the claim names another commit, so that commit never gets a
record).

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
from services.placer.rules.translate import reservation_of
from shared.commits import record_of
from shared.messages.assignments import AssignmentRecord, released
from shared.messages.ledger import Booking, NodeLedger, PodClaim
from shared.messages.pods import PodPending

# --- ledger ----------------------------------------------------------------------------------


def booking_in(ledger: NodeLedger | None, pod_uid: str) -> Booking | None:
    """``pod_uid``'s booking on the ledger's node, if any."""
    if ledger is None:
        return None
    return next((b for b in ledger.bookings if b.pod_uid == pod_uid), None)


def booked_pods(ledger: NodeLedger | None) -> set[str]:
    """The pods the ledger's node holds a booking of."""
    return {b.pod_uid for b in ledger.bookings} if ledger is not None else set()


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
    pending: frozenset[str] = frozenset(),
) -> tuple[NodeLedger | None, dict[str, str]]:
    """The node's ledger with every booking of ``bookings`` that fits, one after the other, on
    the node as the ledger holds it (``committed``); None when there is nothing to write.

    Also returns why each refused booking (by commit id) does not fit. A booking already in the
    ledger counts as booked (a retry). Several decisions for one node are committed by one
    compare-and-set this way (written together).

    ``seen``: for a booking's commit, the bookings (commit ids) its decision counted on the
    node: those in the ledger and this replica's own still being written (``pending`` now).
    The write goes at the entry's latest revision, not the decision's, so a decision may rest
    on a state that is gone: it may still fit, but its GPUs were chosen for that state. Where
    that may change the choice it is refused (:func:`stale_by`) and decided again on the node as
    it is.
    """
    refused: dict[str, str] = {}
    accepted: list[Booking] = []
    state = committed
    held = {b.pod_uid: b.commit for b in (ledger.bookings if ledger else ())}
    live = {*held.values(), *pending}
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
        stale = (
            stale_by(ledger, booking, known, live.difference(refused), accepted)
            if known is not None
            else ""
        )
        if stale:
            refused[booking.commit] = stale
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
    held = booked_pods(ledger)
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
    pending: frozenset[str] = frozenset(),
) -> tuple[NodeLedger | None, dict[str, PodClaim], dict[str, str]]:
    """What one atomic batch writes to commit ``bookings`` on one node (steps 1 and 2): the
    node's ledger with those that fit (:func:`book_all`; None: unchanged) and, by pod UID, the
    claim naming each one booked; and why each refused booking (by commit id) was refused.

    ``claims``: each pod's claim as last read; ``requests``: each commit's pod as pending;
    ``seen`` and ``pending``: as :func:`book_all` takes them. A
    booking whose pod's claim names another commit, or says the pod is gone, is neither booked
    nor refused: committing it goes on to find that in the claim (``claim_verdict``). One whose
    claim names it already (a retry whose batch landed) has nothing left to write.
    """
    to_book = [b for b in bookings if claim_verdict(claims.get(b.pod_uid), b) in ("create", "take")]
    written, refused = book_all(ledger, committed, to_book, now=now, seen=seen, pending=pending)
    claimed = {
        b.pod_uid: placed_claim(b, requests.get(b.commit), now=now)
        for b in to_book
        if b.commit not in refused
    }
    return written, claimed, refused


def stale_by(
    ledger: NodeLedger | None,
    booking: Booking,
    seen: frozenset[str],
    live: set[str],
    beside: Sequence[Booking] = (),
) -> str:
    """Why the state ``booking`` was decided on (``seen``) is gone, or "".

    - A booking of another placer that the decision did not see, on one of its GPUs (two
      ``spread`` pods on one GPU); or, where both started sharing a GPU idle in that state,
      on another: slices packed by two replicas, each onto a GPU of its own, where one GPU
      would hold them all and the other stay whole.
    - A booking the decision counted that is no longer ``live`` (in the ledger or still being
      written): refused or given back, its GPUs were chosen beside it.

    ``beside``: this placer's bookings accepted before it in the same write. Its own bookings
    decided later never count: each of its decisions counts the ones before it and is counted
    by the ones after."""
    held = ledger.bookings if ledger else ()
    counted = {g for b in (*held, *beside) if b.commit in seen for g in _gpus(b)}
    mine = _gpus(booking)
    started = _started(booking, counted)
    for other in held:
        if other.placer_id == booking.placer_id or other.commit in seen:
            continue
        if mine & _gpus(other):
            return (
                f"commit {other.commit} of {other.placer_id} booked the same GPUs after this "
                "decision"
            )
        if started and _started(other, counted):
            return (
                f"commit {other.commit} of {other.placer_id} started sharing another idle GPU "
                "after this decision"
            )
    gone = min(seen - live, default="")
    return f"commit {gone} that this decision counted on the node is not booked" if gone else ""


def _gpus(booking: Booking) -> set[str]:
    return {s.uuid for c in booking.containers for s in c.gpus}


def _started(booking: Booking, held: set[str]) -> bool:
    """Whether ``booking`` shares a GPU none of ``held`` was on."""
    return any(not s.exclusive and s.uuid not in held for c in booking.containers for s in c.gpus)


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
    return released(base or record_of(booking, state="reserved"), now=now)


# --- message ids -----------------------------------------------------------------------------


def requeue_msg_id(booking: Booking) -> str:
    return f"requeue.{booking.pod_uid}.{booking.commit}"
