"""Validate at the edge: every subscription decodes with its typed decoder.

A payload that does not decode is counted (``tessera_messages_rejected_total``), logged with the
reason, and republished to ``tessera.deadletter.<family>`` as a :class:`DeadLetter` carrying the
reason and the original bytes. The service keeps running; a JetStream message is terminated so it is
not redelivered forever, and nothing else is lost.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from shared import codec, subjects
from shared.clock import Clock
from shared.messages.deadletter import DeadLetter
from shared.runtime.bus import Bus, Delivery, Subscription
from shared.runtime.metrics import EdgeMetrics

T = TypeVar("T")

log = logging.getLogger(__name__)

REASON_HEADER = "Tessera-Deadletter-Reason"


class Edge:
    """Decodes incoming deliveries into typed messages, dead-lettering what does not decode."""

    def __init__(self, *, bus: Bus, metrics: EdgeMetrics, clock: Clock, service: str) -> None:
        self._bus = bus
        self._metrics = metrics
        self._clock = clock
        self._service = service

    async def accept(self, delivery: Delivery, message_type: type[T], *, family: str) -> T | None:
        """The decoded message, or None after the delivery was rejected and dead-lettered."""
        self._metrics.received.labels(family=family).inc()
        try:
            return codec.decode(delivery.data, message_type)
        except codec.DecodeError as error:
            await self.reject(delivery, family=family, reason=str(error), kind="decode")
            return None

    async def reject(self, delivery: Delivery, *, family: str, reason: str, kind: str) -> None:
        """Count, log and dead-letter ``delivery`` (also for faults found after decoding)."""
        self._metrics.rejected.labels(family=family, kind=kind).inc()
        log.warning(
            "rejected message",
            extra={"family": family, "subject": delivery.subject, "reason": reason},
        )
        encoding: Literal["utf-8", "base64"] = "utf-8"
        try:
            text = delivery.data.decode("utf-8")
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(delivery.data).decode("ascii"), "base64"
        letter = DeadLetter(
            family=family,
            subject=delivery.subject,
            reason=reason,
            service=self._service,
            payload=text,
            payload_encoding=encoding,
            received_at=self._clock.now(),
        )
        await self._bus.publish(
            subjects.deadletter(family),
            codec.encode(letter),
            headers={REASON_HEADER: reason[:512]},
        )
        self._metrics.deadlettered.labels(family=family).inc()
        await delivery.term()

    async def subscribe(
        self,
        subject: str,
        message_type: type[T],
        handler: Callable[[T], Awaitable[None]],
        *,
        family: str,
        queue: str = "",
    ) -> Subscription:
        """Subscribe to ``subject`` and call ``handler`` with each message that decodes."""

        async def on_delivery(delivery: Delivery) -> None:
            message = await self.accept(delivery, message_type, family=family)
            if message is not None:
                await handler(message)

        return await self._bus.subscribe(subject, on_delivery, queue=queue)
