"""The API test double's storage: what etcd and the watch cache do for the real API server.

One cluster-wide revision counter stamps every write as ``metadata.resourceVersion`` (as etcd's
revision does). Each collection keeps its objects and a window of recent changes; a watch resumes
from any revision inside the window and gets 410 Gone (``too old resource version``) from one
before it. :meth:`Store.compact` empties every window at once (what an etcd compaction plus a watch
cache restart do to clients), so tests can force the 410 path.

Watches see changes through their selectors the way the watch cache translates them: an object
that starts to match is ``ADDED``, one that stops matching is ``DELETED`` (with its previous
content and the new revision), one that matches before and after is ``MODIFIED``.

Stored objects are never changed in place: every write stores a fresh copy, so history entries and
list results can be shared without copying.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from tessera.devcluster.jsoncopy import clone
from tessera.devcluster.resources import ApiError, Obj, ResourceType
from tessera.devcluster.selectors import Selector

ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]
Key = tuple[str, str]
"""(namespace, name); namespace is "" for cluster-scoped objects."""


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata", {})
    return (meta.get("namespace", "") or "", meta.get("name", ""))


def labels_of(obj: Obj) -> dict[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


@dataclass(frozen=True)
class Change:
    """One write to a collection, as the watch cache records it."""

    revision: int
    type: ChangeType
    object: Obj
    """The new state; for DELETED, the last state stamped with the deletion's revision."""
    previous: Obj | None


class Closed:
    """Queued to a watcher to end its stream: cleanly (EOF) or by cutting the connection."""

    def __init__(self, abrupt: bool) -> None:
        self.abrupt = abrupt


@dataclass(eq=False)
class Watcher:
    """One open watch: the changes of its collection that pass its namespace and selectors."""

    resource: ResourceType
    namespace: str
    match: Selector
    queue: asyncio.Queue[Change | Closed] = field(default_factory=asyncio.Queue)

    def passes(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        if self.namespace and obj.get("metadata", {}).get("namespace") != self.namespace:
            return False
        return self.match(self.resource.fields(obj), labels_of(obj))

    def translate(self, change: Change) -> tuple[ChangeType, Obj] | None:
        """What this watcher sees of ``change``, or None when it sees nothing."""
        now = change.type != "DELETED" and self.passes(change.object)
        before = self.passes(change.previous)
        if now and not before:
            return "ADDED", change.object
        if now and before:
            return "MODIFIED", change.object
        if before:
            return "DELETED", _stamped(change.previous or {}, change.revision)
        return None


def _stamped(obj: Obj, revision: int) -> Obj:
    copy = dict(obj)
    copy["metadata"] = {**obj.get("metadata", {}), "resourceVersion": str(revision)}
    return copy


@dataclass
class Collection:
    """The objects of one storage key, the window of recent changes and the open watches."""

    objects: dict[Key, Obj] = field(default_factory=dict)
    history: deque[Change] = field(default_factory=deque)
    oldest: int = 0
    """Watches may resume from this revision or later (events after it are all in history)."""
    watchers: set[Watcher] = field(default_factory=set)


class Store:
    """Every collection, one revision counter."""

    def __init__(self, *, history_limit: int = 20_000, snapshot_limit: int = 32) -> None:
        self.revision = 1
        self._collections: dict[str, Collection] = {}
        self._history_limit = history_limit
        self._snapshots: OrderedDict[str, tuple[int, list[Obj]]] = OrderedDict()
        self._snapshot_limit = snapshot_limit
        self._snapshot_ids = itertools.count(1)

    def collection(self, resource: ResourceType) -> Collection:
        return self._collections.setdefault(resource.store_key, Collection())

    # --- reads ----------------------------------------------------------------------------------

    def get(self, resource: ResourceType, key: Key) -> Obj | None:
        return self.collection(resource).objects.get(key)

    def objects(self, resource: ResourceType, namespace: str = "") -> Iterable[Obj]:
        for (ns, _), obj in sorted(self.collection(resource).objects.items()):
            if not namespace or ns == namespace:
                yield obj

    def list_page(
        self,
        resource: ResourceType,
        *,
        namespace: str,
        match: Selector,
        limit: int = 0,
        token: str = "",
    ) -> tuple[list[Obj], str, str]:
        """(items, resourceVersion, continue token) with ``limit``/``continue`` paging.

        Pages come from one snapshot taken by the first call, like etcd reads at one revision;
        a token whose snapshot is gone is 410 Gone."""
        if token:
            snapshot_id, _, offset_text = token.partition(":")
            snapshot = self._snapshots.get(snapshot_id)
            if snapshot is None or not offset_text.isdigit():
                raise ApiError(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter.",
                )
            listed_at, items = snapshot
            offset = int(offset_text)
        else:
            watcher = Watcher(resource, namespace, match)
            items = [o for o in self.objects(resource, namespace) if watcher.passes(o)]
            offset, snapshot_id, listed_at = 0, "", self.revision
        if limit <= 0 or offset + limit >= len(items):
            return items[offset:], str(listed_at), ""
        if not snapshot_id:
            snapshot_id = str(next(self._snapshot_ids))
            self._snapshots[snapshot_id] = (listed_at, items)
            while len(self._snapshots) > self._snapshot_limit:
                self._snapshots.popitem(last=False)
        return items[offset : offset + limit], str(listed_at), f"{snapshot_id}:{offset + limit}"

    # --- writes ---------------------------------------------------------------------------------

    def put(self, resource: ResourceType, obj: Obj) -> Obj:
        """Store a copy of ``obj`` (create or replace) at a new revision; the stored object."""
        collection = self.collection(resource)
        stored: Obj = clone(obj)
        self.revision += 1
        stored.setdefault("metadata", {})["resourceVersion"] = str(self.revision)
        key = key_of(stored)
        previous = collection.objects.get(key)
        collection.objects[key] = stored
        self._record(
            collection, Change(self.revision, "MODIFIED" if previous else "ADDED", stored, previous)
        )
        return stored

    def delete(self, resource: ResourceType, key: Key) -> Obj | None:
        collection = self.collection(resource)
        previous = collection.objects.pop(key, None)
        if previous is None:
            return None
        self.revision += 1
        self._record(
            collection,
            Change(self.revision, "DELETED", _stamped(previous, self.revision), previous),
        )
        return previous

    def _record(self, collection: Collection, change: Change) -> None:
        collection.history.append(change)
        while len(collection.history) > self._history_limit:
            dropped = collection.history.popleft()
            collection.oldest = dropped.revision
        for watcher in collection.watchers:
            watcher.queue.put_nowait(change)

    # --- watches --------------------------------------------------------------------------------

    def watch(
        self,
        resource: ResourceType,
        *,
        namespace: str,
        match: Selector,
        since: int | None,
    ) -> tuple[list[tuple[ChangeType, Obj]], Watcher]:
        """Open a watch: the events to send first, and the watcher that queues later changes.

        ``since`` None means "the current state, then changes" (``resourceVersion`` unset or
        "0"): every matching object as ADDED. A revision means "every change after it"; one
        older than the collection's window raises 410 Gone."""
        collection = self.collection(resource)
        watcher = Watcher(resource, namespace, match)
        if since is None:
            initial: list[tuple[ChangeType, Obj]] = [
                ("ADDED", o) for o in self.objects(resource, namespace) if watcher.passes(o)
            ]
        else:
            if since < collection.oldest:
                raise ApiError(
                    410,
                    "Expired",
                    f"too old resource version: {since} ({collection.oldest + 1})",
                )
            initial = []
            for change in collection.history:
                if change.revision > since and (seen := watcher.translate(change)) is not None:
                    initial.append(seen)
        collection.watchers.add(watcher)
        return initial, watcher

    def stop_watch(self, watcher: Watcher) -> None:
        self.collection(watcher.resource).watchers.discard(watcher)

    def close_watches(self, resource: ResourceType | None = None, *, abrupt: bool = False) -> int:
        """End every open watch (of one resource's storage, or all); how many were open."""
        closed = 0
        for name, collection in self._collections.items():
            if resource is not None and name != resource.store_key:
                continue
            for watcher in list(collection.watchers):
                watcher.queue.put_nowait(Closed(abrupt))
                closed += 1
        return closed

    def compact(self) -> int:
        """Forget every recorded change: watches from any revision before now get 410 Gone,
        and every list continue token expires. Returns the compacted revision."""
        for collection in self._collections.values():
            collection.history.clear()
            collection.oldest = self.revision
        self._snapshots.clear()
        return self.revision
