"""The commit protocol's steps over KV (``commit.py`` has the rules and why they are safe).

:class:`CommitProtocol` carries out, with :class:`~.store.Store`'s certain-outcome writes, every
multi-write step of the protocol: finishing a booked decision (its claim), giving a placement
back (deleted or requeued: the booking, then the tenant's charge), the repairs reconciliation
plans (the tenants' charges included), and purging what is past its retention. It
knows nothing of pod messages: the service acks or naks them by what these steps return, so the same
steps serve a decision, a redelivery, a repair and the extender, and a test can drive several
replicas' steps in any interleaving (``tests/placer/test_protocol_model.py``).
"""

from __future__ import annotations

import logging
from typing import Literal

import msgspec

from services.placer.metrics import PlacerMetrics
from services.placer.rules import charges, commit, repairs, translate
from services.placer.rules.state import ClusterView
from services.placer.writes import ConflictError, GaveUpError, Store
from shared import codec, subjects
from shared.clock import Clock
from shared.messages.assignments import AssignmentRecord, released
from shared.messages.ledger import Booking, PodClaim, TenantCharge
from shared.messages.pods import PodPending, PodRestore
from shared.runtime.bus import Bus

log = logging.getLogger(__name__)

STALE_REPORT_S = 30.0
"""Clock difference between binder and placer tolerated when telling a stale binding result."""

FinishOutcome = Literal["placed", "duplicate", "deleted"]
Refusal = Literal["", "quota", "node"]
"""Why a commit could not book: its tenant's quota, or the node (no room, or its ledger changed
first)."""


class CommitProtocol:
    """The protocol's steps for one replica (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        bus: Bus,
        view: ClusterView,
        clock: Clock,
        metrics: PlacerMetrics,
    ) -> None:
        self.store = store
        self.bus = bus
        self.view = view
        self.clock = clock
        self.metrics = metrics

    # --- committing ----------------------------------------------------------------------------

    async def book(
        self,
        booking: Booking,
        *,
        request: PodPending | None = None,
        seen: frozenset[str] | None = None,
    ) -> tuple[Refusal, str]:
        """Charge the tenant's quota (when it has one), then book on the node (``commit.py``
        steps 0 and 1; and 2, the claim, in the booking's batch where the store takes one:
        ``Store.book``). Returns ("", "") when booked, else what refused it and why.
        ``request``: the pod as pending (for its claim); ``seen``: the bookings its decision counted
        on the node (``Store.book``).

        A charge whose booking did not land is given back at once (what is charged always covers
        what is booked, never much more); a booking whose answer was lost but which landed keeps
        its charge: the pod is decided again, finds the booking and finishes that commit.
        """
        over = await self.store.charge(booking)
        if over:
            return "quota", over
        try:
            refused = await self.store.book(booking, request=request, seen=seen)
        except ConflictError:
            refused = "the node's ledger changed"
        if not refused:
            return "", ""
        held = commit.booking_in(self.view.ledger(booking.node)[0], booking.pod_uid)
        if held is None or held.commit != booking.commit:
            await self.store.uncharge(booking)
        return "node", refused

    async def finish(
        self, booking: Booking, request: PodPending | None
    ) -> tuple[FinishOutcome, Booking]:
        """Claim the pod for a booking already in the ledger (``commit.py`` step 2; done already
        where the booking's batch claimed it): the commit is then complete, and the binder binds
        it.

        Returns the outcome and the booking that places the pod: another replica's when this
        one lost the claim (this booking is then given back, and the winner's kept booked).
        """
        verdict, claim = await self.store.claim(booking, request)
        if verdict in ("lost", "deleted"):
            # Fence first, as every release does: another task may have claimed this commit
            # (a reconciliation rolling it forward from ``requeued``), and a binder must never
            # write the record of a booking that is given back.
            await self.store.fence(booking)
            await self.give_back(booking)
        if verdict == "lost":
            assert claim is not None and claim.booking is not None
            await self.keep_booked(claim.booking)
            return "duplicate", claim.booking
        if verdict == "deleted":
            return "deleted", booking
        return "placed", booking

    async def restore(self, restore: PodRestore) -> Literal["restored", "claimed elsewhere"]:
        """Charge, book, record and claim a placement the binder restored from the Kubernetes
        API into a store that lost it (docs/design.md §12), whatever the node's ledger and the
        tenant's quota hold now: its pod runs there. The record comes before the claim, in the
        state the hand-off had reached: the binder, which binds placed claims, then finds the
        pod's record and writes nothing. Every step is idempotent (a redelivery, or two replicas
        at once, change nothing more)."""
        tenant = self.view.tenancy.tenant_of(translate.pod_request(restore.pod)).tenant
        booking = translate.restored_booking(restore, tenant=tenant)

        def same_store() -> None:
            if self.bus.store_epoch != restore.epoch:  # lost again: the restore comes again
                raise GaveUpError("NATS lost its store during a restore")

        if booking.tenant and self.view.tenancy.quota_of(booking.tenant) is not None:
            await self.store.adopt_charge(booking)
        same_store()
        await self.store.restore_booking(booking)
        same_store()
        await self.store.restore_record(booking, restore)
        same_store()
        verdict, claim = await self.store.claim(booking, restore.pod)
        if verdict != "mine":  # another commit's claim (a restore of another store's epoch)
            log.error(
                "a restored placement is claimed by another commit; left as it is",
                extra={"pod_uid": booking.pod_uid, "claim": repr(claim)},
            )
            return "claimed elsewhere"
        return "restored"

    async def keep_booked(self, booking: Booking) -> str:
        """The pod is placed by ``booking`` already (a redelivery, another replica won): make
        sure it is booked (a release of another commit of the pod may have raced it). Returns
        why it could not be booked again ("" when it is booked)."""
        if booking.commit in {b.commit for b in self.view.bookings_of(booking.pod_uid)}:
            return ""
        refused = await self.store.rebook(booking)
        if refused:
            log.error(
                "a placed pod's booking is missing and cannot be booked again",
                extra={"pod_uid": booking.pod_uid, "node": booking.node, "reason": refused},
            )
        return refused

    # --- releasing -----------------------------------------------------------------------------

    async def give_back(self, booking: Booking) -> None:
        """Take ``booking`` off its node's ledger, then its charge off its tenant's entry (in
        this order: what is charged always covers what is booked)."""
        await self.store.unbook(booking)
        await self.store.uncharge(booking)

    async def release_deleted(self, pod_uid: str, *, reason: str) -> list[Booking]:
        """The pod is gone: claim -> deleted, records fenced released, bookings removed.

        Returns the bookings given back.
        """
        now = self.clock.now()

        def tombstone(claim: PodClaim | None) -> PodClaim | None:
            if claim is not None and claim.state == "deleted":
                return None
            return commit.deleted_claim(pod_uid, claim, reason=reason, now=now)

        claim = (await self.store.update_claim(pod_uid, tombstone)).value
        given_back = [claim.booking] if claim is not None and claim.booking is not None else []
        given_back += [
            b
            for b in self.view.bookings_of(pod_uid)
            if not given_back or b.commit != given_back[0].commit
        ]
        for booking in given_back:
            await self.store.fence(booking)
            await self.give_back(booking)
        return given_back

    async def release_requeue(
        self,
        pod_uid: str,
        node: str,
        *,
        reason: str,
        only_reserved: bool,
        reported_at: float = 0.0,
    ) -> bool:
        """Give the placement on ``node`` back and put the pod back in the queue.

        ``only_reserved``: the reserve timeout, which loses to the binder's bind.
        ``reported_at``: when the binder saw the failure; a report from well before the current
        placement was decided is about an older one (a redelivered result) and changes nothing.
        False when there was nothing (or no longer anything) to release.
        """
        claim = (await self.store.read(self.store.claims, subjects.claim_key(pod_uid))).value
        if (
            claim is None
            or claim.state != "placed"
            or claim.booking is None
            or claim.booking.node != node
        ):
            return False  # about an older placement: nothing of it is held any more
        booking = claim.booking
        if reported_at and reported_at + STALE_REPORT_S < booking.decided_at:
            return False
        now = self.clock.now()
        kept = False

        def release(record: AssignmentRecord | None) -> AssignmentRecord | None:
            nonlocal kept
            kept = False
            if record is not None and record.commit == booking.commit:
                if record.state == "released":
                    return None
                if only_reserved and record.state != "reserved":
                    kept = True  # the binder bound it first
                    return None
                return released(record, now=now)
            action = commit.fence_action(record, booking.commit)
            if action == "blocked":  # a live record of another commit: not this one's to release
                kept = True
                return None
            return commit.released_record(record, booking, now=now) if action == "write" else None

        await self.store.update_record(subjects.assignment_key(node, pod_uid), release)
        if kept:
            return False
        await self.finish_requeue(booking, reason)
        return True

    async def finish_requeue(self, booking: Booking, reason: str) -> None:
        """After the record of ``booking`` was released: claim -> requeued, unbook, requeue."""
        now = self.clock.now()

        def requeue(claim: PodClaim | None) -> PodClaim | None:
            if claim is None or claim.state != "placed" or claim.booking is None:
                return None
            if claim.booking.commit != booking.commit:
                return None
            return commit.requeued_claim(claim, reason=reason, now=now)

        claim = (await self.store.update_claim(booking.pod_uid, requeue)).value
        await self.give_back(booking)
        if (
            claim is not None
            and claim.state == "requeued"
            and claim.booking is not None
            and claim.booking.commit == booking.commit
            and not claim.requeue_published
            and not (claim.request is not None and claim.request.extender)
        ):
            await self.publish_requeue(claim)

    async def publish_requeue(self, claim: PodClaim) -> None:
        """Put a requeued pod back on ``tessera.pods.pending`` and note it in the claim."""
        booking = claim.booking
        assert booking is not None
        if claim.request is None:
            log.warning(
                "a requeued pod cannot be put back: its request was never recorded; the binder "
                "sends it again when the pod changes",
                extra={"pod_uid": claim.pod_uid},
            )
            return
        await self.bus.js_publish(
            subjects.PODS_PENDING,
            codec.encode(claim.request),
            msg_id=commit.requeue_msg_id(booking),
        )

        def published(current: PodClaim | None) -> PodClaim | None:
            if (
                current is None
                or current.state != "requeued"
                or current.booking is None
                or current.booking.commit != booking.commit
                or current.requeue_published
            ):
                return None
            return msgspec.structs.replace(current, requeue_published=True)

        await self.store.update_claim(claim.pod_uid, published)

    # --- reconciling ---------------------------------------------------------------------------

    async def reconcile(self, *, grace_s: float) -> int:
        """Carry out :func:`~.repairs.plan_repairs` over the view; how many repairs succeeded."""
        view = self.view
        ledgers = view.ledgers()
        now = self.clock.now()
        epoch = self.bus.store_epoch
        planned = repairs.plan_repairs(
            ledgers, view.claims, view.records.values(), now=now, grace_s=grace_s
        )
        planned += repairs.plan_charge_repairs(
            view.tenants.ledgers(),
            view.tenancy.quotas(),
            ledgers,
            view.claims,
            view.records.values(),
            now=now,
            grace_s=grace_s,
        )
        done = 0
        for repair in planned:
            if self.bus.store_epoch != epoch:  # planned on a store that is lost now
                log.warning("NATS lost its store; reconciliation stops here")
                break
            try:
                await self.repair(repair)
            except Exception as error:
                log.warning(
                    "repair failed; tried again at the next pass",
                    extra={
                        "kind": repair.kind,
                        "pod_uid": repair.pod_uid,
                        "error": f"{type(error).__name__}: {error}",
                    },
                )
                continue
            done += 1
            self.metrics.repairs.labels(kind=repair.kind).inc()
            log.info("repaired", extra={"kind": repair.kind, "pod_uid": repair.pod_uid})
        return done

    async def repair(self, repair: repairs.Repair) -> None:
        booking = repair.booking
        if repair.kind == "release-record":
            await self.release_orphan(repair.record_key, repair.pod_uid)
            return
        if repair.kind == "drop-charge":
            assert repair.charge is not None, repair
            await self.drop_charge(repair.charge, repair.tenant)
            return
        if repair.kind == "publish-requeue":
            claim = self.view.claim(repair.pod_uid)
            if claim is not None and claim.state == "requeued" and not claim.requeue_published:
                await self.publish_requeue(claim)
            return
        assert booking is not None, repair
        if repair.kind == "roll-forward":
            await self.finish(booking, None)
        elif repair.kind == "unbook-stale":
            await self.store.fence(booking)
            await self.give_back(booking)
        elif repair.kind == "rebook":
            refused = await self.store.rebook(booking)
            if refused:
                log.error(
                    "a live record's booking cannot be booked again",
                    extra={"pod_uid": booking.pod_uid, "node": booking.node, "reason": refused},
                )
        elif repair.kind == "finish-requeue":
            await self.finish_requeue(booking, "released record found by reconciliation")
        elif repair.kind == "adopt-charge":
            await self.store.adopt_charge(booking)
        elif repair.kind == "requeue-lost":
            await self.store.fence(booking)
            await self.finish_requeue(booking, "booking missing from the ledger")

    async def drop_charge(self, charge: TenantCharge, tenant: str) -> None:
        """Take off a charge whose commit looked neither booked nor recorded: fence the commit's
        record first (the linearisation point: a commit slower than reconciliation then never
        gets a live record), unless that record turns out live, or the claim names the commit."""
        claim = (await self.store.read(self.store.claims, subjects.claim_key(charge.pod_uid))).value
        if (
            claim is not None
            and claim.state == "placed"
            and claim.booking is not None
            and claim.booking.commit == charge.commit
        ):
            return
        fence = charges.fence_of(charge, tenant)
        now = self.clock.now()
        live = False

        def release(record: AssignmentRecord | None) -> AssignmentRecord | None:
            nonlocal live
            live = (
                record is not None and record.commit == charge.commit and record.state != "released"
            )
            if live or commit.fence_action(record, charge.commit) != "write":
                return None
            return commit.released_record(record, fence, now=now)

        await self.store.update_record(
            subjects.assignment_key(charge.node, charge.pod_uid), release
        )
        if not live:
            await self.store.uncharge(fence)

    async def release_orphan(self, key: str, pod_uid: str) -> None:
        """Release a live record whose commit the pod's claim does not name on its node (or
        that no claim names: no placer committed it)."""
        claim = (await self.store.read(self.store.claims, subjects.claim_key(pod_uid))).value
        named = claim.booking if claim is not None and claim.state == "placed" else None
        now = self.clock.now()

        def release(record: AssignmentRecord | None) -> AssignmentRecord | None:
            if record is None or record.state == "released":
                return None
            if named is not None and (record.commit, record.node) == (named.commit, named.node):
                return None  # the claim names it after all
            return released(record, now=now)

        await self.store.update_record(key, release)
