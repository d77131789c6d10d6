"""Validate at the edge: every subscription decodes with its typed decoder.

A payload that does not decode is counted (``tessera_messages_rejected_total``), logged with the
reason, and republished to ``tessera.deadletter.<family>`` as a :class:`DeadLetter` carrying the
reason and the original bytes. The service keeps running; a JetStream message is terminated so it is
not redelivered forever, and nothing else is lost.

Nothing a peer writes can stop a service from here: a payload larger than
:data:`DEADLETTER_PAYLOAD_LIMIT` bytes travels truncated (``payload_truncated``, with the original
size), and a dead letter that cannot be published (NATS down, the server's payload limit) is
counted in ``tessera_deadletters_failed_total`` and logged, never raised.
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

DEADLETTER_PAYLOAD_LIMIT = 32 * 1024
"""Bytes of the original payload a dead letter carries: enough to see what was wrong, and well
under any NATS server's payload limit (1 MiB by default)."""

MAX_REASON_CHARS = 2048


def _utf8(data: bytes, *, cut: bool) -> str | None:
    """``data`` as text, or None when it is not UTF-8. A cut may have split the last character:
    up to three trailing bytes are then dropped."""
    for trim in range(4 if cut else 1):
        try:
            return data[: len(data) - trim].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


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
        """Count, log and dead-letter ``delivery`` (also for faults found after decoding).

        Never raises for the letter's sake: a failed publish is counted and logged.
        """
        self._metrics.rejected.labels(family=family, kind=kind).inc()
        reason = reason if len(reason) <= MAX_REASON_CHARS else reason[:MAX_REASON_CHARS] + "..."
        log.warning(
            "rejected message",
            extra={"family": family, "subject": delivery.subject, "reason": reason},
        )
        try:
            await self._bus.publish(
                subjects.deadletter(family),
                codec.encode(self._letter(delivery, family=family, reason=reason)),
                headers={REASON_HEADER: reason[:512]},
            )
        except Exception as error:  # NATS down, payload limit: the service goes on regardless
            self._metrics.deadletter_failures.labels(family=family).inc()
            log.error(
                "dead letter not published",
                extra={"family": family, "error": f"{type(error).__name__}: {error}"},
            )
        else:
            self._metrics.deadlettered.labels(family=family).inc()
        try:
            await delivery.term()
        except Exception as error:  # redelivery is then the server's business, not a crash
            log.warning(
                "rejected message not terminated",
                extra={"family": family, "error": f"{type(error).__name__}: {error}"},
            )

    def _letter(self, delivery: Delivery, *, family: str, reason: str) -> DeadLetter:
        data = delivery.data
        truncated = len(data) > DEADLETTER_PAYLOAD_LIMIT
        kept = data[:DEADLETTER_PAYLOAD_LIMIT]
        text = _utf8(kept, cut=truncated)
        encoding: Literal["utf-8", "base64"] = "utf-8"
        if text is None:
            text, encoding = base64.b64encode(kept).decode("ascii"), "base64"
        return DeadLetter(
            family=family,
            subject=delivery.subject,
            reason=reason,
            service=self._service,
            payload=text,
            payload_encoding=encoding,
            received_at=self._clock.now(),
            payload_truncated=truncated,
            payload_bytes=len(data),
        )

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
