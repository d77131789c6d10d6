"""The commit protocol as pure functions: what to write to KV, and what to repair (no I/O).

A decision for pod P on node N is committed in three writes, each a compare-and-set or a
create-only write, then published, then the pod message is acked; when P's tenant has a quota, a
fourth write comes first:

0. **Charge** (``tessera-tenants``, the tenant's entry, compare-and-set): the charge of P's
   commit (GPU shares and memory) is added only if every charge of the entry *as read*, plus this
   one, fits in the quota (:func:`charge_all`); a lost compare-and-set reads the entry again and
   checks again (the node choice does not depend on it, so P is not decided again unless the quota
   is full: then P waits like any pod over its quota). This is what makes a quota exact across
   replicas, the way the ledger makes GPUs exact: every replica's view may lag, the entry cannot.
   A tenant without a quota writes nothing here (no cost, no contention); the commits of a tenant
   with one serialise on its entry (those of one replica go in one write, like bookings), which
   lists one charge per placed pod that takes from the quota (at most :data:`MAX_TENANT_CHARGES`).
   Why charge *before* booking: a pod over its quota costs no ledger write and never holds node
   capacity, not even for a moment; and every booking of a charged commit is covered, so a release
   gives the booking back first and the charge after (:func:`without_charge`): usage never counts
   less than is held.
1. **Book** (``tessera-ledger``, N's entry, compare-and-set at the revision the decision saw; the
   bookings of several decisions for N may go in one write, :func:`book_all`): the booking takes
   the capacity. Before the write, :func:`check_booking` books it on N's state as
   the ledger holds it (never on this replica's guesses), so a write that would over-commit a
   GPU's memory, cores, logical slots or exclusivity is never attempted. A lost compare-and-set
   means another replica booked on N first: refresh N and decide P again.
2. **Claim** (``tessera-claims``, P's entry, create-only; or compare-and-set from ``requeued``):
   the claim names the one booking that places P. Two replicas that decided P at the same moment on
   two nodes both book, but only one claim is created: :func:`claim_verdict` tells the other that
   it lost, and it gives its booking back. This is what makes "one pod, one record" hold.
3. **Record** (``tessera-assignments``, ``<N>.<P>``, create-only): the ``reserved`` record the
   binder and the device plugin read, carrying the same commit id. A released record of an older
   commit at that key may be overwritten (P placed on N again after a requeue).

A release moves the other way and leaves a **fence**: the record of the released commit ends in
state ``released`` (written ``released`` when it did not exist yet), so a commit still on its way
cannot create its record afterwards (:func:`record_action`). Order of the writes:

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
placer killed between two writes leaves a state :func:`plan_repairs` (and, for charges,
:func:`plan_charge_repairs`) recognises (it runs at start, before the placer is ready, and then
periodically); and the un-acked pod message comes back to a replica that finds P's booking and
finishes the commit instead of deciding again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from services.placer.core.groups import TenantQuota
from services.placer.core.ledger import book
from services.placer.core.model import NodeState
from services.placer.core.quota import Usage, quota_reason, reservation_usage
from services.placer.translate import record_of, reservation_of
from shared.messages.assignments import AssignmentRecord, AssignmentState
from shared.messages.ledger import Booking, NodeLedger, PodClaim, TenantCharge, TenantLedger
from shared.messages.pods import PodPending
from shared.subjects import assignment_key
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


# --- tenant charges --------------------------------------------------------------------------

MAX_TENANT_CHARGES = 2000
"""Charges one tenant's entry holds at most (about 300 bytes each: 2,000 stay well inside NATS's
default 1 MiB message). One charge per placed pod that counts against the quota, so a quota of
more than this many GPU shares cannot be used up; a pod past it is refused with that reason
rather than by a KV write that fails."""


def charge_of(booking: Booking, *, now: float) -> TenantCharge:
    """What ``booking`` counts against its tenant's quota."""
    usage = reservation_usage(reservation_of(booking))
    return TenantCharge(
        pod_uid=booking.pod_uid,
        namespace=booking.namespace,
        name=booking.name,
        node=booking.node,
        commit=booking.commit,
        gpus=usage.gpus,
        gpu_memory_mib=usage.gpu_memory_mib,
        charged_at=now,
        placer_id=booking.placer_id,
    )


def counts_against(quota: TenantQuota, charge: TenantCharge) -> bool:
    """Whether ``charge`` takes anything ``quota`` limits (a pod without GPU memory takes nothing
    from a memory-only quota): only those are charged, so a tenant's entry never lists more
    charges than its quota could hold."""
    return (quota.gpus is not None and charge.gpus > 0) or (
        quota.gpu_memory_mib is not None and charge.gpu_memory_mib > 0
    )


def charge_usage(charge: TenantCharge) -> Usage:
    return Usage(gpus=charge.gpus, gpu_memory_mib=charge.gpu_memory_mib)


def charged(ledger: TenantLedger | None) -> Usage:
    """Everything ``ledger`` charges."""
    total = Usage()
    for charge in ledger.charges if ledger else ():
        total = total + charge_usage(charge)
    return total


def charge_all(
    ledger: TenantLedger | None,
    tenant: str,
    quota: TenantQuota | None,
    charges: Sequence[TenantCharge],
    *,
    now: float,
) -> tuple[TenantLedger | None, dict[str, str]]:
    """The tenant's entry with every charge of ``charges`` that fits in ``quota`` on top of what
    the entry holds, one after the other; None when there is nothing to write.

    Also returns why each refused charge (by commit id) does not fit. A charge of a commit the
    entry already lists counts as done (a retry). Several commits of one tenant are charged by one
    compare-and-set this way (a group commit, like :func:`book_all`).
    """
    refused: dict[str, str] = {}
    accepted: list[TenantCharge] = []
    used = charged(ledger)
    listed = {c.commit for c in (ledger.charges if ledger else ())}
    for charge in charges:
        if charge.commit in listed:
            continue
        asked = charge_usage(charge)
        reason = quota_reason(quota, used, asked)
        if not reason and len(listed) >= MAX_TENANT_CHARGES:
            reason = (
                f"tenant {tenant}: {len(listed)} placements are charged against its quota, the "
                f"most one usage entry holds"
            )
        if reason:
            refused[charge.commit] = reason
            continue
        used = used + asked
        listed.add(charge.commit)
        accepted.append(charge)
    if not accepted:
        return None, refused
    kept = ledger.charges if ledger else ()
    return TenantLedger(tenant=tenant, charges=(*kept, *accepted), updated_at=now), refused


def with_charge(
    ledger: TenantLedger | None, tenant: str, charge: TenantCharge, *, now: float
) -> TenantLedger | None:
    """The entry with ``charge`` added whatever the quota (a placement that already exists is
    counted, it is not refused); None when it is listed already."""
    if ledger is not None and any(c.commit == charge.commit for c in ledger.charges):
        return None
    kept = ledger.charges if ledger else ()
    return TenantLedger(tenant=tenant, charges=(*kept, charge), updated_at=now)


def without_charge(ledger: TenantLedger | None, commit: str, *, now: float) -> TenantLedger | None:
    """The entry without the charge of ``commit``; None: it holds none (nothing to write)."""
    if ledger is None:
        return None
    kept = tuple(c for c in ledger.charges if c.commit != commit)
    if len(kept) == len(ledger.charges):
        return None
    return TenantLedger(tenant=ledger.tenant, charges=kept, updated_at=now)


def fence_of(charge: TenantCharge, tenant: str) -> Booking:
    """The booking-shaped fence of a charge whose commit never booked: what :func:`released_record`
    needs to leave the commit's record ``released`` (it holds no GPUs)."""
    return Booking(
        pod_uid=charge.pod_uid,
        namespace=charge.namespace,
        name=charge.name,
        node=charge.node,
        commit=charge.commit,
        tenant=tenant,
        decided_at=charge.charged_at,
        placer_id=charge.placer_id,
    )


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
    return "write" if may_replace(current, commit) else "blocked"


FenceAction = Literal["write", "done", "blocked"]


def fence_action(current: AssignmentRecord | None, commit: str) -> FenceAction:
    """For releasing the record of ``commit``: ``write`` the released record (create it, or
    compare-and-set over the live one or over a released one of an older commit); ``done``;
    ``blocked``: a live record of another commit (not this commit's to release)."""
    if current is None:
        return "write"
    if current.commit == commit or not current.commit:
        return "done" if current.state == "released" else "write"
    return "write" if current.state == "released" else "blocked"


def released(record: AssignmentRecord, *, now: float) -> AssignmentRecord:
    """``record`` released at ``now``: the one transition every release writes."""
    return msgspec.structs.replace(record, state="released", released_at=now)


def released_record(
    current: AssignmentRecord | None, booking: Booking, *, now: float
) -> AssignmentRecord:
    """The fence for ``booking``: its record (or a fresh one) in state ``released``."""
    base = current if current is not None and current.commit == booking.commit else None
    return released(base or record_of(booking), now=now)


# --- message ids -----------------------------------------------------------------------------


def decision_msg_id(booking: Booking) -> str:
    """JetStream de-duplication id of a decision: every replica that publishes the same commit
    (a retry, a repair) publishes the same id."""
    return f"decision.{booking.pod_uid}.{booking.commit}"


def requeue_msg_id(booking: Booking) -> str:
    return f"requeue.{booking.pod_uid}.{booking.commit}"


# --- reconciliation --------------------------------------------------------------------------


class RecordFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What reconciliation needs of one assignment record (the cache keeps only this)."""

    key: str
    node: str
    pod_uid: str
    state: AssignmentState
    commit: str
    decided_at: float
    bound_at: float | None = None
    released_at: float | None = None
    revision: int = 0
    seen_at: float = 0.0
    """When this placer first saw the key live (its clock; 0 = unknown). The record's own dates
    are its writer's word: a made-up record may date itself in the future."""

    @property
    def live(self) -> bool:
        return self.state != "released"

    @property
    def observed_at(self) -> float:
        """Since when the record is known: when seen, else its decision time."""
        return self.seen_at or self.decided_at


def record_facts(
    key: str, record: AssignmentRecord, revision: int, *, seen_at: float = 0.0
) -> RecordFacts:
    return RecordFacts(
        key=key,
        node=record.node,
        pod_uid=record.pod_uid,
        state=record.state,
        commit=record.commit,
        decided_at=record.decided_at,
        bound_at=record.bound_at,
        released_at=record.released_at,
        revision=revision,
        seen_at=seen_at,
    )


RepairKind = Literal[
    "roll-forward",
    "create-record",
    "unbook-stale",
    "rebook",
    "finish-requeue",
    "publish-requeue",
    "release-record",
    "requeue-lost",
    "adopt-charge",
    "drop-charge",
]


class Repair(msgspec.Struct, frozen=True, kw_only=True):
    """One repair :func:`plan_repairs` asks the shell to carry out with the usual primitives.

    - ``roll-forward``: a booking no claim names yet (a placer stopped after booking): create the
      claim for it (create-only: if another claim won, the booking is given back), then its record;
    - ``create-record``: the claim names the booking but its record is missing: create it;
    - ``unbook-stale``: a booking the claim does not name (lost claim, requeued, deleted): fence
      its record and give it back;
    - ``rebook``: a live record whose booking is missing from the ledger: book it again;
    - ``finish-requeue``: the record of the claimed booking was released (failed binding, reserve
      timeout) but the claim still says placed: requeue the pod;
    - ``publish-requeue``: a requeued pod that was not put back on ``tessera.pods.pending`` yet;
    - ``release-record``: a live record whose commit the claim no longer names (on the claim's
      node), or that no claim names at all: a record no placer committed (issue 19: anyone
      allowed to write records could make one up), released once this placer has known it for
      the grace period;
    - ``requeue-lost``: a placed claim with neither booking nor live record: requeue the pod;
    - ``adopt-charge``: a booked placement with a live record whose tenant has a quota but whose
      commit is not charged (placed before the quota existed, or by a replica that had not read it
      yet): charge it, whatever the quota (what is allocated stays allocated);
    - ``drop-charge``: a charge whose commit is neither booked, nor recorded live, nor named by a
      placed claim (a placer stopped between charging and booking, or a release between booking
      and charging): fence its record, then take the charge off.
    """

    kind: RepairKind
    pod_uid: str
    booking: Booking | None = None
    record_key: str = ""
    charge: TenantCharge | None = None
    tenant: str = ""


def plan_repairs(
    ledgers: Mapping[str, Sequence[Booking]],
    claims: Mapping[str, PodClaim],
    records: Iterable[RecordFacts],
    *,
    now: float,
    grace_s: float,
) -> list[Repair]:
    """Repairs that bring ledgers, claims and records back to agreement (see :class:`Repair`).

    Only states older than ``grace_s`` are repaired, so a commit or a release still in flight in
    some replica is not raced (racing would be safe, only wasted work).
    """

    def settled(*stamps: float) -> bool:
        return now - max(stamps) >= grace_s

    repairs: list[Repair] = []
    by_key: dict[str, RecordFacts] = {}
    for facts in records:
        by_key[facts.key] = facts
    booked: dict[str, set[str]] = {}
    for node, bookings in sorted(ledgers.items()):
        for b in bookings:
            booked.setdefault(b.pod_uid, set()).add(b.commit)
            claim = claims.get(b.pod_uid)
            if claim is None:
                if settled(b.decided_at):
                    repairs.append(Repair(kind="roll-forward", pod_uid=b.pod_uid, booking=b))
                continue
            named = claim.booking
            if claim.state == "placed" and named is not None and named.commit == b.commit:
                record = by_key.get(assignment_key(node, b.pod_uid))
                if record is None or record.commit != b.commit:
                    if settled(b.decided_at, claim.updated_at):
                        repairs.append(Repair(kind="create-record", pod_uid=b.pod_uid, booking=b))
                elif not record.live and settled(claim.updated_at, record.released_at or 0.0):
                    repairs.append(Repair(kind="finish-requeue", pod_uid=b.pod_uid, booking=b))
                continue
            if settled(b.decided_at, claim.updated_at):
                repairs.append(Repair(kind="unbook-stale", pod_uid=b.pod_uid, booking=b))
    for uid, claim in sorted(claims.items()):
        named = claim.booking
        if named is None:
            continue
        key = assignment_key(named.node, uid)
        record = by_key.get(key)
        live_here = record is not None and record.live and record.commit == named.commit
        if claim.state == "placed":
            if named.commit in booked.get(uid, ()):
                continue
            if live_here:
                repairs.append(Repair(kind="rebook", pod_uid=uid, booking=named))
            elif settled(claim.updated_at):
                repairs.append(Repair(kind="requeue-lost", pod_uid=uid, booking=named))
            continue
        if live_here and settled(claim.updated_at):
            repairs.append(Repair(kind="release-record", pod_uid=uid, record_key=key))
        if (
            claim.state == "requeued"
            and not claim.requeue_published
            and claim.request is not None
            and not claim.request.extender  # kube-scheduler places it again by itself
            and settled(claim.updated_at)
        ):
            repairs.append(Repair(kind="publish-requeue", pod_uid=uid, booking=named))
    for record in sorted(by_key.values(), key=lambda r: r.key):
        if not record.live:
            continue
        claim = claims.get(record.pod_uid)
        named = claim.booking if claim is not None else None
        if named is not None and (named.commit, named.node) == (record.commit, record.node):
            continue
        stamps = (record.observed_at,) if claim is None else (record.observed_at, claim.updated_at)
        if settled(*stamps):
            repairs.append(
                Repair(kind="release-record", pod_uid=record.pod_uid, record_key=record.key)
            )
    return repairs


def plan_charge_repairs(
    tenants: Mapping[str, TenantLedger],
    quotas: Mapping[str, TenantQuota],
    ledgers: Mapping[str, Sequence[Booking]],
    claims: Mapping[str, PodClaim],
    records: Iterable[RecordFacts],
    *,
    now: float,
    grace_s: float,
) -> list[Repair]:
    """Repairs that bring the tenants' charges back to what is booked and recorded: derived again
    from the ledger, the claims and the records (``adopt-charge``, ``drop-charge`` in
    :class:`Repair`). ``quotas``: the quota of each tenant that has one now.

    Only states older than ``grace_s`` are repaired: a commit charges a moment before it books.
    Racing one that is slower than that is still safe: the charge goes only after the fence, and
    the fenced commit never gets a live record.
    """
    live = {r.commit for r in records if r.live and r.commit}
    placed = {
        c.booking.commit for c in claims.values() if c.state == "placed" and c.booking is not None
    }
    booked: dict[str, Booking] = {}
    for node in sorted(ledgers):
        for b in ledgers[node]:
            booked[b.commit] = b
    repairs: list[Repair] = []
    listed: set[str] = set()
    for tenant in sorted(tenants):
        for charge in tenants[tenant].charges:
            listed.add(charge.commit)
            if charge.commit in booked or charge.commit in live or charge.commit in placed:
                continue
            if now - charge.charged_at >= grace_s:
                repairs.append(
                    Repair(kind="drop-charge", pod_uid=charge.pod_uid, charge=charge, tenant=tenant)
                )
    for commit_id, b in booked.items():
        quota = quotas.get(b.tenant)
        if quota is None or commit_id in listed or commit_id not in live:
            continue
        if not counts_against(quota, charge_of(b, now=now)) or now - b.decided_at < grace_s:
            continue
        repairs.append(Repair(kind="adopt-charge", pod_uid=b.pod_uid, booking=b, tenant=b.tenant))
    return repairs
