"""The one handled pull-consumer loop: a durable JetStream consumer whose messages are handled
concurrently, each acked when its handler is done (the binder's decisions, rejections and
allocations run through it). Fetching, and surviving NATS errors with back-off, is
:func:`shared.runtime.follow.deliveries`; this adds handling, ack and nak.

Each message gets its own task (up to ``max_in_flight`` at once) and is decoded at the edge (a
malformed one is dead-lettered and terminated). While its handler works, the message is kept
alive (``in_progress`` every third of the ack wait), so a handler held at the ambiguity gate is
not redelivered meanwhile; a service killed mid-way leaves its messages to be redelivered one ack
wait later. The handler's outcome decides the rest: returned -> ack; raised one of the
``expected`` errors (the API or NATS away: logged as a warning) or any other failure (logged as
an error) -> nak, delivered again after a delay that doubles per delivery; raised
:class:`AlreadyHandlingError` -> nothing (a duplicate delivery of a message already being
handled, whose first delivery will ack it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from shared.clock import Clock
from shared.runtime.bus import Bus, Delivery
from shared.runtime.edge import Edge
from shared.runtime.follow import FETCH_BATCH, deliveries
from shared.runtime.tasks import checkpoint

log = logging.getLogger(__name__)

ACK_WAIT_S: Final = 15.0
"""JetStream redelivers a message not acked (nor kept alive) this long after delivery: what a
killed leader's (or worker's) in-flight messages wait before the new leader gets them."""
RETRY_S: Final = 1.0
"""Delay before a message the API or NATS could not serve is delivered again (doubling with each
delivery, up to ``RETRY_MAX_S``)."""
RETRY_MAX_S: Final = 30.0
T = TypeVar("T")


def retry_delay(deliveries: int) -> float:
    """How long to wait before delivering again a message delivered ``deliveries`` times."""
    return min(RETRY_MAX_S, RETRY_S * float(2 ** max(0, min(deliveries - 1, 8))))


EXPECTED: Final[tuple[type[BaseException], ...]] = (OSError, TimeoutError)
"""Failures a handler meets when something it needs is away (logged without a traceback)."""


class AlreadyHandlingError(Exception):
    """Raised by a handler for a message it is already handling (a duplicate delivery)."""


async def consume(
    *,
    bus: Bus,
    edge: Edge,
    clock: Clock,
    max_in_flight: int,
    durable: str,
    stream: str,
    subject: str,
    message_type: type[T],
    family: str,
    handler: Callable[[T], Awaitable[None]],
    expected: tuple[type[BaseException], ...] = EXPECTED,
) -> None:
    """Fetch from the durable consumer and handle each message in its own task, up to
    ``max_in_flight`` at once, until cancelled (see the module docstring)."""
    in_flight = 0
    freed = asyncio.Event()

    def finished(_: asyncio.Task[None]) -> None:
        nonlocal in_flight
        in_flight -= 1
        freed.set()

    async def room() -> int:
        checkpoint()
        while in_flight >= max_in_flight:
            freed.clear()
            await freed.wait()
        return min(FETCH_BATCH, max_in_flight - in_flight)

    messages = deliveries(
        bus,
        clock=clock,
        stream=stream,
        durable=durable,
        subject=subject,
        ack_wait=ACK_WAIT_S,
        room=room,
    )
    async with contextlib.aclosing(messages), asyncio.TaskGroup() as group:
        async for delivery in messages:
            in_flight += 1
            task = group.create_task(
                _handle(
                    delivery,
                    message_type,
                    family,
                    handler,
                    edge=edge,
                    clock=clock,
                    expected=expected,
                )
            )
            task.add_done_callback(finished)


async def _handle(
    delivery: Delivery,
    message_type: type[T],
    family: str,
    handler: Callable[[T], Awaitable[None]],
    *,
    edge: Edge,
    clock: Clock,
    expected: tuple[type[BaseException], ...],
) -> None:
    try:
        message = await edge.accept(delivery, message_type, family=family)
    except Exception as error:  # the dead letter could not go out: leave it for redelivery
        log.warning("message not decoded yet", extra={"family": family, "error": repr(error)})
        return
    if message is None:
        return
    keepalive = asyncio.create_task(_keep_alive(delivery, clock))
    try:
        await handler(message)
    except AlreadyHandlingError:
        return  # the delivery already being handled will ack the message
    except Exception as error:
        unexpected = not isinstance(error, expected)
        log.log(
            logging.ERROR if unexpected else logging.WARNING,
            "message not handled yet; it will be delivered again",
            extra={"family": family, "error": repr(error)},
            exc_info=error if unexpected else None,
        )
        with contextlib.suppress(Exception):
            await delivery.nak(retry_delay(delivery.num_delivered))
        return
    finally:
        keepalive.cancel()
    with contextlib.suppress(Exception):
        await delivery.ack()


async def _keep_alive(delivery: Delivery, clock: Clock) -> None:
    while True:
        await clock.sleep(ACK_WAIT_S / 3)
        checkpoint()
        with contextlib.suppress(Exception):
            await delivery.in_progress()
