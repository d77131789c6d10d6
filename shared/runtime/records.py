"""The one live mirror of assignment records (KV ``tessera-assignments``), by key and by node:
the binder mirrors every node's records, a device plugin its own node's (``keys``).

Fed by a KV watch (initial values, then every change; watched again if the server ends it) and by
the service's own compare-and-set writes (:meth:`RecordMirror.remember`), whichever revision is
newer winning. Each revision is decoded at the edge and judged by ``check`` (every mirror's: the key
names the record's node and pod, and the version follows the last one taken of the key:
``shared.validation.transition_problem``, so a record moved backwards is refused by the binder's
ambiguity gate as by the device plugin); one that fails is dead-lettered with the reason and stops
being served, never blocking a valid one, and is not dead-lettered twice. The last version accepted
of each key (released ones included) stays the reference a rewrite is checked against and the
revision an older version arriving late (our own write racing the watch) cannot undercut; deleted
keys leave a tombstone of their revision for the same reason.

A writer that mirrors a key writes it with :meth:`RecordMirror.write`: a compare-and-set the
server does not answer (``Bus.kv_send``), whose outcome is the first version of the key the watch
shows above the revision written over, as the watch shows that version anyway.

Served (``views``, ``get``, ``on_node``): accepted, neither released nor refused since;
``latest`` is the last version accepted, released ones included.
``changed`` bumps on every change, so a waiter (the binder's ambiguity gate, an Allocate waiting
for its record) notes the version, looks, and waits past it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from shared import codec, subjects, validation
from shared.clock import Clock
from shared.messages.assignments import AssignmentRecord, RecordView
from shared.runtime.bus import Bus, Delivery, KvEntry
from shared.runtime.echo import EchoWait
from shared.runtime.edge import Edge
from shared.runtime.follow import follow
from shared.runtime.tasks import ChangeCounter

log = logging.getLogger(__name__)

TOMBSTONES = 100_000
"""Revisions of deleted keys remembered, so an older version arriving late (our own write racing
the watch) cannot bring a record back."""

WRITE_SEEN_S: Final = 2.0
"""How long :meth:`RecordMirror.write` waits for the watch to show a version above the one it
wrote over; the watch of a NATS cluster can stay silent for seconds (then the write is read
back)."""


Check = Callable[[str, AssignmentRecord, RecordView | None], str | None]
"""Why a record read under a key cannot be taken, given the last version accepted (None: it can)."""


def version_problem(key: str, record: AssignmentRecord, known: RecordView | None) -> str | None:
    """The check every mirror applies: the record stands under the key of its node and pod, and
    it may follow ``known``, the last version taken of the key (within a commit its state only
    moves forward; another commit takes the key only over a released record). A version a node's
    credentials replayed from before (``allocated -> bound``) held every pod headed to that node
    at the binder's ambiguity gate, 30 s at a time, while the device plugin refused it."""
    expected = subjects.assignment_key(record.node, record.pod_uid)
    if expected != key:
        return f"record under key {key} belongs under {expected}"
    return validation.transition_problem(known.record if known is not None else None, record)


def _ignore(*_: object) -> None:
    return None


def _delivery(key: str, data: bytes) -> Delivery:
    """A KV entry of the assignments bucket, as the edge sees a delivery."""
    return Delivery(subject=f"$KV.{subjects.KV_ASSIGNMENTS}.{key}", data=data)


class RecordMirror:
    """The assignment records of ``keys``: the last accepted of each, and those served."""

    def __init__(
        self,
        *,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        keys: str = ">",
        check: Check = version_problem,
        on_taken: Callable[[RecordView], None] = _ignore,
        on_deleted: Callable[[str, RecordView | None], None] = _ignore,
        on_loaded: Callable[[set[str]], None] = _ignore,
        changed: ChangeCounter | None = None,
    ) -> None:
        """``on_taken`` sees each version accepted, ``on_deleted`` each key deleted (with its
        last accepted version), ``on_loaded`` the keys of each watch's initial values;
        ``changed`` may be shared with what else a waiter must see move."""
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self.keys = keys
        self._check = check
        self._on_taken = on_taken
        self._on_deleted = on_deleted
        self._on_loaded_hook = on_loaded
        self._views: dict[str, RecordView] = {}
        """Served: accepted, not released, not refused since."""
        self._by_node: dict[str, dict[str, RecordView]] = {}
        self._accepted: dict[str, RecordView] = {}
        """The last version accepted of every key, released ones included: what a rewrite is
        checked against (kept when a rewrite is refused)."""
        self._rejected: dict[str, int] = {}
        """Key -> the revision last dead-lettered, so a re-read does not dead-letter it twice."""
        self._gone: OrderedDict[str, int] = OrderedDict()
        self.changed = changed if changed is not None else ChangeCounter()
        self.loaded = False
        self._writes: dict[str, list[EchoWait]] = {}
        """Key -> the writes of :meth:`write` waiting for a version above the revision each
        wrote over."""

    # --- reading -------------------------------------------------------------------------------

    def get(self, key: str) -> RecordView | None:
        return self._views.get(key)

    def latest(self, key: str) -> RecordView | None:
        """The last version of ``key`` accepted, released ones included (None: none, or the
        key is deleted or refused)."""
        if key in self._rejected:
            return None
        return self._accepted.get(key)

    def on_node(self, node: str) -> list[RecordView]:
        return list(self._by_node.get(node, {}).values())

    def views(self) -> list[RecordView]:
        return list(self._views.values())

    def revision(self, key: str) -> int:
        """The newest revision of ``key`` taken in (released or deleted ones included; 0: none)."""
        known = self._accepted.get(key)
        return max(known.revision if known is not None else 0, self._gone.get(key, 0))

    # --- writing -------------------------------------------------------------------------------

    async def write(
        self,
        key: str,
        value: bytes,
        *,
        revision: int,
        seen_s: float = WRITE_SEEN_S,
        create: bool = False,
        answered: bool = False,
    ) -> int | None:
        """Compare-and-set ``value`` over version ``revision`` of ``key``, unanswered
        (``Bus.kv_send``): the revision it landed at, or None when another version came first.

        The server stores a key's versions in order and a compare-and-set lands only on the one
        it names, so the first version the watch shows above ``revision`` is this write or the
        one that beat it. Raises ``OutcomeUnknownError`` when the watch showed none within
        ``seen_s`` (silent, or watched again: its initial values show a key's latest version
        only), or showed one after the bus took another store's epoch (what it shows is of
        that store): the caller reads the key back, as for a write whose answer was lost.

        ``answered``: a write the server answers (``Bus.kv_update``, ``kv_create``) instead, for
        a caller that found the watch behind (a version it had to read afresh): waiting for that
        watch to show the write would take ``seen_s`` when it is silent. A mirror whose watch has
        not loaded (or does not run) writes so too: nothing would show it the write."""
        if max(self.revision(key), self._rejected.get(key, 0)) > revision:
            return None  # a later version is here already: this write could only lose
        if answered or not self.loaded:
            bucket = subjects.KV_ASSIGNMENTS
            landed = await (
                self._bus.kv_create(bucket, key, value)
                if create
                else self._bus.kv_update(bucket, key, value, revision=revision)
            )
            if landed is not None:
                await self.take(KvEntry(key=key, value=value, revision=landed))
            return landed
        awaited = EchoWait(key, above=revision, value=value, epoch=self._bus.store_epoch)
        self._writes.setdefault(key, []).append(awaited)
        try:
            return await awaited.send(
                self._bus, subjects.KV_ASSIGNMENTS, seen_s=seen_s, create=create
            )
        finally:
            waiting = self._writes[key]
            waiting.remove(awaited)
            if not waiting:
                del self._writes[key]

    async def create(self, key: str, value: bytes, *, seen_s: float = WRITE_SEEN_S) -> int | None:
        """Create-only :meth:`write`: over no version of ``key``, or over the deletion of it this
        mirror saw last (as ``kv_create`` writes over a delete marker; one of a store that was
        lost is no deletion in the store of now); None when a version is there."""
        if key in self._accepted or key in self._rejected:
            return None
        gone = self._gone.get(key, 0)
        return await self.write(key, value, revision=gone, seen_s=seen_s, create=True)

    def _settle(self, key: str, revision: int, value: bytes | None) -> None:
        """The watch shows ``key`` at ``revision`` (``value`` None: deleted): the outcome of each
        write waiting for a version above the one it wrote over."""
        for awaited in self._writes.get(key, ()):
            awaited.settle(revision, value, epoch=self._bus.store_epoch)

    # --- taking versions in --------------------------------------------------------------------

    async def remember(self, view: RecordView) -> None:
        """Take a record version in (from the watch, a read, or our own write)."""
        known = self._accepted.get(view.key)
        if known is not None and known.revision >= view.revision:
            return  # our own compare-and-set already stored this revision (or a later one)
        if self._gone.get(view.key, 0) >= view.revision:
            return
        self._accepted[view.key] = view
        if view.record.state == "released":
            self._drop(view.key)
        else:
            self._views[view.key] = view
            self._by_node.setdefault(view.record.node, {})[view.key] = view
        self._on_taken(view)
        await self.changed.bump()

    async def forget(self, key: str) -> None:
        """Stop serving ``key`` (the last accepted version stays the reference for rewrites)."""
        if self._drop(key):
            await self.changed.bump()

    async def take(self, entry: KvEntry) -> RecordView | None:
        """Take a value read from the bucket in; what is now known of its key (None: refused)."""
        key, revision = entry.key, entry.revision
        known = self._accepted.get(key)
        if known is not None and known.revision >= revision:
            return known  # already taken (our own compare-and-set stored this or a later one)
        if self._rejected.get(key) == revision:
            return None  # already dead-lettered
        delivery = _delivery(key, entry.value)
        record = await self._edge.accept(delivery, AssignmentRecord, family="assignments")
        if record is None:
            self._rejected[key] = revision
            await self.forget(key)
            return None
        problem = self._check(key, record, known)
        if problem:
            await self._refuse(key, revision, delivery, problem)
            return None
        self._rejected.pop(key, None)
        view = RecordView(key=key, revision=revision, record=record)
        await self.remember(view)
        known = self._accepted.get(key)
        return known if known is not None and known.revision >= revision else view

    async def read(self, key: str) -> RecordView | None:
        """The record as the KV bucket has it now (and the mirror updated to it)."""
        entry = await self._bus.kv_get(subjects.KV_ASSIGNMENTS, key)
        if entry is None:
            await self.forget(key)
            return None
        return await self.take(entry)

    async def refuse(self, view: RecordView, problem: str) -> None:
        """Dead-letter ``view`` with ``problem`` (found after it was taken) and stop serving it."""
        await self._refuse(
            view.key, view.revision, _delivery(view.key, codec.encode(view.record)), problem
        )

    async def _refuse(self, key: str, revision: int, delivery: Delivery, problem: str) -> None:
        self._rejected[key] = revision
        await self._edge.reject(
            delivery,
            family="assignments",
            reason=f"assignment record {key} revision {revision}: {problem}",
            kind="validate",
        )
        await self.forget(key)

    async def delete(self, key: str, revision: int = 0) -> None:
        """The key is gone from the bucket (at ``revision``, when known): forget all about it."""
        if revision:
            self._gone[key] = max(revision, self._gone.get(key, 0))
            self._gone.move_to_end(key)
            while len(self._gone) > TOMBSTONES:
                self._gone.popitem(last=False)
        self._on_deleted(key, self._accepted.pop(key, None))
        self._rejected.pop(key, None)
        await self.forget(key)

    def _drop(self, key: str) -> bool:
        view = self._views.pop(key, None)
        if view is None:
            return False
        on_node = self._by_node.get(view.record.node, {})
        on_node.pop(key, None)
        if not on_node:
            self._by_node.pop(view.record.node, None)
        return True

    # --- following the bucket ------------------------------------------------------------------

    async def run(self) -> None:
        """Mirror the bucket's ``keys`` forever."""
        await follow(
            self._bus,
            subjects.KV_ASSIGNMENTS,
            keys=self.keys,
            on_entry=self._on_entry,
            on_loaded=self._on_loaded,
            clock=self._clock,
            what="assignment record",
        )

    async def _on_entry(self, entry: KvEntry) -> None:
        if self._writes:
            self._settle(entry.key, entry.revision, None if entry.deleted else entry.value)
        if entry.deleted:
            await self.delete(entry.key, entry.revision)
        else:
            await self.take(entry)

    async def _on_loaded(self, listed: set[str]) -> None:
        for key in set(self._accepted) - listed:
            await self.delete(key)  # gone while no watch was running
        self._on_loaded_hook(listed)
        if not self.loaded:
            self.loaded = True
            log.info("assignment records loaded", extra={"records": len(self._views)})
