"""The binder's mirror of the pods' claims (``tessera-ledger``, ``subjects.claim_key``): the
placed ones name the bookings it binds.

A placer commits a pod by its booking and a claim naming it (``services/placer/rules/commit.py``);
the
booking of a placed claim is the assignment at its ``reserved`` stage, and binding it is the
binder's work (:mod:`~services.binder.binding`). Fed by one KV watch (initial values, then every
change; watched again when the server ends it), each value accepted at the edge first; a value
that does not decode, or names another pod than its key, is dead-lettered and the pod is not
bound from it. ``on_placed`` sees the pod UID of each placed claim taken in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shared import subjects
from shared.clock import Clock
from shared.messages.ledger import Booking, PodClaim
from shared.runtime.bus import Bus, Delivery, KvEntry
from shared.runtime.edge import Edge
from shared.runtime.follow import follow

log = logging.getLogger(__name__)


class ClaimMirror:
    """The placed claims, by pod UID (see the module docstring)."""

    def __init__(
        self, *, bus: Bus, edge: Edge, clock: Clock, on_placed: Callable[[str], None]
    ) -> None:
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self._on_placed = on_placed
        self._placed: dict[str, Booking] = {}
        self._revisions: dict[str, int] = {}
        self.loaded = False

    def booking(self, pod_uid: str) -> Booking | None:
        """The booking ``pod_uid``'s claim names while it is placed (None: it is not)."""
        return self._placed.get(pod_uid)

    def placed_pods(self) -> list[str]:
        return list(self._placed)

    async def run(self) -> None:
        """Mirror the claims forever."""
        await follow(
            self._bus,
            subjects.KV_CLAIMS,
            keys=subjects.CLAIM_KEYS,
            on_entry=self._on_entry,
            on_loaded=self._on_loaded,
            clock=self._clock,
            what="claim",
        )

    async def _on_entry(self, entry: KvEntry) -> None:
        uid = subjects.claim_uid(entry.key)
        if entry.revision <= self._revisions.get(uid, 0):
            return
        self._revisions[uid] = entry.revision
        claim = None
        if not entry.deleted:
            delivery = Delivery(subject=f"$KV.{subjects.KV_CLAIMS}.{entry.key}", data=entry.value)
            claim = await self._edge.accept(delivery, PodClaim, family="claims")
            if claim is not None and claim.pod_uid != uid:
                await self._edge.reject(
                    delivery,
                    family="claims",
                    reason=f"claim under key {entry.key} names pod {claim.pod_uid}",
                    kind="validate",
                )
                claim = None
        if claim is None or claim.state != "placed" or claim.booking is None:
            self._placed.pop(uid, None)
            if entry.deleted:
                self._revisions.pop(uid, None)
            return
        changed = self._placed.get(uid) != claim.booking
        self._placed[uid] = claim.booking
        if changed:
            self._on_placed(uid)

    async def _on_loaded(self, listed: set[str]) -> None:
        kept = {subjects.claim_uid(key) for key in listed}
        for uid in set(self._revisions) - kept:  # deleted while no watch was running
            self._placed.pop(uid, None)
            self._revisions.pop(uid, None)
        if not self.loaded:
            self.loaded = True
            log.info("claims loaded", extra={"placed": len(self._placed)})
