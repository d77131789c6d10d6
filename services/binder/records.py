"""A live mirror of the assignment records (KV ``tessera-assignments``), indexed by node.

Fed by a KV watch (initial values, then every change; watched again if the server ends it) and by
the binder's own compare-and-set writes, whichever revision is newer winning. Released and
deleted records leave the mirror. A record that does not decode is dead-lettered and ignored.
``changed`` lets the ambiguity gate wait for the record it waits on to move.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from shared import subjects
from shared.clock import Clock
from shared.messages.assignments import AssignmentRecord, RecordView
from shared.runtime.bus import Bus, Delivery, KvEntry
from shared.runtime.edge import Edge
from shared.runtime.follow import follow
from shared.runtime.tasks import ChangeCounter, checkpoint

log = logging.getLogger(__name__)

TOMBSTONES = 100_000
"""Revisions of released or deleted keys remembered, so an older version arriving late (our own
write racing the watch) cannot bring a record back."""


class RecordMirror:
    """Every non-released assignment record, by key and by node."""

    def __init__(self, *, bus: Bus, edge: Edge, clock: Clock) -> None:
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self._views: dict[str, RecordView] = {}
        self._by_node: dict[str, dict[str, RecordView]] = {}
        self._gone: OrderedDict[str, int] = OrderedDict()
        self.changed = ChangeCounter()
        self.loaded = False

    def get(self, key: str) -> RecordView | None:
        return self._views.get(key)

    def on_node(self, node: str) -> list[RecordView]:
        return list(self._by_node.get(node, {}).values())

    def views(self) -> list[RecordView]:
        return list(self._views.values())

    async def remember(self, view: RecordView) -> None:
        """Take a record version in (from the watch, a read, or our own write)."""
        known = self._views.get(view.key)
        if known is not None and known.revision >= view.revision:
            return
        if self._gone.get(view.key, 0) >= view.revision:
            return
        if view.record.state == "released":
            self._bury(view.key, view.revision)
            self._drop(view.key)
        else:
            self._views[view.key] = view
            self._by_node.setdefault(view.record.node, {})[view.key] = view
        await self.changed.bump()

    async def forget(self, key: str, revision: int = 0) -> None:
        if revision:
            self._bury(key, revision)
        if self._drop(key):
            await self.changed.bump()

    def _bury(self, key: str, revision: int) -> None:
        self._gone[key] = max(revision, self._gone.get(key, 0))
        self._gone.move_to_end(key)
        while len(self._gone) > TOMBSTONES:
            self._gone.popitem(last=False)

    def _drop(self, key: str) -> bool:
        view = self._views.pop(key, None)
        if view is None:
            return False
        on_node = self._by_node.get(view.record.node, {})
        on_node.pop(key, None)
        if not on_node:
            self._by_node.pop(view.record.node, None)
        return True

    async def read(self, key: str) -> RecordView | None:
        """The record as the KV bucket has it now (and the mirror updated to it)."""
        entry = await self._bus.kv_get(subjects.KV_ASSIGNMENTS, key)
        if entry is None:
            await self.forget(key)
            return None
        return await self._take(entry)

    async def _take(self, entry: KvEntry) -> RecordView | None:
        delivery = Delivery(subject=f"$KV.{subjects.KV_ASSIGNMENTS}.{entry.key}", data=entry.value)
        record = await self._edge.accept(delivery, AssignmentRecord, family="assignments")
        if record is None:
            await self.forget(entry.key)
            return None
        expected = subjects.assignment_key(record.node, record.pod_uid)
        if expected != entry.key:
            await self._edge.reject(
                delivery,
                family="assignments",
                reason=f"record under key {entry.key} belongs under {expected}",
                kind="validate",
            )
            await self.forget(entry.key)
            return None
        view = RecordView(key=entry.key, revision=entry.revision, record=record)
        await self.remember(view)
        return self._views.get(entry.key, view)

    async def run(self) -> None:
        """Mirror the bucket forever."""
        await follow(
            self._bus,
            subjects.KV_ASSIGNMENTS,
            on_entry=self._on_entry,
            on_loaded=self._on_loaded,
            clock=self._clock,
            what="assignment record",
        )

    async def _on_entry(self, entry: KvEntry) -> None:
        checkpoint()
        if entry.deleted:
            await self.forget(entry.key, entry.revision)
        else:
            await self._take(entry)

    async def _on_loaded(self, listed: set[str]) -> None:
        for key in set(self._views) - listed:
            await self.forget(key)  # gone while no watch was running
        if not self.loaded:
            self.loaded = True
            log.info("assignment records loaded", extra={"records": len(self._views)})
