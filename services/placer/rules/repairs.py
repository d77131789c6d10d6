"""Reconciliation as pure functions: what a placer killed between two writes of the commit
protocol left behind, and how to finish or undo it (no I/O). ``commit.py`` has the protocol;
:func:`plan_repairs` and :func:`plan_charge_repairs` run at start, before the placer is ready,
and then periodically."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from services.placer.core.groups import TenantQuota
from services.placer.rules.charges import charge_of, counts_against
from shared.messages.assignments import AssignmentRecord, AssignmentState
from shared.messages.ledger import Booking, PodClaim, TenantCharge, TenantLedger
from shared.subjects import assignment_key

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
      claim for it (create-only: if another claim won, the booking is given back); the binder
      then binds it;
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
                # Without a record of its commit it waits for the binder (or the reserve timeout).
                record = by_key.get(assignment_key(node, b.pod_uid))
                if (
                    record is not None
                    and record.commit == b.commit
                    and not record.live
                    and settled(claim.updated_at, record.released_at or 0.0)
                ):
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
