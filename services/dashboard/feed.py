"""The dashboard's inputs: KV watches and subscriptions, decoded at the edge into core events.

* one KV watch per bucket (inventory, node facts, assignment records, placer statistics): the
  current values, then every change. When a watch has delivered its initial values the feed
  emits :class:`~services.dashboard.core.state.BucketSynced` with the keys it saw, so keys deleted
  while a watch was down are dropped; a watch that fails is started again after a back-off, and
  the bus ends every watch when the connection to NATS comes back, so they start again.
* core subscriptions to ``tessera.placements.rejected``, ``tessera.placements.invalid``,
  ``tessera.pods.pending`` and ``tessera.pods.deleted`` (published with JetStream; the dashboard
  only listens and never takes a consumer from the services).

Every value goes through :class:`~shared.runtime.edge.Edge`: one that does not decode, or whose
KV key does not match what it says (a record of pod A under pod B's key), is counted, logged and
dead-lettered with the reason, and the dashboard keeps what it had. Inventory is believed as
every reader believes it (``shared.validation.take_inventory``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from services.dashboard.core.state import (
    Bucket,
    BucketSynced,
    Event,
    FactsChanged,
    InventoryChanged,
    PodFoundInvalid,
    PodGone,
    PodQueued,
    PodRejected,
    RecordChanged,
    StatsChanged,
    node_key_problem,
    record_key_problem,
    stats_key_problem,
)
from shared import subjects, validation
from shared.clock import Clock
from shared.messages.assignments import AssignmentRecord
from shared.messages.inventory import NodeInventory
from shared.messages.nodes import NodeFacts
from shared.messages.placement import PlacementRejected, PodInvalid
from shared.messages.pods import PodDeleted, PodPending
from shared.messages.stats import ClusterStats
from shared.runtime.bus import Bus, Delivery, KvEntry, Subscription
from shared.runtime.edge import Edge

log = logging.getLogger(__name__)

T = TypeVar("T")

BUCKET_NAMES: Final[dict[Bucket, str]] = {
    "inventory": subjects.KV_INVENTORY,
    "nodes": subjects.KV_NODES,
    "assignments": subjects.KV_ASSIGNMENTS,
    "stats": subjects.KV_STATS,
}
MAX_BACKOFF_S: Final = 10.0


@dataclass
class Flag:
    """Set by a watch once it delivered its initial values (a failure after that backs off
    from the start again)."""

    value: bool = False


class Feed:
    """Turns what arrives over NATS into events for ``sink``."""

    def __init__(
        self,
        *,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        sink: Callable[[Event], None],
        synced: Callable[[Bucket], None],
    ) -> None:
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self._sink = sink
        self._synced = synced
        self._inventories: dict[str, NodeInventory] = {}
        """Per node, the snapshot the inventory rule took last (``shared.validation``)."""

    async def subscribe(self) -> list[Subscription]:
        """Listen for rejections and deletions (call before the watches start)."""

        async def rejected(message: PlacementRejected) -> None:
            self._sink(PodRejected(rejection=message))

        async def deleted(message: PodDeleted) -> None:
            self._sink(PodGone(deleted=message))

        async def queued(message: PodPending) -> None:
            self._sink(PodQueued(pending=message))

        async def invalid(message: PodInvalid) -> None:
            self._sink(PodFoundInvalid(invalid=message))

        return [
            await self._edge.subscribe(
                subjects.PLACEMENTS_REJECTED, PlacementRejected, rejected, family="placements"
            ),
            await self._edge.subscribe(
                subjects.PLACEMENTS_INVALID, PodInvalid, invalid, family="placements"
            ),
            await self._edge.subscribe(subjects.PODS_PENDING, PodPending, queued, family="pods"),
            await self._edge.subscribe(subjects.PODS_DELETED, PodDeleted, deleted, family="pods"),
        ]

    async def run(self) -> None:
        """Watch every bucket until cancelled. The bus ends a watch once the connection to NATS
        was lost and is back (a watch does not survive a server restart), and :meth:`watch`
        starts it again, so the current values show within a second of a reconnect."""
        async with asyncio.TaskGroup() as group:
            for bucket in BUCKET_NAMES:
                group.create_task(self.watch(bucket), name=f"watch-{bucket}")

    async def watch(self, bucket: Bucket) -> None:
        """Follow ``bucket`` until cancelled, starting the watch again whenever it fails."""
        backoff = 0.5
        while True:
            synced = Flag()
            try:
                await self._watch_once(bucket, synced)
                log.warning("KV watch ended; watching again", extra={"bucket": bucket})
            except Exception as error:  # the server went away, the bucket was deleted, ...
                log.warning(
                    "KV watch failed; watching again",
                    extra={"bucket": bucket, "error": f"{type(error).__name__}: {error}"},
                )
            backoff = 0.5 if synced.value else min(backoff * 2, MAX_BACKOFF_S)
            await self._clock.sleep(backoff)

    async def _watch_once(self, bucket: Bucket, synced: Flag) -> None:
        initial: set[str] | None = set()
        async for entry in self._bus.kv_watch(BUCKET_NAMES[bucket]):
            if entry is None:
                if initial is not None:
                    self._sink(BucketSynced(bucket=bucket, keys=frozenset(initial)))
                    self._synced(bucket)
                    synced.value = True
                    initial = None
                continue
            if initial is not None:
                if entry.deleted:
                    initial.discard(entry.key)
                else:
                    initial.add(entry.key)
            event = await self._event(bucket, entry)
            if event is not None:
                self._sink(event)

    @staticmethod
    def _delivery(bucket: Bucket, entry: KvEntry) -> Delivery:
        return Delivery(subject=f"$KV.{BUCKET_NAMES[bucket]}.{entry.key}", data=entry.value)

    async def _decode(self, bucket: Bucket, entry: KvEntry, message_type: type[T]) -> T | None:
        return await self._edge.accept(self._delivery(bucket, entry), message_type, family=bucket)

    async def _checked(
        self, bucket: Bucket, entry: KvEntry, problem: str | None, event: Event
    ) -> Event | None:
        """``event``, or None after rejecting ``entry`` for ``problem``."""
        if problem is None:
            return event
        await self._edge.reject(
            self._delivery(bucket, entry), family=bucket, reason=problem, kind="key"
        )
        return None

    async def _event(self, bucket: Bucket, entry: KvEntry) -> Event | None:
        """The event ``entry`` means, or None when it was rejected."""
        key = entry.key
        match bucket:
            case "inventory":
                node = subjects.node_from_token(key)
                if entry.deleted:
                    self._inventories.pop(node, None)
                    return InventoryChanged(node=node, inventory=None)
                inventory = await self._decode(bucket, entry, NodeInventory)
                if inventory is None:
                    return None
                verdict = validation.take_inventory(
                    inventory, self._inventories.get(node), node=node, now=self._clock.now()
                )
                if verdict.problem:
                    await self._edge.reject(
                        self._delivery(bucket, entry),
                        family=bucket,
                        reason=verdict.problem,
                        kind="validate",
                    )
                if verdict.take is None:
                    return None
                self._inventories[node] = verdict.take
                return InventoryChanged(node=node, inventory=verdict.take)
            case "nodes":
                if entry.deleted:
                    return FactsChanged(node=subjects.node_from_token(key), facts=None)
                facts = await self._decode(bucket, entry, NodeFacts)
                if facts is None:
                    return None
                return await self._checked(
                    bucket,
                    entry,
                    node_key_problem(key, facts.node),
                    FactsChanged(node=facts.node, facts=facts),
                )
            case "assignments":
                if entry.deleted:
                    return RecordChanged(key=key, record=None)
                record = await self._decode(bucket, entry, AssignmentRecord)
                if record is None:
                    return None
                return await self._checked(
                    bucket,
                    entry,
                    record_key_problem(key, record),
                    RecordChanged(key=key, record=record),
                )
            case "stats":
                if entry.deleted:
                    return StatsChanged(key=key, stats=None)
                stats = await self._decode(bucket, entry, ClusterStats)
                if stats is None:
                    return None
                return await self._checked(
                    bucket,
                    entry,
                    stats_key_problem(key, stats),
                    StatsChanged(key=key, stats=stats),
                )
