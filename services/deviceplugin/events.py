"""Publishing the :class:`AllocationEvent` of each claim, beside the kubelet's answer.

The record in the KV bucket is the source of truth, so the kubelet never waits for the event, and
a publish that fails never fails an Allocate already committed: each event goes to
``tessera.allocations.<node>`` from its own task, retried until JetStream acknowledges it, and a
stopping plugin waits for those still going (:meth:`AllocationEvents.flush`).
"""

from __future__ import annotations

import asyncio
import logging

from services.deviceplugin import allocate
from services.deviceplugin.metrics import PluginMetrics
from shared import codec, subjects
from shared.clock import Clock
from shared.messages.allocations import AllocationEvent
from shared.runtime.bus import Bus

log = logging.getLogger(__name__)


class AllocationEvents:
    """The allocation events of this node still being published."""

    def __init__(self, *, node: str, bus: Bus, clock: Clock, metrics: PluginMetrics) -> None:
        self._node = node
        self._bus = bus
        self._clock = clock
        self._metrics = metrics
        self._publishing: set[asyncio.Task[None]] = set()

    def publish(self, event: AllocationEvent) -> None:
        """Publish ``event`` beside the answer: the record is already committed, so the kubelet
        need not wait for JetStream's acknowledgement; failures are retried until it comes."""
        task = asyncio.create_task(self._publish_until_done(event))
        self._publishing.add(task)
        self._metrics.events_unpublished.set(len(self._publishing))
        task.add_done_callback(self._published)

    def _published(self, task: asyncio.Task[None]) -> None:
        self._publishing.discard(task)
        self._metrics.events_unpublished.set(len(self._publishing))

    async def _publish_until_done(self, event: AllocationEvent) -> None:
        delay = 0.5
        while True:
            try:
                await self._bus.js_publish(
                    subjects.allocations(self._node),
                    codec.encode(event),
                    msg_id=allocate.allocation_message_id(event),
                )
                return
            except Exception as error:  # keep trying: the binder waits for this event
                log.warning(
                    "allocation event not published yet; retrying",
                    extra={
                        "pod_uid": event.pod_uid,
                        "error": f"{type(error).__name__}: {error}",
                        "retry_s": delay,
                    },
                )
            await self._clock.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` for events still being published; how many remain."""
        pending = set(self._publishing)
        if pending:
            _, still = await asyncio.wait(pending, timeout=timeout)
            pending = set(still)
            for task in pending:
                task.cancel()
            if pending:
                log.error("allocation events lost at shutdown", extra={"events": len(pending)})
        return len(pending)
