"""What placers committed on this node: its bookings in ``tessera-ledger`` and its pods' claims.

Only what a placer committed is granted (issue 19; ``shared.commits``): the pod's claim
(``subjects.claim_key``) must name the record's commit, and the pod's booking on this node
(``subjects.booking_key``) must be of that commit with the same slices. Neither is read on the
Allocate path: the node's bookings are mirrored by a KV watch, and a pod's claim is read when its
record first arrives (placers write the claim before the record, and the record long before the
kubelet's Allocate; :meth:`want`). An Allocate whose record still matches no commit reads the
pod's claim and booking again (:meth:`reread`, at most every ``CLAIM_REREAD_S``). Each change
bumps the records' change counter: an Allocate waiting for its record to become servable waits on
both.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence

from shared import subjects
from shared.clock import Clock
from shared.messages.assignments import AssignmentRecord, RecordView
from shared.messages.ledger import Booking, PodClaim
from shared.runtime.bus import Bus, Delivery, KvEntry
from shared.runtime.edge import Edge
from shared.runtime.follow import follow
from shared.runtime.health import Readiness
from shared.runtime.tasks import ChangeCounter

log = logging.getLogger(__name__)

CLAIM_REREAD_S = 0.25
"""An Allocate reads a pod's claim (and its booking) again only when they were last read longer
ago than this."""

CLAIM_RETRY_S = 1.0
"""How long before claims NATS could not give are read again."""

MAX_CLAIMS_AT_ONCE = 32
"""Claims read together when records arrive in a burst."""

MAX_CLAIM_REREADS = 8
"""Claims one Allocate reads again at most (made-up records must not make it slow)."""


class CommitMirror:
    """This node's bookings and the claims of the pods with a record here."""

    def __init__(
        self,
        *,
        node: str,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        readiness: Readiness,
        changed: ChangeCounter,
    ) -> None:
        self._node = node
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self._readiness = readiness
        self._changed = changed
        self.bookings: dict[str, Booking] = {}
        """This node's bookings in ``tessera-ledger``, by pod UID."""
        self.claims: dict[str, PodClaim] = {}
        """The claims (``subjects.claim_key``) of pods with a record here, by pod UID."""
        self._claim_read_at: dict[str, float] = {}
        """When (monotonic) each pod's claim was last read."""
        self._claims_wanted: asyncio.Queue[str] = asyncio.Queue()
        readiness.set("ledger", False, "loading this node's bookings")

    def want(self, record: AssignmentRecord) -> None:
        """Have the pod's claim read unless the one held already names the record's commit."""
        if record.state not in ("reserved", "bound"):
            return
        claim = self.claims.get(record.pod_uid)
        if claim is None or claim.booking is None or claim.booking.commit != record.commit:
            self._claims_wanted.put_nowait(record.pod_uid)

    def drop(self, pod_uid: str) -> None:
        """The pod's record is gone: forget its claim."""
        self.claims.pop(pod_uid, None)
        self._claim_read_at.pop(pod_uid, None)

    async def follow(self) -> None:
        """Mirror this node's bookings and read the claims of the pods recorded here."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._follow_ledger(), name="ledger")
            group.create_task(self._read_wanted_claims(), name="claims")

    async def _follow_ledger(self) -> None:
        async def on_entry(entry: KvEntry) -> None:
            await self._take_booking(entry)

        async def on_loaded(listed: set[str]) -> None:
            for uid in set(self.bookings) - {subjects.booking_of_key(k)[1] for k in listed}:
                del self.bookings[uid]  # deleted while no watch was running
            await self._changed.bump()
            self._readiness.set("ledger", True)

        await follow(
            self._bus,
            subjects.KV_LEDGER,
            keys=subjects.node_bookings(self._node),
            on_entry=on_entry,
            on_loaded=on_loaded,
            clock=self._clock,
            what="ledger",
        )

    async def _take_booking(self, entry: KvEntry) -> None:
        """Hold the booking ``entry`` is (none when deleted, or when it does not decode or is
        not of the pod and node its key names: dead-lettered or ignored, and never granted)."""
        _, uid = subjects.booking_of_key(entry.key)
        booking = None
        if not entry.deleted:
            delivery = Delivery(subject=f"$KV.{subjects.KV_LEDGER}.{entry.key}", data=entry.value)
            booking = await self._edge.accept(delivery, Booking, family="ledger")
        if booking is None or (booking.node, booking.pod_uid) != (self._node, uid):
            self.bookings.pop(uid, None)
        else:
            self.bookings[uid] = booking
        await self._changed.bump()

    async def _read_wanted_claims(self) -> None:
        """Read the wanted claims, those wanted at once together (a burst of records is read in
        a few round trips, not one after the other)."""
        while True:
            wanted = [await self._claims_wanted.get()]
            while not self._claims_wanted.empty() and len(wanted) < MAX_CLAIMS_AT_ONCE:
                wanted.append(self._claims_wanted.get_nowait())
            wanted = list(dict.fromkeys(wanted))
            while wanted:
                results = await asyncio.gather(
                    *(self._read_claim(uid) for uid in wanted), return_exceptions=True
                )
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors:  # NATS away: the Allocate path reads them again too
                    log.warning(
                        "cannot read pods' claims yet",
                        extra={"pods": len(errors), "error": f"{type(errors[0]).__name__}"},
                    )
                    await self._clock.sleep(CLAIM_RETRY_S)
                wanted = [u for u, r in zip(wanted, results, strict=True) if r is not None]

    async def _read_claim(self, uid: str) -> None:
        self._claim_read_at[uid] = self._clock.monotonic()
        entry = await self._bus.kv_get(subjects.KV_CLAIMS, subjects.claim_key(uid))
        claim = None
        if entry is not None:
            delivery = Delivery(subject=f"$KV.{subjects.KV_CLAIMS}.{entry.key}", data=entry.value)
            claim = await self._edge.accept(delivery, PodClaim, family="claims")
        if claim is None or claim.pod_uid != uid:
            self.claims.pop(uid, None)
        else:
            self.claims[uid] = claim
        await self._changed.bump()

    async def reread(self, views: Sequence[RecordView]) -> bool:
        """Read again the claims and bookings of ``views`` not read in the last
        :data:`CLAIM_REREAD_S` (at most :data:`MAX_CLAIM_REREADS` pods); whether it read any."""
        now = self._clock.monotonic()
        uids = [
            v.record.pod_uid
            for v in views
            if now - self._claim_read_at.get(v.record.pod_uid, -math.inf) >= CLAIM_REREAD_S
        ][:MAX_CLAIM_REREADS]
        if not uids:
            return False
        try:
            for uid in uids:
                await self._read_claim(uid)
                key = subjects.booking_key(self._node, uid)
                entry = await self._bus.kv_get(subjects.KV_LEDGER, key)
                await self._take_booking(entry or KvEntry(key, b"", 0, deleted=True))
        except Exception as error:  # NATS away: plan with what is held
            log.warning(
                "cannot read commits again", extra={"error": f"{type(error).__name__}: {error}"}
            )
        return True
