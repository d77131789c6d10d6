"""Following a KV bucket or a work queue forever: the one watch loop every service's mirror
runs (:func:`follow`), and the one pull loop every durable consumer runs (:func:`deliveries`).

A watch ends when the server drops it or the connection is lost, and fails when NATS is away or
its store is being checked after a reconnect (a bucket recreated, ``shared.runtime.nats``). Either
way the mirror must go on: a loop that let the error through stopped its service (a device plugin
died on one ``nats: timeout`` in a start-up storm; a binder on a NATS server killed). So:
each watch gives its initial values, then ``on_loaded`` with the keys they listed (a key the
mirror holds and they do not was deleted while no watch ran), then every change; a watch that
ends is started again after a pause, one that fails after a back-off doubling while it keeps
failing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Final

from shared.clock import Clock
from shared.runtime.bus import Bus, Delivery, KvEntry
from shared.runtime.tasks import checkpoint

log = logging.getLogger(__name__)

RETRY_S: Final = 0.5
MAX_RETRY_S: Final = 10.0
FETCH_BATCH: Final = 64


async def _nothing(_: set[str]) -> None:
    return None


async def follow(
    bus: Bus,
    bucket: str,
    *,
    on_entry: Callable[[KvEntry], Awaitable[None]],
    on_loaded: Callable[[set[str]], Awaitable[None]] = _nothing,
    clock: Clock,
    keys: str = ">",
    what: str = "",
    batch_s: float = 0.0,
) -> None:
    """Apply every value of ``bucket`` (its ``keys``) to ``on_entry``, forever (see the module
    docstring); ``on_loaded`` runs once each watch's initial values are all in. ``batch_s``: as
    :meth:`Bus.kv_watch`."""
    name = what or bucket
    delay = RETRY_S
    while True:
        checkpoint()  # a cancel lost in library code must not start the watch again
        watch = bus.kv_watch(bucket, keys, batch_s=batch_s)
        listed: set[str] | None = set()
        try:
            async for entry in watch:
                if entry is None:
                    if listed is not None:
                        await on_loaded(listed)
                        listed = None
                        delay = RETRY_S
                    continue
                if listed is not None:
                    listed.add(entry.key)
                await on_entry(entry)
            log.warning(f"{name} watch ended; watching again")
        except Exception as error:  # NATS away, the store being checked: the mirror stays
            log.warning(
                f"{name} watch failed; watching again",
                extra={"bucket": bucket, "error": f"{type(error).__name__}: {error}"},
            )
            delay = min(delay * 2, MAX_RETRY_S)
        finally:
            with contextlib.suppress(Exception):
                await watch.aclose()
        await clock.sleep(delay)


async def _any_batch() -> int:
    return FETCH_BATCH


async def deliveries(
    bus: Bus,
    *,
    clock: Clock,
    stream: str,
    durable: str,
    subject: str,
    ack_wait: float,
    max_ack_pending: int | None = None,
    room: Callable[[], Awaitable[int]] = _any_batch,
) -> AsyncGenerator[Delivery, None]:
    """What the durable consumer ``durable`` delivers, forever: the one pull loop every
    service's work queue runs.

    The consumer is attached again and again until the server takes it (a cluster electing its
    leaders times the request out: a placer once died there), and a fetch that fails is tried
    again after a back-off; nothing is lost meanwhile, the messages stay on the server. ``room``
    is awaited before each fetch and says how many messages to take (it may wait for room).
    """
    delay = RETRY_S
    while True:
        try:
            consumer = await bus.pull_consumer(
                stream=stream,
                durable=durable,
                subject=subject,
                ack_wait=ack_wait,
                max_ack_pending=max_ack_pending,
            )
            break
        except Exception as error:  # NATS away or electing: try again shortly
            log.warning(
                "cannot attach the consumer yet",
                extra={"consumer": durable, "error": f"{type(error).__name__}: {error}"},
            )
            await clock.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_S)
    delay = RETRY_S
    try:
        while True:
            batch = await room()
            try:
                fetched = await consumer.fetch(batch, 1.0)
                delay = RETRY_S
            except Exception as error:  # NATS down or slow: the messages stay on the server
                log.warning(
                    "cannot fetch; retrying",
                    extra={"consumer": durable, "error": f"{type(error).__name__}: {error}"},
                )
                await clock.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_S)
                continue
            for delivery in fetched:
                yield delivery
    finally:
        await consumer.close()
