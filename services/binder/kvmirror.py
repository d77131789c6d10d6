"""The leader's writer of a KV bucket that mirrors one of the binder's Kubernetes caches for
services that cannot read Kubernetes (``namespaces.py``: namespace labels for the placer's
extender; ``draindex.py``: claim classes for the webhook).

Each change wakes the publisher, which writes the entries that differ from what is published,
deletes those gone and, once (and once :meth:`KvMirror.listable`), the word that every entry is
there. A new leader, or one whose NATS lost its store, first reads what is published, so a failover
writes only what changed meanwhile. Every write is fenced by the Lease. NATS away or leadership
lost, it tries again shortly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from shared.clock import Clock
from shared.runtime.bus import Bus
from shared.runtime.consumer import RETRY_S

log = logging.getLogger(__name__)

V = TypeVar("V")


def mirror_changes(
    published: Mapping[str, object | None], current: Mapping[str, object]
) -> tuple[list[str], list[str]]:
    """The keys to write (new, changed, or unreadable as published) and those to delete (gone),
    each sorted."""
    writes = sorted(key for key, value in current.items() if published.get(key) != value)
    deletes = sorted(key for key in published if key not in current)
    return writes, deletes


class KvMirror(Generic[V]):
    """One bucket's writer (module docstring); subclasses say what is current and how it
    reads."""

    what = "entries"
    """For the log lines."""

    def __init__(
        self, *, bus: Bus, clock: Clock, fence: Callable[[str], None], bucket: str, listed_key: str
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._fence = fence
        self._bucket = bucket
        self._listed_key = listed_key
        self._published: dict[str, V | None] | None = None
        """What is published (None: to be read from KV first; a None value: unreadable)."""
        self._listed = False
        """Whether this leader wrote the listed word since it read what is published."""
        self._dirty = asyncio.Event()

    # --- what subclasses say -------------------------------------------------------------------

    def current(self) -> Mapping[str, V]:
        raise NotImplementedError

    def encode(self, key: str, value: V, *, now: float) -> bytes:
        raise NotImplementedError

    def decode(self, key: str, data: bytes) -> V | None:
        """The value published at ``key``; None when it does not read as one."""
        raise NotImplementedError

    def listed(self, entries: int, *, now: float) -> bytes:
        raise NotImplementedError

    def listable(self) -> bool:
        """Whether every entry is current (the caches behind them have listed)."""
        return True

    # --- publishing ----------------------------------------------------------------------------

    def changed(self) -> None:
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
                log.warning(f"cannot publish the {self.what} yet", extra={"error": repr(error)})
                await self._clock.sleep(RETRY_S)
                self._dirty.set()

    async def publish(self) -> None:
        """Write what differs from what is published, then (once) the word that all is."""
        if self._published is None:
            self._published = await self._read_published()
        published = self._published
        current = dict(self.current())
        writes, deletes = mirror_changes(published, current)
        now = self._clock.now()
        for key in writes:
            self._fence(f"publish {self.what}")
            await self._bus.kv_put(self._bucket, key, self.encode(key, current[key], now=now))
            published[key] = current[key]
        for key in deletes:
            self._fence(f"delete {self.what}")
            await self._bus.kv_delete(self._bucket, key)
            del published[key]
        if self._listed:
            return
        if not self.listable():
            await self._clock.sleep(RETRY_S / 4)  # a cache still lists: look again soon
            self._dirty.set()
            return
        self._fence(f"publish the {self.what} listed")
        await self._bus.kv_put(self._bucket, self._listed_key, self.listed(len(current), now=now))
        self._listed = True
        log.info(f"{self.what} published", extra={"entries": len(current)})

    async def _read_published(self) -> dict[str, V | None]:
        found: dict[str, V | None] = {}
        for entry in await self._bus.kv_list(self._bucket, ">"):
            if not entry.deleted and entry.key != self._listed_key:
                found[entry.key] = self.decode(entry.key, entry.value)
        return found
