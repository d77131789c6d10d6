"""The protocol's writes (``commit.py`` has the rules): bookings (with the pods' claims in one
batch on a replicated store), tenants' charges, claims and records, each over
:class:`~.kvwrites.KvWrites`' certain-outcome writes.

:meth:`Store.book` writes new bookings guarded at the node's revision the view holds, and gives
up at once when the node's bookings changed under the decision (the pod is decided again);
:meth:`Store.unbook` and the repairs go through ``KvWrites.change_node``. Bookings for one node
waiting for each other are written together, and so are the charges of one tenant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from services.placer.kvwrites import (
    MAX_ATTEMPTS,
    ConflictError,
    Entry,
    GaveUpError,
    KvWrites,
    Write,
    node_lock_key,
    tenant_lock_key,
)
from services.placer.rules import charges, commit, translate
from shared import codec, commits, subjects
from shared.messages.assignments import AssignmentRecord
from shared.messages.ledger import Booking, NodeLedger, PodClaim, TenantCharge, TenantLedger
from shared.messages.pods import PodPending, PodRestore
from shared.runtime.bus import Delivery, KvWrite

__all__ = ["ConflictError", "Entry", "GaveUpError", "Store"]

log = logging.getLogger(__name__)


class Store(KvWrites):
    """The protocol's writes of bookings, charges, claims and records (see the module
    docstring)."""

    # --- the ledger ----------------------------------------------------------------------------

    async def book(
        self,
        booking: Booking,
        *,
        request: PodPending | None = None,
        seen: frozenset[str] | None = None,
    ) -> str:
        """Add ``booking`` to its node's ledger at the revision the view holds and, with
        ``claims_with_bookings``, create the pod's claim naming it (or take it from
        ``requeued``) in the same atomic batch (``commit.book_and_claim``); ``request``: the pod
        as pending, kept in the claim. Without, the claim is the next write (:meth:`claim`).

        The batch saves a round trip where the store is replicated (a JetStream cluster stages
        the batch in memory and replicates it once), and costs more than the second write on a
        single server, which stages it on disk with a sync first (``benchmarks/kv_batch.py``).

        Returns "" when booked (or already booked by this commit; or not booked because the
        pod's claim names another commit or says the pod is gone: claiming tells), else why
        not: the node as the ledger holds it cannot take it, or (``seen``: the bookings the
        decision counted on the node) the node changed since (``commit.stale_by``). Raises
        :class:`ConflictError` when the node's entry changed first (the view then holds the new
        entry: decide again); a claim that changed first is read again and the batch retried.

        Bookings for one node that wait for each other here are written together, in one
        batch: under load a packing profile sends many pods to the same node, and each would
        otherwise wait for the one before.
        """
        node = booking.node

        async def write(batch: list[Booking]) -> dict[str, str]:
            return await self._book_and_claim(
                node,
                batch,
                seen={b.commit: self._seen[b.commit] for b in batch if b.commit in self._seen},
                requests={b.commit: self._requests.get(b.commit) for b in batch},
            )

        if seen is not None:
            self._seen[booking.commit] = seen
        self._requests[booking.commit] = request
        try:
            return await self.write_together(node_lock_key(node), booking, write)
        finally:
            self._seen.pop(booking.commit, None)
            self._requests.pop(booking.commit, None)

    async def _book_and_claim(
        self,
        node: str,
        batch: list[Booking],
        *,
        seen: dict[str, frozenset[str]],
        requests: dict[str, PodPending | None],
    ) -> dict[str, str]:
        """Write the bookings of ``batch`` that fit (and their claims: see :meth:`book`), each
        to its own key, the first guarded at the node's revision the decisions saw: with the
        claims, in one atomic batch; without, one booking at a time, each guarded at the
        revision the one before landed at, and (a first try, with ``bookings_watched``) sent
        unanswered, its outcome shown by the bookings' watch (``KvWrites.send_booking``). After
        a write that lost or whose answer was lost, what it wrote is read again."""
        ledger = self._cached_ledger(node)
        claims = {b.pod_uid: self._cached_claim(b.pod_uid) for b in batch}
        attempted: int | None = None  # the node's revision the last write was guarded at
        failures = 0
        while True:
            now = self._clock.now()
            # The node's state is derived only when a booking of the batch is still to be
            # checked: a retry whose bookings all landed (the claim's turn) needs none.
            held = commit.booked_pods(ledger.value)
            committed = (
                self._view.committed_state(node)
                if any(b.pod_uid not in held for b in batch)
                else None
            )
            pending = self._view.tentative_commits(node)
            if self._claims_with_bookings:
                read = {uid: entry.value for uid, entry in claims.items()}
                written, claimed, refused = commit.book_and_claim(
                    ledger.value,
                    committed,
                    batch,
                    read,
                    requests,
                    now=now,
                    seen=seen,
                    pending=pending,
                )
            else:
                claimed = {}
                written, refused = commit.book_all(
                    ledger.value, committed, batch, now=now, seen=seen, pending=pending
                )
            added = commit.added_bookings(ledger.value, written)
            if added and attempted not in (None, ledger.revision):
                raise ConflictError(f"node {node}'s bookings changed under the write")
            if not self._claims_with_bookings:
                added = added[:1]  # a batch costs more than its writes on one server
            writes = [
                KvWrite(
                    subjects.booking_key(node, b.pod_uid),
                    codec.encode(b),
                    ledger.revision if n == 0 else 0,
                    guard=subjects.node_bookings(node) if n == 0 else "",
                )
                for n, b in enumerate(added)
            ]
            writes += [
                KvWrite(subjects.claim_key(uid), codec.encode(claim), claims[uid].revision)
                for uid, claim in claimed.items()
            ]
            if not writes:
                # Off the view at once: a decision beside one of them, written next, is stale.
                for b in batch:
                    if b.commit in refused:
                        self._view.drop_tentative(node, b.pod_uid)
                return refused
            if added:
                attempted = ledger.revision
            echoes = {
                (subjects.KV_LEDGER, w.key): (Write(w.value), b)
                for w, b in zip(writes, added, strict=False)
            }
            self._writing.update({slot: echo for slot, (echo, _) in echoes.items()})
            try:
                revisions: tuple[int, ...] | None
                if added and len(writes) == 1 and not failures and self.bookings_watched:
                    revision = await self.send_booking(node, writes[0])
                    revisions = None if revision is None else (revision,)
                else:
                    revisions = await self._bus.kv_write_all(subjects.KV_LEDGER, writes)
            except Exception as error:
                # The write may have landed or not: only a read can tell.
                self._metrics.unknown_outcomes.labels(entry="ledger").inc()
                log.warning(
                    "KV booking outcome unknown; reading it back",
                    extra={"node": node, "error": type(error).__name__},
                )
                revisions = None
            else:
                if revisions is None:
                    self._metrics.conflicts.labels(entry="ledger").inc()
            finally:
                for slot, (echo, written_booking) in echoes.items():
                    if self._writing.get(slot) is echo:
                        del self._writing[slot]
                    if echo.landed:  # its watch delivery came first and was left to us
                        self.bookings.apply(slot[1], written_booking, echo.landed)
            if revisions is None:
                failures += 1
                if failures >= MAX_ATTEMPTS:
                    raise GaveUpError(f"node {node}'s bookings kept changing")
                ledger = await self.read_node(node)
                for uid in claimed:
                    claims[uid] = await self.read(self.claims, subjects.claim_key(uid))
                continue
            landed = iter(revisions)
            for b in added:
                self.bookings.apply(subjects.booking_key(node, b.pod_uid), b, next(landed))
            for uid, claim in claimed.items():
                revision = next(landed)
                self.claims.apply(subjects.claim_key(uid), claim, revision)
                claims[uid] = Entry(claim, revision)
            ledger = self._cached_ledger(node)
            attempted = ledger.revision

    async def rebook(self, booking: Booking) -> str:
        """Book ``booking`` again (its record is live); retried through conflicts."""
        refused = ""

        def change(ledger: NodeLedger | None) -> NodeLedger | None:
            nonlocal refused
            if commit.booking_in(ledger, booking.pod_uid) is not None:
                return None
            state = self._view.committed_state(booking.node)
            refused = "node unknown" if state is None else commit.check_booking(state, booking)
            if refused:
                return None
            return commit.with_booking(ledger, booking, now=self._clock.now())

        async with self.node_lock(booking.node):
            await self.change_node(booking.node, change)
        return refused

    async def restore_booking(self, booking: Booking) -> None:
        """Book a placement restored from the Kubernetes API whatever the node's ledger holds
        (its pod runs there): unchecked, unlike every other booking."""

        def change(ledger: NodeLedger | None) -> NodeLedger | None:
            if commit.booking_in(ledger, booking.pod_uid) is not None:
                return None
            return commit.with_booking(ledger, booking, now=self._clock.now())

        async with self.node_lock(booking.node):
            await self.change_node(booking.node, change)

    async def unbook(self, booking: Booking) -> None:
        """Take ``booking`` (this commit's, not a newer one) off its node's ledger."""

        def change(ledger: NodeLedger | None) -> NodeLedger | None:
            return commit.without_booking(
                ledger, booking.pod_uid, commit=booking.commit, now=self._clock.now()
            )

        async with self.node_lock(booking.node):
            await self.change_node(booking.node, change, start=self._cached_ledger(booking.node))
        self._view.drop_tentative(booking.node, booking.pod_uid)

    async def convert_legacy_ledgers(self) -> int:
        """Turn each whole-node ledger entry an earlier version wrote (``subjects.
        LEGACY_LEDGER_KEYS``) into booking keys, then delete it; returns how many it turned.

        Each booking is created only where its key is free, and the entry deleted only at the
        revision read, so two replicas converting at once write each booking once. Placers of
        the earlier version are stopped first (README, "Upgrading"): nothing writes an entry
        meanwhile. An entry that does not decode keeps its node unplaceable, as it did before.
        """
        converted = 0
        entries = await self._bus.kv_list(subjects.KV_LEDGER, subjects.LEGACY_LEDGER_KEYS)
        for entry in entries:
            if entry.deleted:
                continue
            node = subjects.node_from_token(entry.key)
            delivery = Delivery(subject=f"$KV.{subjects.KV_LEDGER}.{entry.key}", data=entry.value)
            ledger = await self._edge.accept(delivery, NodeLedger, family="ledger")
            if ledger is None or ledger.node != node:
                log.error("an earlier version's ledger entry is unreadable", extra={"node": node})
                self._view.hold_unreadable(node, entry.key)
                continue
            for booking in ledger.bookings:
                key = subjects.booking_key(node, booking.pod_uid)
                await self._bus.kv_create(subjects.KV_LEDGER, key, codec.encode(booking))
            await self._bus.kv_delete_if(subjects.KV_LEDGER, entry.key, revision=entry.revision)
            await self.read_node(node)  # a listing: the view takes the node whole
            converted += 1
        if converted:
            log.info(
                "earlier version's ledger entries turned into bookings", extra={"nodes": converted}
            )
        return converted

    # --- tenants' charges ----------------------------------------------------------------------

    def _cached_tenant(self, tenant: str) -> Entry[TenantLedger]:
        ledger, revision = self._view.tenants.ledger(tenant)
        return Entry(ledger, revision)

    async def charge(self, booking: Booking) -> str:
        """Charge ``booking`` to its tenant's quota (``charges.charge_all``), when it has one.

        Returns "" when charged (or nothing to charge: no quota, or nothing it limits), else why
        the quota refuses it. A lost compare-and-set reads the entry again and checks again;
        charges of one tenant waiting for each other here are written together.
        """
        tenant = booking.tenant
        quota = self._view.tenancy.quota_of(tenant) if tenant else None
        if quota is None:
            return ""
        charge = charges.charge_of(booking, now=self._clock.now())
        if not charges.counts_against(quota, charge):
            return ""

        async def write(batch: list[TenantCharge]) -> dict[str, str]:
            refused: dict[str, str] = {}

            def change(ledger: TenantLedger | None) -> TenantLedger | None:
                nonlocal refused
                quota = self._view.tenancy.quota_of(tenant)
                written, refused = charges.charge_all(
                    ledger, tenant, quota, batch, now=self._clock.now()
                )
                return written

            await self.transact(
                self.tenants,
                subjects.tenant_key(tenant),
                change,
                start=self._cached_tenant(tenant),
            )
            return refused

        return await self.write_together(tenant_lock_key(tenant), charge, write)

    async def uncharge(self, booking: Booking) -> None:
        """Take the charge of ``booking``'s commit off its tenant's entry, if it holds one.

        No I/O for a tenant that has neither a quota nor an entry (nothing was ever charged).
        """
        tenant = booking.tenant
        cached = self._cached_tenant(tenant)
        if not tenant or (cached.value is None and self._view.tenancy.quota_of(tenant) is None):
            return
        listed = cached.value is not None and any(
            c.commit == booking.commit for c in cached.value.charges
        )

        def change(ledger: TenantLedger | None) -> TenantLedger | None:
            return charges.without_charge(ledger, booking.commit, now=self._clock.now())

        async with self._lock(tenant_lock_key(tenant)):
            await self.transact(
                self.tenants,
                subjects.tenant_key(tenant),
                change,
                start=cached if listed else None,  # not seen charged here: read the truth
            )

    async def adopt_charge(self, booking: Booking) -> None:
        """Charge a placement that exists already, whatever the quota (a repair)."""
        tenant = booking.tenant
        charge = charges.charge_of(booking, now=self._clock.now())

        def change(ledger: TenantLedger | None) -> TenantLedger | None:
            return charges.with_charge(ledger, tenant, charge, now=self._clock.now())

        async with self._lock(tenant_lock_key(tenant)):
            await self.transact(self.tenants, subjects.tenant_key(tenant), change)

    # --- claims --------------------------------------------------------------------------------

    def _cached_claim(self, pod_uid: str) -> Entry[PodClaim]:
        return Entry(self._view.claim(pod_uid), self._view.claim_revisions.get(pod_uid, 0))

    async def claim(
        self, booking: Booking, request: PodPending | None
    ) -> tuple[commit.ClaimVerdict, PodClaim | None]:
        """Make the pod's claim name ``booking`` if nothing else does.

        Returns ``mine`` (the claim names it now), ``lost`` (another booking's claim, returned),
        or ``deleted`` (the pod is gone).
        """
        verdict: commit.ClaimVerdict = "create"

        def change(claim: PodClaim | None) -> PodClaim | None:
            nonlocal verdict
            verdict = commit.claim_verdict(claim, booking)
            if verdict in ("create", "take"):
                return commit.placed_claim(booking, request, now=self._clock.now())
            if verdict == "mine" and claim is not None and claim.request is None and request:
                return commit.placed_claim(booking, request, now=claim.updated_at)
            return None

        written = await self.transact(
            self.claims,
            subjects.claim_key(booking.pod_uid),
            change,
            start=self._cached_claim(booking.pod_uid),
            unanswered=True,
        )
        if verdict in ("create", "take"):
            verdict = "mine"
        return verdict, written.value

    async def update_claim(
        self, pod_uid: str, change: Callable[[PodClaim | None], PodClaim | None]
    ) -> Entry[PodClaim]:
        """Bring the pod's claim to what ``change`` says, from a fresh read."""
        return await self.transact(self.claims, subjects.claim_key(pod_uid), change)

    # --- records -------------------------------------------------------------------------------

    async def restore_record(self, booking: Booking, restore: PodRestore) -> commits.RecordAction:
        """Write the record of a restored placement in the state the hand-off had reached:
        ``done`` (written, or there already), ``released`` (this commit was released: a fence)
        or ``blocked`` (a live record of another commit)."""
        key = subjects.assignment_key(booking.node, booking.pod_uid)
        action: commits.RecordAction = "write"

        def change(record: AssignmentRecord | None) -> AssignmentRecord | None:
            nonlocal action
            action = commits.record_action(record, booking.commit)
            if action != "write":
                return None
            return commits.placed_over(record, translate.restored_record(booking, restore))

        await self.transact(self.records, key, change)
        return "done" if action == "write" else action

    async def fence(self, booking: Booking) -> None:
        """Leave ``booking``'s record released (writing a released one if there is none)."""
        key = subjects.assignment_key(booking.node, booking.pod_uid)
        now = self._clock.now()

        def change(record: AssignmentRecord | None) -> AssignmentRecord | None:
            if commit.fence_action(record, booking.commit) != "write":
                return None
            return commit.released_record(record, booking, now=now)

        await self.transact(self.records, key, change)

    async def update_record(
        self, key: str, change: Callable[[AssignmentRecord | None], AssignmentRecord | None]
    ) -> Entry[AssignmentRecord]:
        return await self.transact(self.records, key, change)
