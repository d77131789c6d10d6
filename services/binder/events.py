"""Kubernetes Events, aggregated and rate limited, written in the background.

``emit`` never blocks and never fails the caller: events are how people read what happened, not
part of the protocol. Like client-go's events.k8s.io recorder:

- the first occurrence of an event (same object, type, reason, action and note) creates an Event;
- repeats within ``series_window_s`` of the last one add to its series (count, last time); the
  series is written at most once per ``series_interval_s`` per event (a PATCH), so a pod rejected
  a hundred times a minute costs one write a few seconds, not a hundred;
- new Events are limited to ``burst`` at once and ``rate_per_s`` after that across the binder;
  what exceeds it, or a full queue, is dropped and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from services.binder.gateway import ApiUnavailableError, ClusterGateway
from services.binder.metrics import BinderMetrics
from services.binder.rules import describe
from shared import annotations as names
from shared.clock import Clock
from shared.runtime.tasks import checkpoint

log = logging.getLogger(__name__)

EventKey = tuple[str, str, str, str, str]
"""(object uid, type, reason, action, note)."""


@dataclass
class _Series:
    name: str
    namespace: str
    count: int
    last: float
    written_count: int
    written_at: float
    created: bool = False


@dataclass
class _Pending:
    key: EventKey
    regarding: dict[str, str]
    at: float


@dataclass
class EventRecorder:
    """Writes Events for the binder (see the module docstring)."""

    gateway: ClusterGateway
    clock: Clock
    metrics: BinderMetrics
    instance: str
    series_window_s: float = 360.0
    series_interval_s: float = 10.0
    rate_per_s: float = 50.0
    burst: int = 500
    writers: int = 4
    queue_size: int = 10_000
    tracked: int = 10_000
    _queue: asyncio.Queue[_Pending] = field(init=False)
    _series: OrderedDict[EventKey, _Series] = field(init=False, default_factory=OrderedDict)
    _dirty: set[EventKey] = field(init=False, default_factory=set)
    _tokens: float = field(init=False)
    _refilled: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self._queue = asyncio.Queue(self.queue_size)
        self._tokens = float(self.burst)
        self._refilled = self.clock.monotonic()

    def emit(
        self, *, regarding: dict[str, str], event_type: str, reason: str, action: str, note: str
    ) -> None:
        """Record an event about ``regarding`` (a Pod reference); returns at once."""
        key = (regarding["uid"], event_type, reason, action, describe.truncate_note(note))
        try:
            self._queue.put_nowait(_Pending(key=key, regarding=regarding, at=self.clock.now()))
        except asyncio.QueueFull:
            self.metrics.events.labels(outcome="dropped").inc()

    async def run(self) -> None:
        """Write queued events (``writers`` at a time) and due series updates, until cancelled."""
        async with asyncio.TaskGroup() as group:
            for _ in range(self.writers):
                group.create_task(self._write_queued())
            group.create_task(self._write_series())

    async def _write_queued(self) -> None:
        while True:
            await self._record(await self._queue.get())
            checkpoint()

    async def _write_series(self) -> None:
        while True:
            await self.clock.sleep(min(1.0, self.series_interval_s))
            await self._flush_series(force=False)
            checkpoint()

    async def flush(self) -> None:
        """Write everything queued and every unwritten series count now."""
        while not self._queue.empty():
            await self._record(self._queue.get_nowait())
        await self._flush_series(force=True)

    def _take_token(self) -> bool:
        now = self.clock.monotonic()
        self._tokens = min(
            float(self.burst), self._tokens + (now - self._refilled) * self.rate_per_s
        )
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    async def _record(self, pending: _Pending) -> None:
        key = pending.key
        series = self._series.get(key)
        if series is not None and pending.at - series.last <= self.series_window_s:
            series.count += 1
            series.last = pending.at
            self._series.move_to_end(key)
            self._dirty.add(key)
            return
        if not self._take_token():
            self.metrics.events.labels(outcome="dropped").inc()
            return
        _, event_type, reason, action, note = key
        namespace = pending.regarding["namespace"]
        name = f"{pending.regarding['name']}.{time.time_ns():x}"[-253:].lstrip(".-")
        # Registered before the write, so repeats meanwhile count into this event's series.
        series = _Series(
            name=name,
            namespace=namespace,
            count=1,
            last=pending.at,
            written_count=1,
            written_at=self.clock.monotonic(),
        )
        self._series[key] = series
        while len(self._series) > self.tracked:
            evicted, _ = self._series.popitem(last=False)
            self._dirty.discard(evicted)
        body = describe.event_body(
            name=name,
            regarding=pending.regarding,
            event_type=event_type,
            reason=reason,
            action=action,
            note=note,
            instance=self.instance,
            now=names.time_value(pending.at),
        )
        try:
            answer = await self.gateway.create_event(namespace, body)
        except ApiUnavailableError as error:
            answer = None
            log.info("event not written", extra={"reason": reason, "error": str(error)})
        if answer is None or not answer.ok:
            if answer is not None:
                log.warning(
                    "event refused",
                    extra={"reason": reason, "code": answer.code, "detail": answer.message},
                )
            self.metrics.events.labels(outcome="failed").inc()
            if self._series.get(key) is series:
                del self._series[key]
                self._dirty.discard(key)
            return
        series.created = True
        self.metrics.events.labels(outcome="created").inc()

    async def _flush_series(self, *, force: bool) -> None:
        now = self.clock.monotonic()
        for key in list(self._dirty):
            series = self._series.get(key)
            if series is None or series.count == series.written_count:
                self._dirty.discard(key)
                continue
            if not series.created or (
                not force and now - series.written_at < self.series_interval_s
            ):
                continue
            count = series.count
            patch = describe.series_patch(count=count, last=names.time_value(series.last))
            try:
                answer = await self.gateway.patch_event(series.namespace, series.name, patch)
            except ApiUnavailableError:
                self.metrics.events.labels(outcome="failed").inc()
                continue
            if answer.code == 404:  # the Event expired meanwhile: the next repeat starts anew
                self._series.pop(key, None)
                self._dirty.discard(key)
                continue
            series.written_count, series.written_at = count, now
            if series.count == count:
                self._dirty.discard(key)
            self.metrics.events.labels(outcome="series" if answer.ok else "failed").inc()
