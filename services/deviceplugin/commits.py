"""What placers committed on this node: its bookings in ``tessera-ledger``.

Only what a placer committed is granted (issue 19; ``shared.commits.booking_problem``): the pod's
booking on this node (``subjects.booking_key``) must be of the record's commit with the same
slices. It is not read on the Allocate path: the node's bookings are mirrored by a KV watch
(a placer books long before the binder writes the record, and the record comes long before the
kubelet's Allocate). An Allocate whose record still matches no booking reads the pod's booking
again (:meth:`CommitMirror.reread`, at most every ``BOOKING_REREAD_S``). Each change bumps the
records' change counter: an Allocate waiting for its record to become servable waits on both.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from shared import subjects
from shared.clock import Clock
from shared.messages.assignments import RecordView
from shared.messages.ledger import Booking
from shared.runtime.bus import Bus, Delivery, KvEntry
from shared.runtime.edge import Edge
from shared.runtime.follow import follow
from shared.runtime.health import Readiness
from shared.runtime.tasks import ChangeCounter

log = logging.getLogger(__name__)

BOOKING_REREAD_S = 0.25
"""An Allocate reads a pod's booking again only when it was last read longer ago than this."""

MAX_BOOKING_REREADS = 8
"""Bookings one Allocate reads again at most (made-up records must not make it slow)."""

MAX_READ_TIMES = 1024
"""When each pod's booking was last read again is remembered for this many pods at most."""


class CommitMirror:
    """This node's bookings."""

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
        self._read_at: dict[str, float] = {}
        """When (monotonic) each pod's booking was last read again."""
        readiness.set("ledger", False, "loading this node's bookings")

    async def follow(self) -> None:
        """Mirror this node's bookings forever."""

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

    async def reread(self, views: Sequence[RecordView]) -> bool:
        """Read again the bookings of ``views`` not read in the last :data:`BOOKING_REREAD_S` (at
        most :data:`MAX_BOOKING_REREADS` pods); whether it read any."""
        now = self._clock.monotonic()
        if len(self._read_at) > MAX_READ_TIMES:
            self._read_at = {
                u: at for u, at in self._read_at.items() if now - at < BOOKING_REREAD_S
            }
        uids = [
            v.record.pod_uid
            for v in views
            if now - self._read_at.get(v.record.pod_uid, -math.inf) >= BOOKING_REREAD_S
        ][:MAX_BOOKING_REREADS]
        if not uids:
            return False
        try:
            for uid in uids:
                self._read_at[uid] = now
                key = subjects.booking_key(self._node, uid)
                entry = await self._bus.kv_get(subjects.KV_LEDGER, key)
                await self._take_booking(entry or KvEntry(key, b"", 0, deleted=True))
        except Exception as error:  # NATS away: plan with what is held
            log.warning(
                "cannot read commits again", extra={"error": f"{type(error).__name__}: {error}"}
            )
        return True
