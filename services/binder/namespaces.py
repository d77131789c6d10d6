"""The cluster's namespaces and their labels into KV ``tessera-namespaces``: what the placer's
extender resolves the namespace selectors of kube-scheduler's pods with
(``shared/messages/namespaces.py``; the pods the binder publishes have theirs resolved here
already).

The namespace informer keeps every namespace's labels (``ClusterSync.namespace_labels``); each
change wakes the leader's publisher, which writes what differs from what is published
(:func:`namespace_changes`) and, once everything is written, the word that every namespace is
listed (``_listed``). A new leader, or one whose NATS lost its store, first reads what is
published, so a failover writes only what changed meanwhile. Every write is fenced by the Lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from shared import codec, subjects
from shared.clock import Clock
from shared.messages.namespaces import NamespaceLabels, NamespacesListed
from shared.runtime.bus import Bus
from shared.runtime.consumer import RETRY_S

log = logging.getLogger(__name__)

Published = Mapping[str, Mapping[str, str] | None]
"""Namespace -> the labels published for it (None: an entry that does not read)."""


def namespace_changes(
    published: Published, current: Mapping[str, Mapping[str, str]]
) -> tuple[list[str], list[str]]:
    """The namespaces to write (new, relabelled, or unreadable as published) and those to delete
    (gone), each sorted by name."""
    writes = sorted(name for name, labels in current.items() if published.get(name) != labels)
    deletes = sorted(name for name in published if name not in current)
    return writes, deletes


class NamespacePublisher:
    """The leader's writer of ``tessera-namespaces`` (module docstring)."""

    def __init__(
        self,
        *,
        bus: Bus,
        clock: Clock,
        labels: Mapping[str, Mapping[str, str]],
        fence: Callable[[str], None],
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._labels = labels
        """The namespace informer's: every namespace's labels, kept current."""
        self._fence = fence
        self._published: dict[str, Mapping[str, str] | None] | None = None
        """What is published (None: to be read from KV first)."""
        self._listed = False
        """Whether this leader wrote ``_listed`` since it read what is published."""
        self._dirty = asyncio.Event()

    def changed(self) -> None:
        """A namespace came, went or was relabelled."""
        self._dirty.set()

    def resync(self) -> None:
        """Read what is published again, and write it all anew where it differs (a new leader, a
        store NATS lost)."""
        self._published = None
        self._listed = False
        self._dirty.set()

    async def run(self) -> None:
        """Publish every change, until cancelled (the leader's)."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.publish()
            except Exception as error:  # NATS away, leadership lost: try again shortly
                log.warning("cannot publish the namespaces yet", extra={"error": repr(error)})
                await self._clock.sleep(RETRY_S)
                self._dirty.set()

    async def publish(self) -> None:
        """Write what differs from what is published, then (once) the word that all is."""
        if self._published is None:
            self._published = await self._read_published()
        published = self._published
        current = dict(self._labels)
        writes, deletes = namespace_changes(published, current)
        now = self._clock.now()
        for name in writes:
            labels = dict(current[name])
            message = NamespaceLabels(namespace=name, labels=labels, observed_at=now)
            self._fence("publish namespace labels")
            await self._bus.kv_put(subjects.KV_NAMESPACES, name, codec.encode(message))
            published[name] = labels
        for name in deletes:
            self._fence("delete namespace labels")
            await self._bus.kv_delete(subjects.KV_NAMESPACES, name)
            del published[name]
        if not self._listed:
            listed = NamespacesListed(namespaces=len(current), listed_at=now)
            self._fence("publish the namespaces listed")
            await self._bus.kv_put(
                subjects.KV_NAMESPACES, subjects.NAMESPACES_LISTED, codec.encode(listed)
            )
            self._listed = True
            log.info("namespaces published", extra={"namespaces": len(current)})

    async def _read_published(self) -> dict[str, Mapping[str, str] | None]:
        found: dict[str, Mapping[str, str] | None] = {}
        for entry in await self._bus.kv_list(subjects.KV_NAMESPACES, ">"):
            if entry.deleted or entry.key == subjects.NAMESPACES_LISTED:
                continue
            try:
                message = codec.decode(entry.value, NamespaceLabels)
            except codec.DecodeError:
                found[entry.key] = None  # rewritten, or deleted when no such namespace exists
                continue
            found[entry.key] = message.labels if message.namespace == entry.key else None
        return found
