"""The KV watches of one placer replica: every bucket it follows applied to the
:class:`~services.placer.rules.state.ClusterView` (and the waiting board), each value accepted at
the
edge first."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.placer.shell.context import Shell, log
from services.placer.shell.held import Held
from services.placer.shell.waiting import WaitingPods
from shared import subjects
from shared.messages.assignments import AssignmentRecord
from shared.messages.epoch import StoreRestored
from shared.messages.inventory import NodeInventory
from shared.messages.ledger import Booking, PodClaim, TenantLedger
from shared.messages.nodes import NodeFacts
from shared.messages.waiting import WaitingPod
from shared.runtime.bus import Delivery, KvEntry
from shared.runtime.follow import follow as shared_follow

BUCKETS = ("inventory", "nodes", "ledger", "claims", "records", "tenants", "waiting", "meta")
"""Every bucket a replica loads before it is ready."""

POOLED_BATCH_S = 0.1
"""With node pools, the ledger, the claims and the records are watched in batches this far apart
(``Bus.kv_watch``): most of their changes are other replicas' writes on nodes and pods this
replica does not decide on, and a replica woken for each of them paid about 150 us of CPU a
wake-up on a machine with more processes than cores (``benchmarks/RESULTS.md``). What it decides
on stays exact: a booking is a compare-and-set, and one that lost reads the entry afresh; a
claim is create-only, so a waiting pod another replica placed in the last batch's time, if
decided here again, loses its claim and gives its booking back."""


@dataclass(frozen=True)
class _Follow:
    """One bucket the view follows: how to apply a value, which keys the view holds, how to
    forget one that vanished while no watch ran."""

    bucket: str
    apply: Callable[[KvEntry], Awaitable[None]]
    name: str
    held: Callable[[], set[str]] = set
    forget: Callable[[str], object] = lambda key: None
    durable: bool = False
    """Never deleted by Tessera (ledger, tenants): a vanished entry is forgotten only when NATS
    lost its whole store (a new epoch); the placements it held come back when the binder restores
    them."""
    batch_s: float = 0.0
    """Changes asked for in batches this far apart (``Bus.kv_watch``); 0: each as written."""
    keys: str = ">"
    """Which of the bucket's keys (a filter)."""
    on_loaded: Callable[[], object] = lambda: None
    """Called each time the watch's initial values are in."""


def kv_delivery(entry: KvEntry, bucket: str) -> Delivery:
    """A KV entry as the edge takes a message (its subject names bucket and key)."""
    return Delivery(subject=f"$KV.{bucket}.{entry.key}", data=entry.value)


class Watches:
    """Follows every bucket into the view; ``loaded`` is set per bucket once its current values
    are in."""

    def __init__(self, *, shell: Shell, held: Held, waiting: WaitingPods) -> None:
        self._shell = shell
        self._held = held
        self._waiting = waiting
        self.loaded = {name: asyncio.Event() for name in BUCKETS}
        shell.loaded_from.update(dict.fromkeys(BUCKETS))

    def follows(self) -> tuple[_Follow, ...]:
        view = self._shell.view
        board = self._shell.board
        batch_s = POOLED_BATCH_S if self._shell.config.pools > 1 else 0.0
        return (
            _Follow(
                subjects.KV_INVENTORY,
                self._on_inventory,
                "inventory",
                view.inventory_keys,
                view.forget_inventory,
            ),
            _Follow(subjects.KV_NODES, self._on_facts, "nodes", view.facts_keys, view.forget_facts),
            _Follow(
                subjects.KV_LEDGER,
                self._on_booking,
                "ledger",
                view.booking_keys,
                view.forget_booking,
                durable=True,
                batch_s=batch_s,
                keys=subjects.BOOKING_KEYS,
                on_loaded=lambda: self._bookings_loaded(pushed=not batch_s),
            ),
            _Follow(
                subjects.KV_CLAIMS,
                self._on_claim,
                "claims",
                lambda: {subjects.claim_key(uid) for uid in view.claims},
                lambda key: view.forget_claim(subjects.claim_uid(key)),
                batch_s=batch_s,
                keys=subjects.CLAIM_KEYS,
                on_loaded=self._claims_loaded,
            ),
            _Follow(
                subjects.KV_ASSIGNMENTS,
                self._on_record,
                "records",
                lambda: set(view.records),
                view.forget_record,
                batch_s=batch_s,
            ),
            _Follow(
                subjects.KV_TENANTS,
                self._on_tenant,
                "tenants",
                view.tenants.keys,
                view.forget_tenant,
                durable=True,
            ),
            _Follow(subjects.KV_WAITING, self._on_waiting, "waiting", board.uids, board.remove),
            _Follow(subjects.KV_META, self._on_meta, "meta"),
        )

    async def all_loaded(self) -> None:
        await asyncio.gather(*(event.wait() for event in self.loaded.values()))

    async def follow(self, follow: _Follow) -> None:
        """Apply every value of the bucket to the view, forever.

        A watch that ends or fails is started again; its initial values then also tell which
        keys were deleted while no watch ran (``held`` keys it no longer lists are forgotten;
        those of a durable bucket only when the store is a new one). A watch reads one store,
        the one whose epoch the bus names meanwhile (it ends when the bus takes another), so
        the epoch at its initial values' end is the epoch of what it listed
        (``Shell.loaded_from``, which says when the whole view holds the current store).
        """
        shell = self._shell
        loaded = self.loaded[follow.name]

        async def on_entry(entry: KvEntry) -> None:
            await follow.apply(entry)
            shell.poke()

        async def on_loaded(listed: set[str]) -> None:
            epoch = shell.bus.store_epoch
            lost = shell.loaded_from[follow.name] != epoch
            if loaded.is_set() and (lost or not follow.durable):
                for key in follow.held() - listed:
                    follow.forget(key)
            shell.loaded_from[follow.name] = epoch
            loaded.set()
            follow.on_loaded()
            if lost and shell.restored:  # the last watch back on a restored store
                shell.work.set()

        await shared_follow(
            shell.bus,
            follow.bucket,
            on_entry=on_entry,
            on_loaded=on_loaded,
            clock=shell.clock,
            batch_s=follow.batch_s,
            keys=follow.keys,
        )

    async def _decode(self, entry: KvEntry, bucket: str, message: type[Any], family: str) -> Any:
        return await self._shell.edge.accept(kv_delivery(entry, bucket), message, family=family)

    async def _reject_entry(self, entry: KvEntry, bucket: str, family: str, named: str) -> None:
        await self._shell.edge.reject(
            kv_delivery(entry, bucket),
            family=family,
            reason=f"entry under key {entry.key} names {named!r}",
            kind="validate",
        )

    async def _on_inventory(self, entry: KvEntry) -> None:
        view = self._shell.view
        node = subjects.node_from_token(entry.key)
        if entry.deleted:
            view.drop_inventory(node)
            return
        inventory = await self._decode(entry, subjects.KV_INVENTORY, NodeInventory, "inventory")
        if not isinstance(inventory, NodeInventory):
            return
        if subjects.node_token(inventory.node) != entry.key:
            await self._reject_entry(entry, subjects.KV_INVENTORY, "inventory", inventory.node)
            return
        problem = view.set_inventory(inventory, now=self._shell.clock.now())
        if problem:
            await self._shell.edge.reject(
                kv_delivery(entry, subjects.KV_INVENTORY),
                family="inventory",
                reason=problem,
                kind="validate",
            )

    async def _on_facts(self, entry: KvEntry) -> None:
        node = subjects.node_from_token(entry.key)
        if entry.deleted:
            self._shell.view.drop_facts(node)
            return
        facts = await self._decode(entry, subjects.KV_NODES, NodeFacts, "nodes")
        if isinstance(facts, NodeFacts):
            if subjects.node_token(facts.node) != entry.key:
                await self._reject_entry(entry, subjects.KV_NODES, "nodes", facts.node)
                return
            self._shell.view.set_facts(facts)

    def _bookings_loaded(self, *, pushed: bool) -> None:
        # As for the claims (``_claims_loaded``), but only where each change is pushed as it is
        # written: a node's bookings are written one after another, and each would wait for a
        # batched watch's next batch (a burst on 100 nodes ran at two thirds of its pace).
        self._shell.store.bookings_watched = pushed

    async def _on_booking(self, entry: KvEntry) -> None:
        view = self._shell.view
        value = None if entry.deleted else entry.value
        self._shell.store.watched(subjects.KV_LEDGER, entry.key, value, entry.revision)
        node, uid = subjects.booking_of_key(entry.key)
        if entry.revision <= view.booking_revision(node, uid):
            return  # our own write coming back (or older): nothing new, nothing to decode
        if self._shell.store.echoed(subjects.KV_LEDGER, entry.key, entry.value, entry.revision):
            return  # our own write, back before its answer: the store applies it then
        if entry.deleted:
            view.set_booking(node, uid, None, entry.revision)
            return
        booking = await self._decode(entry, subjects.KV_LEDGER, Booking, "ledger")
        if not isinstance(booking, Booking):
            view.set_booking_unreadable(node, uid, entry.revision)
        elif (booking.node, booking.pod_uid) != (node, uid):
            await self._reject_entry(
                entry, subjects.KV_LEDGER, "ledger", f"{booking.node}/{booking.pod_uid}"
            )
            view.set_booking_unreadable(node, uid, entry.revision)
        else:
            view.set_booking(node, uid, booking, entry.revision)

    def _claims_loaded(self) -> None:
        # From now on every version of a claim reaches ``_on_claim``, so the store may write a
        # claim unanswered and take its outcome from there.
        self._shell.store.claims_watched = True

    async def _on_claim(self, entry: KvEntry) -> None:
        view = self._shell.view
        value = None if entry.deleted else entry.value
        self._shell.store.watched(subjects.KV_CLAIMS, entry.key, value, entry.revision)
        uid = subjects.claim_uid(entry.key)
        if entry.revision <= view.claim_revisions.get(uid, 0):
            return
        if entry.deleted:
            view.set_claim(uid, None, entry.revision)
            return
        claim = await self._decode(entry, subjects.KV_CLAIMS, PodClaim, "claims")
        if isinstance(claim, PodClaim):
            view.set_claim(claim.pod_uid, claim, entry.revision)
            if claim.state != "requeued":
                self._held.claimed_elsewhere(claim.pod_uid, claim)
                posted = self._shell.board.get(claim.pod_uid)
                if posted is not None and posted.waiting.holder == self._shell.config.placer_id:
                    self._waiting.unpost(claim.pod_uid)  # placed or deleted by another replica

    async def _on_record(self, entry: KvEntry) -> None:
        view = self._shell.view
        known = view.records.get(entry.key)
        if known is not None and entry.revision <= known.revision:
            return
        store = self._shell.store
        if store.echoed(subjects.KV_ASSIGNMENTS, entry.key, entry.value, entry.revision):
            return  # our own write, back before its answer: the store applies it then
        if entry.deleted:
            view.set_record(entry.key, None, entry.revision)
            return
        record = await self._decode(entry, subjects.KV_ASSIGNMENTS, AssignmentRecord, "assignments")
        if isinstance(record, AssignmentRecord):
            view.set_record(entry.key, record, entry.revision, seen_at=self._shell.clock.now())

    async def _on_tenant(self, entry: KvEntry) -> None:
        if entry.deleted:
            return
        ledger = await self._decode(entry, subjects.KV_TENANTS, TenantLedger, "tenants")
        if isinstance(ledger, TenantLedger):
            if subjects.tenant_key(ledger.tenant) != entry.key:
                await self._reject_entry(entry, subjects.KV_TENANTS, "tenants", ledger.tenant)
                return
            self._shell.view.set_tenant_ledger(ledger, entry.revision)

    async def _on_waiting(self, entry: KvEntry) -> None:
        board = self._shell.board
        if entry.deleted:
            board.remove(entry.key, before=entry.revision)
            return
        held = board.get(entry.key)
        if held is not None and entry.revision <= held.revision:
            return
        waiting = await self._decode(entry, subjects.KV_WAITING, WaitingPod, "waiting")
        if isinstance(waiting, WaitingPod):
            if subjects.waiting_key(waiting.pod.uid) != entry.key:
                await self._reject_entry(entry, subjects.KV_WAITING, "waiting", waiting.pod.uid)
                return
            board.put(waiting, entry.revision)

    async def _on_meta(self, entry: KvEntry) -> None:
        if entry.key != subjects.META_RESTORED or entry.deleted:
            return
        restored = await self._decode(entry, subjects.KV_META, StoreRestored, "meta")
        if isinstance(restored, StoreRestored):
            self._shell.restored_epoch = restored.epoch
            if self._shell.restored:
                log.info(
                    "the binder restored what is bound into this store; placing",
                    extra={"epoch": restored.epoch, "pods": restored.pods},
                )
                self._shell.work.set()
