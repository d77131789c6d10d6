"""Core publish/subscribe/request, JetStream publish and durable pull consumers over NATS (a
layer of :class:`~shared.runtime.nats.NatsBus`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import api as js_api

from shared.runtime.bus import (
    BusUnavailableError,
    Delivery,
    Handler,
    NoResponderError,
    PullConsumer,
    Subscription,
)
from shared.runtime.nats.connection import log
from shared.runtime.nats.store import _DISCONNECTED, _MISSING, NatsStore, unavailable

GATHER_S: Final = 0.05
"""How long a pull of several messages waits for them (``_NatsPullConsumer._pull``)."""

# Errors that only mean the subscription or connection is already gone.
_GONE = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.BadSubscriptionError,
)


def _delivery(msg: NatsMsg, *, jetstream: bool) -> Delivery:
    headers = dict(msg.headers or {})
    if not jetstream:
        return Delivery(subject=msg.subject, data=msg.data, headers=headers, reply=msg.reply or "")

    async def nak(delay: float | None = None) -> None:
        await msg.nak(delay=delay)

    metadata = msg.metadata
    return Delivery(
        subject=msg.subject,
        data=msg.data,
        headers=headers,
        num_delivered=metadata.num_delivered or 1,
        ack=msg.ack,
        nak=nak,
        term=msg.term,
        in_progress=msg.in_progress,
        sequence=int(metadata.sequence.stream or 0) if metadata.sequence else 0,
    )


class _NatsSubscription:
    def __init__(self, sub: NatsSubscription) -> None:
        self._sub = sub

    async def unsubscribe(self) -> None:
        with contextlib.suppress(nats.errors.ConnectionClosedError):
            await self._sub.unsubscribe()


class _NatsPullConsumer:
    """A durable pull consumer, attached again when the server no longer has it (or its
    stream): the placers' and the binder's work must go on after NATS lost its store.

    The subscription is replaced only once its successor is attached. Attaching again fails
    while a cluster elects the consumer's leader (the server answers the pull with "no
    responders" meanwhile); a subscription dropped before that left every later pull request
    with a reply subject nobody listened on, which the server discards, so the consumer never
    delivered again: a placer took no pod after one of three servers was killed.
    """

    def __init__(
        self, sub: Any, attach: Callable[[], Awaitable[Any]], restore: Callable[[], Awaitable[None]]
    ) -> None:
        self._sub = sub
        self._attach = attach
        self._restore = restore

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        try:
            msgs = await self._pull(batch, timeout)
        except TimeoutError:  # nats-py's TimeoutError, and at times a bare asyncio one: no message
            return []
        except _DISCONNECTED:
            raise BusUnavailableError("not connected to NATS; nothing was fetched") from None
        except (*_MISSING, nats.js.errors.NotFoundError):
            await self._restore()
            attached = await self._attach()  # may fail: the current subscription stays
            with contextlib.suppress(*_GONE):
                await self._sub.unsubscribe()
            self._sub = attached
            log.warning("durable consumer attached again (it was gone from the server)")
            return []
        return [_delivery(m, jetstream=True) for m in msgs]

    async def _pull(self, batch: int, timeout: float) -> list[NatsMsg]:
        """What is there, up to ``batch``; else the next message, as soon as it comes.

        A pull of several messages that finds none waits, and nats-py then holds what comes
        until the batch is full, the pull expires or the server says nothing more is there,
        which it may say only when the next message comes: with a steady stream of pods spread
        over three placers, a tenth of the pods waited 15-20 ms for the one after them and
        the last ones of a stream up to the whole second of the pull. So a batch is waited for
        only :data:`GATHER_S`, and the longer wait is a pull of one, which nats-py hands over
        the moment it comes."""
        if batch == 1 or timeout <= GATHER_S:
            return list(await self._sub.fetch(batch, timeout=timeout))
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(TimeoutError):
            return list(await self._sub.fetch(batch, timeout=GATHER_S))
        left = timeout - (loop.time() - started)
        if left <= 0:
            return []
        return list(await self._sub.fetch(1, timeout=left))

    async def close(self) -> None:
        # Unsubscribing before drain avoids nats-py's DrainTimeoutError on open pull subscriptions.
        with contextlib.suppress(*_GONE):
            await self._sub.unsubscribe()


class NatsMessaging(NatsStore):
    """The Bus's messaging: core subjects and the JetStream work streams."""

    def __init__(
        self, client: NatsClient, *, request_timeout: float = 5.0, replicas: int = 1
    ) -> None:
        super().__init__(client, request_timeout=request_timeout, replicas=replicas)
        self._consumers: list[_NatsPullConsumer] = []

    async def publish(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> None:
        if not self._nc.is_connected:
            raise BusUnavailableError("not connected to NATS; nothing was sent")
        try:
            await self._nc.publish(subject, data, headers=dict(headers) if headers else None)
        except _DISCONNECTED:
            raise BusUnavailableError("not connected to NATS; nothing was sent") from None

    async def subscribe(self, subject: str, handler: Handler, *, queue: str = "") -> Subscription:
        async def callback(msg: NatsMsg) -> None:
            await handler(_delivery(msg, jetstream=False))

        return _NatsSubscription(await self._nc.subscribe(subject, queue=queue, cb=callback))

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        if not self._nc.is_connected:
            raise BusUnavailableError("not connected to NATS; nothing was sent")
        try:
            answer = await self._nc.request(subject, data, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise NoResponderError(f"nobody answers on {subject}") from None
        except nats.errors.TimeoutError:
            raise TimeoutError(f"no answer on {subject} within {timeout:g} s") from None
        except _DISCONNECTED:
            raise BusUnavailableError("not connected to NATS; nothing was sent") from None
        return bytes(answer.data)

    async def js_publish(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        all_headers = dict(headers or {})
        if msg_id:
            all_headers["Nats-Msg-Id"] = msg_id
        ack = await self._write(
            lambda: self._js.publish(subject, data, headers=all_headers or None)
        )
        return int(ack.seq)

    async def pull_consumer(
        self,
        *,
        stream: str,
        durable: str,
        subject: str,
        ack_wait: float = 30.0,
        max_deliver: int = -1,
        max_ack_pending: int | None = None,
    ) -> PullConsumer:

        async def attach() -> Any:
            return await self._js.pull_subscribe(
                subject,
                durable=durable,
                stream=stream,
                config=js_api.ConsumerConfig(
                    ack_policy=js_api.AckPolicy.EXPLICIT,
                    ack_wait=ack_wait,
                    max_deliver=max_deliver,
                    max_ack_pending=max_ack_pending,
                ),
            )

        async def restore() -> None:
            await self.restore_topology(reason=f"consumer {durable} was gone")

        with unavailable(f"consumer {durable} cannot be attached now"):
            try:
                sub = await attach()
            except nats.js.errors.NotFoundError:
                await restore()
                sub = await attach()
        consumer = _NatsPullConsumer(sub, attach, restore)
        self._consumers.append(consumer)
        return consumer
