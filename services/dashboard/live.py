"""The live view: holds the state, renders views, and pushes what changed to every open page.

Events are folded in as they arrive (:meth:`LiveView.apply`). The push loop wakes when something
changed, waits ``push_interval_s`` more so that a burst of events becomes one update, and sends each
connected page only the nodes whose views changed, the totals, and the Pending table when it
changed. It also wakes once a second on its own, because staleness changes with time alone and
because the connection to NATS can drop without any event.

Node views are cached by (node version, stale): with 100 nodes and one record changing, one node
view is rendered again, not a hundred.

A page that cannot keep up (its queue of updates is full) is disconnected; its EventSource
reconnects by itself and starts again from a fresh snapshot, so it never shows a view with a gap.
A page gets its snapshot when it connects (or, if it connected before the initial KV values were
all loaded, at the first push after that); every update after it is relative to the last push,
which is never older than the snapshot, so replacing the nodes it carries is always correct.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from services.dashboard.core.state import Bucket, Event, State, reduce
from services.dashboard.core.views import (
    ClusterView,
    FragmentationView,
    NodeView,
    PendingView,
    RunningView,
    Totals,
    ViewPolicy,
    fragmentation_view,
    inventory_stale,
    node_view,
    pending_view,
    running_view,
    sorted_nodes,
    tenants_view,
    totals,
)
from shared.clock import Clock
from shared.messages.stats import TenantUsage

log = logging.getLogger(__name__)

BUCKETS: Final[tuple[Bucket, ...]] = ("inventory", "nodes", "assignments", "stats")
TICK_S: Final = 1.0
CLIENT_QUEUE: Final = 32

ViewKey = tuple[int, bool]
"""(node version, inventory stale): a node's view changes only when this does."""


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """SSE ``snapshot``: everything a page needs to draw itself from nothing."""

    connected: bool
    cluster: ClusterView
    pending: PendingView


class Update(msgspec.Struct, frozen=True, kw_only=True):
    """SSE ``update``: what changed since the previous update."""

    connected: bool
    generated_at: float
    totals: Totals
    fragmentation: FragmentationView
    nodes: tuple[NodeView, ...]
    """Changed or new nodes."""
    removed: tuple[str, ...]
    order: tuple[str, ...] | None
    """Every node name in display order, when the set of nodes changed."""
    pending: PendingView | None
    """The Pending table, when it changed."""
    tenants: tuple[TenantUsage, ...] = ()


class Status(msgspec.Struct, frozen=True, kw_only=True):
    """SSE ``status``: not showing data yet, and why."""

    connected: bool
    synced: bool
    message: str


@dataclass(frozen=True)
class LiveMetrics:
    """The dashboard's own counters and gauges."""

    events: Counter
    pages: Gauge
    updates: Counter
    dropped: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> LiveMetrics:
        return cls(
            events=Counter(
                "tessera_dashboard_events_total",
                "KV entries and messages folded into the dashboard's state, by kind.",
                ["kind"],
                registry=registry,
            ),
            pages=Gauge(
                "tessera_dashboard_pages", "Pages connected for live updates.", registry=registry
            ),
            updates=Counter(
                "tessera_dashboard_updates_total",
                "Live updates pushed (each sent to every connected page).",
                registry=registry,
            ),
            dropped=Counter(
                "tessera_dashboard_pages_dropped_total",
                "Pages disconnected because they did not keep up (they reconnect by themselves).",
                registry=registry,
            ),
        )


def sse(event: Literal["snapshot", "update", "status"], payload: msgspec.Struct) -> bytes:
    """One server-sent event; JSON has no raw newlines, so it fits on one ``data:`` line."""
    return b"event: " + event.encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"


class Page:
    """One connected page: a bounded queue of encoded events; ``None`` ends the stream."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=CLIENT_QUEUE)
        self.has_snapshot = False

    def send(self, chunk: bytes) -> bool:
        """Queue ``chunk``; False (and the stream is ended) when the page fell behind."""
        try:
            self.queue.put_nowait(chunk)
        except asyncio.QueueFull:
            self.close()
            return False
        return True

    def close(self) -> None:
        while True:
            try:
                self.queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                with contextlib.suppress(asyncio.QueueEmpty):
                    self.queue.get_nowait()


class LiveView:
    """The state, its cached views, and the pages to push changes to."""

    def __init__(
        self,
        *,
        clock: Clock,
        policy: ViewPolicy,
        push_interval_s: float,
        pending_limit: int,
        metrics: LiveMetrics,
        connected: Callable[[], bool] = lambda: False,
    ) -> None:
        self.state = State()
        self._clock = clock
        self._policy = policy
        self._push_interval_s = push_interval_s
        self._pending_limit = pending_limit
        self._metrics = metrics
        self.connected = connected
        self._synced: set[Bucket] = set()
        self._changed = asyncio.Event()
        self._pages: set[Page] = set()
        self._views: dict[str, tuple[ViewKey, NodeView]] = {}
        self._sent_nodes: dict[str, ViewKey] = {}
        """The view keys of the nodes in the last update."""
        self._sent_pending_version = -1
        self._sent_connected = False
        self._sent_status: Status | None = None
        self._sent_fragmentation: tuple[int, bool] = (-1, False)

    @property
    def policy(self) -> ViewPolicy:
        return self._policy

    # --- input ---------------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Fold ``event`` into the state; the push loop sends what it changed."""
        self.state = reduce(self.state, event)
        self._metrics.events.labels(kind=type(event).__name__).inc()
        self._changed.set()

    def mark_synced(self, bucket: Bucket) -> None:
        """The first watch of ``bucket`` delivered its initial values."""
        if bucket not in self._synced:
            self._synced.add(bucket)
            self._changed.set()

    @property
    def synced(self) -> bool:
        """True once every bucket delivered its initial values (the views are complete)."""
        return self._synced.issuperset(BUCKETS)

    def waiting_for(self) -> str:
        """Why there is nothing to show yet."""
        if not self.connected():
            return "connecting to NATS"
        missing = [b for b in BUCKETS if b not in self._synced]
        return "loading " + ", ".join(missing) if missing else ""

    # --- views ---------------------------------------------------------------------------

    def _node_views(self, now: float) -> list[tuple[ViewKey, NodeView]]:
        """Every node's view in display order, with the key it was rendered for (cached)."""
        views: list[tuple[ViewKey, NodeView]] = []
        cache: dict[str, tuple[ViewKey, NodeView]] = {}
        for name in sorted_nodes(self.state):
            key = (
                self.state.node_versions.get(name, 0),
                inventory_stale(self.state, name, now=now, policy=self._policy),
            )
            cached = self._views.get(name)
            if cached is None or cached[0] != key:
                cached = (key, node_view(self.state, name, now=now, policy=self._policy))
            cache[name] = cached
            views.append(cached)
        self._views = cache
        return views

    def cluster(self) -> ClusterView:
        """``/api/v1/cluster`` now."""
        now = self._clock.now()
        return self._cluster(now, [view for _, view in self._node_views(now)])

    def _cluster(self, now: float, views: list[NodeView]) -> ClusterView:
        return ClusterView(
            generated_at=now,
            totals=totals(self.state, views),
            fragmentation=fragmentation_view(self.state, now=now, policy=self._policy),
            nodes=tuple(views),
            tenants=tenants_view(self.state),
        )

    def pending(self, limit: int | None = None) -> PendingView:
        """``/api/v1/pods/pending`` now."""
        return pending_view(self.state, now=self._clock.now(), limit=limit)

    def running(self, *, offset: int, limit: int, match: str) -> RunningView:
        """``/api/v1/pods/running`` now."""
        return running_view(
            self.state, now=self._clock.now(), offset=offset, limit=limit, match=match
        )

    def node_views(self) -> list[NodeView]:
        """Every node's view now (cached as the pushes cache them)."""
        return [view for _, view in self._node_views(self._clock.now())]

    # --- pages ---------------------------------------------------------------------------

    def connect_page(self) -> Page:
        """A new page: it gets a snapshot now (or a status until the views are complete)."""
        page = Page()
        if self.synced:
            page.send(self._snapshot(self._clock.now(), None))
            page.has_snapshot = True
        else:
            page.send(sse("status", self._status()))
        self._pages.add(page)
        self._metrics.pages.set(len(self._pages))
        return page

    def disconnect_page(self, page: Page) -> None:
        self._pages.discard(page)
        self._metrics.pages.set(len(self._pages))

    def close(self) -> None:
        """End every page's stream (at shutdown)."""
        for page in list(self._pages):
            page.close()
        self._pages.clear()
        self._metrics.pages.set(0)

    def _snapshot(self, now: float, views: list[NodeView] | None) -> bytes:
        if views is None:
            views = [view for _, view in self._node_views(now)]
        return sse(
            "snapshot",
            Snapshot(
                connected=self.connected(),
                cluster=self._cluster(now, views),
                pending=self.pending(self._pending_limit),
            ),
        )

    def _status(self) -> Status:
        return Status(connected=self.connected(), synced=self.synced, message=self.waiting_for())

    def _send(self, pages: list[Page], chunk: bytes) -> None:
        for page in pages:
            if not page.send(chunk):
                self._pages.discard(page)
                self._metrics.dropped.inc()
        self._metrics.pages.set(len(self._pages))

    def push(self) -> None:
        """Send every page what changed since the last push (nothing when nothing did).

        A page still waiting for its first snapshot (it connected before the views were
        complete) gets one now; the others get an update.
        """
        connected = self.connected()
        if not self.synced:
            status = self._status()
            if status != self._sent_status:  # connected, or another bucket loaded
                self._send(list(self._pages), sse("status", status))
                self._sent_status = status
            return
        now = self._clock.now()
        keyed = self._node_views(now)
        views = [view for _, view in keyed]
        waiting = [page for page in self._pages if not page.has_snapshot]
        if waiting:
            self._send(waiting, self._snapshot(now, views))
            for page in waiting:
                page.has_snapshot = True
        fragmentation = fragmentation_view(self.state, now=now, policy=self._policy)
        fragmentation_key = (self.state.stats_version, fragmentation.stale)
        sent = self._sent_nodes
        changed = [view for key, view in keyed if sent.get(view.name) != key]
        removed = [name for name in sent if name not in self._views]
        order = [view.name for view in views]
        pending_changed = self.state.pending_version != self._sent_pending_version
        if not (
            changed
            or removed
            or pending_changed
            or connected != self._sent_connected
            or fragmentation_key != self._sent_fragmentation
        ):
            return
        self._sent_nodes = {view.name: key for key, view in keyed}
        self._sent_pending_version = self.state.pending_version
        self._sent_connected = connected
        self._sent_fragmentation = fragmentation_key
        update = Update(
            connected=connected,
            generated_at=now,
            totals=totals(self.state, views),
            fragmentation=fragmentation,
            nodes=tuple(changed),
            removed=tuple(removed),
            order=tuple(order) if order != list(sent) else None,
            pending=self.pending(self._pending_limit) if pending_changed else None,
            tenants=tenants_view(self.state),
        )
        self._send([page for page in self._pages if page not in waiting], sse("update", update))
        self._metrics.updates.inc()

    async def run(self) -> None:
        """The push loop (runs until cancelled)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._changed.wait()
            if self._changed.is_set():
                # Let a burst of events land before rendering: one update for all of them.
                await self._clock.sleep(self._push_interval_s)
                self._changed.clear()
            self.push()
