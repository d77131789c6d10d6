"""List-and-watch of one kind of object, kept in a local cache (what client-go's informer does).

The informer lists, then watches from the list's resourceVersion, and keeps ``resource_version``
at the last event or bookmark it saw, so that:

- a watch the server ends (``timeoutSeconds``) or a connection that drops is resumed from that
  resourceVersion: nothing in between is lost, nothing is repeated;
- 410 Gone (the server no longer has that resourceVersion) lists again and reconciles the cache
  with the list: objects missing from it are reported deleted, new or changed ones added or
  modified, unchanged ones (same resourceVersion) are not reported again;
- an API that keeps failing is retried with capped backoff, the cache kept meanwhile.

Changes reach ``on_change(old, new)`` (``old`` None = added, ``new`` None = deleted), synchronously
and in order; a name reused by a new object (different uid) is reported as the old one's deletion
and then the new one's addition. The handler must be quick and must not raise: it records what
changed and leaves the work to a queue.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Generic

from services.binder.gateway import ApiUnavailableError, ClusterGateway, Kind, WatchExpiredError
from services.binder.metrics import BinderMetrics
from shared.clock import Clock
from shared.runtime.tasks import checkpoint

log = logging.getLogger(__name__)

Handler = Callable[[Kind | None, Kind | None], None]

BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0


class Informer(Generic[Kind]):
    """One kind's cache, fed by list and watch."""

    def __init__(
        self,
        *,
        name: str,
        kind: type[Kind],
        gateway: ClusterGateway,
        on_change: Handler[Kind],
        clock: Clock,
        metrics: BinderMetrics,
        field_selector: str = "",
        label_selector: str = "",
    ) -> None:
        self.name = name
        self._kind: type[Kind] = kind
        self._gateway = gateway
        self._on_change: Handler[Kind] = on_change
        self._clock = clock
        self._metrics = metrics
        self._field_selector = field_selector
        self._label_selector = label_selector
        self.cache: dict[str, Kind] = {}
        self.resource_version = ""
        self.synced = False
        self.lists = 0
        """How many times it listed (1 + one per 410)."""

    def get(self, key: str) -> Kind | None:
        return self.cache.get(key)

    async def run(self) -> None:
        """List and watch forever."""
        delay = BACKOFF_INITIAL_S
        while True:
            checkpoint()
            try:
                listing = await self._gateway.list_objects(
                    self._kind,
                    field_selector=self._field_selector,
                    label_selector=self._label_selector,
                )
            except ApiUnavailableError as error:
                log.warning(
                    "cannot list; retrying",
                    extra={"informer": self.name, "error": str(error), "retry_s": delay},
                )
                await self._clock.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            delay = BACKOFF_INITIAL_S
            self.lists += 1
            self._replace(listing.items)
            self.resource_version = listing.resource_version
            if not self.synced:
                self.synced = True
                log.info(
                    "informer synced", extra={"informer": self.name, "objects": len(self.cache)}
                )
            await self._watch()

    async def _watch(self) -> None:
        """Watch from ``resource_version`` until a 410 asks for a new list."""
        delay = BACKOFF_INITIAL_S
        while True:
            checkpoint()
            events = 0
            try:
                stream = self._gateway.watch_objects(
                    self._kind,
                    resource_version=self.resource_version,
                    field_selector=self._field_selector,
                    label_selector=self._label_selector,
                )
                async with contextlib.aclosing(stream):
                    async for event in stream:
                        checkpoint()
                        events += 1
                        if event.object is not None:
                            self._apply(event.type, event.object)
                        self.resource_version = event.resource_version or self.resource_version
                reason = "closed"
            except WatchExpiredError:
                self._metrics.watch_restarts.labels(resource=self.name, reason="expired").inc()
                log.info(
                    "watch expired (410); listing again",
                    extra={"informer": self.name, "resource_version": self.resource_version},
                )
                return
            except ApiUnavailableError as error:
                reason = "error"
                log.warning("watch failed", extra={"informer": self.name, "error": str(error)})
            self._metrics.watch_restarts.labels(resource=self.name, reason=reason).inc()
            if events:
                delay = BACKOFF_INITIAL_S
                continue
            # Nothing came through: do not spin on a server that ends every watch at once.
            await self._clock.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    def _apply(self, kind: str, obj: Kind) -> None:
        key = obj.metadata.key
        if kind == "DELETED":
            old = self.cache.pop(key, None)
            if old is not None:
                self._on_change(old, None)
            return
        self._put(key, obj)

    def _put(self, key: str, obj: Kind) -> None:
        old = self.cache.get(key)
        if old is not None and old.metadata.resource_version == obj.metadata.resource_version:
            return  # already seen (a re-list, or a watch resumed at an older point)
        self.cache[key] = obj
        if old is not None and old.metadata.uid != obj.metadata.uid:
            self._on_change(old, None)
            self._on_change(None, obj)
        else:
            self._on_change(old, obj)

    def _replace(self, items: list[Kind]) -> None:
        listed = {item.metadata.key: item for item in items}
        for key in [k for k in self.cache if k not in listed]:
            self._on_change(self.cache.pop(key), None)
        for key, item in listed.items():
            self._put(key, item)
