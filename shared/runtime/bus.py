"""The Bus port and its NATS adapter (the only module that imports ``nats``).

The Bus is deliberately small: core publish/subscribe, JetStream publish and durable pull
consumers for work that must not be lost, and KV get/put/create/compare-and-set/watch for latest
state. Compare-and-set conflicts are data (``None``), not exceptions: losing a race is normal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg as NatsMsg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import api as js_api
from nats.js.kv import KeyValue

from shared import subjects

log = logging.getLogger(__name__)

# Errors that only mean the subscription or connection is already gone.
_GONE = (nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError)


async def _noop() -> None:
    return None


async def _noop_delay(delay: float | None = None) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Delivery:
    """A received message. ``ack``/``nak``/``term`` act on JetStream messages only."""

    subject: str
    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    num_delivered: int = 1
    ack: Callable[[], Awaitable[None]] = _noop
    nak: Callable[[float | None], Awaitable[None]] = _noop_delay
    term: Callable[[], Awaitable[None]] = _noop
    in_progress: Callable[[], Awaitable[None]] = _noop
    """Tell JetStream the message is still being worked on: its ``ack_wait`` starts again."""
    sequence: int = 0
    """The message's stream sequence (JetStream messages only; 0 otherwise)."""


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One KV value at one revision; ``deleted`` marks a delete or purge marker."""

    key: str
    value: bytes
    revision: int
    deleted: bool = False


Handler = Callable[[Delivery], Awaitable[None]]


class Subscription(Protocol):
    """A live subscription."""

    async def unsubscribe(self) -> None:
        """Stop receiving."""
        ...


class PullConsumer(Protocol):
    """A durable JetStream consumer: what is fetched and not acked comes back after ``ack_wait``."""

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        """Up to ``batch`` messages; an empty list when none arrived within ``timeout``."""
        ...

    async def close(self) -> None:
        """Stop fetching (the durable consumer and its position stay on the server)."""
        ...


class Bus(Protocol):
    """Messaging and latest-state storage, as the services need them."""

    @property
    def connected(self) -> bool:
        """True while the connection to the server is up."""
        ...

    async def publish(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> None:
        """Fire-and-forget publish (telemetry, dead letters)."""
        ...

    async def subscribe(self, subject: str, handler: Handler, *, queue: str = "") -> Subscription:
        """Call ``handler`` for each message on ``subject`` (a queue group shares the load)."""
        ...

    async def js_publish(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        """Publish durably; returns the stream sequence. ``msg_id`` de-duplicates retries."""
        ...

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
        """Create or attach to the durable consumer ``durable`` on ``stream``.

        ``max_ack_pending`` caps the messages delivered and not yet acked (None: the server's
        default, 1,000); settings apply when the consumer is created.
        """
        ...

    async def kv_get(self, bucket: str, key: str) -> KvEntry | None:
        """The latest value, or None when the key is absent or deleted."""
        ...

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        """Write unconditionally; returns the new revision."""
        ...

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        """Write only if the key does not exist; None when it does."""
        ...

    async def kv_update(self, bucket: str, key: str, value: bytes, *, revision: int) -> int | None:
        """Compare-and-set: write only if the key is still at ``revision``; None on conflict."""
        ...

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Delete the key (a delete marker stays in history)."""
        ...

    async def kv_delete_if(self, bucket: str, key: str, *, revision: int) -> bool:
        """Delete the key only if it is still at ``revision``; False when it moved on."""
        ...

    async def kv_keys(self, bucket: str) -> list[str]:
        """Every live key of the bucket."""
        ...

    def kv_watch(self, bucket: str, keys: str = ">") -> AsyncIterator[KvEntry | None]:
        """Current values of matching keys, then one ``None`` marking "initial values done",
        then every later change, until the iterator is closed."""
        ...

    async def drain(self) -> None:
        """Finish in-flight work and close the connection."""
        ...


# --- NATS adapter ----------------------------------------------------------------------------


def _delivery(msg: NatsMsg, *, jetstream: bool) -> Delivery:
    headers = dict(msg.headers or {})
    if not jetstream:
        return Delivery(subject=msg.subject, data=msg.data, headers=headers)

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
    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        try:
            msgs = await self._sub.fetch(batch, timeout=timeout)
        except nats.errors.TimeoutError:
            return []
        return [_delivery(m, jetstream=True) for m in msgs]

    async def close(self) -> None:
        # Unsubscribing before drain avoids nats-py's DrainTimeoutError on open pull subscriptions.
        with contextlib.suppress(*_GONE):
            await self._sub.unsubscribe()


class NatsBus:
    """The Bus over a real NATS server with JetStream."""

    def __init__(self, client: NatsClient) -> None:
        self._nc = client
        self._js = client.jetstream()
        self._kv: dict[str, KeyValue] = {}
        self._consumers: list[_NatsPullConsumer] = []

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        connect_timeout: float = 2.0,
        reconnect_wait: float = 1.0,
    ) -> NatsBus:
        """Connect (reconnecting forever after the first success) and create streams and buckets.

        Raises:
            OSError, nats.errors.NoServersError: the first connection failed; callers retry.
        """

        async def on_error(error: Exception) -> None:
            log.warning("nats error", extra={"error": str(error)})

        async def on_disconnect() -> None:
            log.warning("nats disconnected")

        async def on_reconnect() -> None:
            log.info("nats reconnected")

        client = await nats.connect(
            servers=[url],
            name=name,
            connect_timeout=connect_timeout,
            reconnect_time_wait=reconnect_wait,
            max_reconnect_attempts=-1,
            allow_reconnect=True,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
        )
        bus = cls(client)
        await bus.ensure_topology()
        return bus

    async def ensure_topology(self) -> None:
        """Create every stream and KV bucket Tessera uses; existing ones are left as they are."""
        for name, stream_subjects in subjects.STREAMS.items():
            try:
                info = await self._js.stream_info(name)
            except nats.js.errors.NotFoundError:
                await self._js.add_stream(name=name, subjects=list(stream_subjects))
                continue
            if set(info.config.subjects or ()) != set(stream_subjects):
                config = info.config
                config.subjects = list(stream_subjects)
                await self._js.update_stream(config)
        for bucket, history in subjects.KV_BUCKETS.items():
            await self._bucket(bucket, history=history)

    async def _bucket(self, bucket: str, *, history: int = 1) -> KeyValue:
        kv = self._kv.get(bucket)
        if kv is not None:
            return kv
        try:
            kv = await self._js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            kv = await self._js.create_key_value(
                config=js_api.KeyValueConfig(bucket=bucket, history=history)
            )
        self._kv[bucket] = kv
        return kv

    @property
    def connected(self) -> bool:
        return bool(self._nc.is_connected)

    async def publish(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> None:
        await self._nc.publish(subject, data, headers=dict(headers) if headers else None)

    async def subscribe(self, subject: str, handler: Handler, *, queue: str = "") -> Subscription:
        async def callback(msg: NatsMsg) -> None:
            await handler(_delivery(msg, jetstream=False))

        return _NatsSubscription(await self._nc.subscribe(subject, queue=queue, cb=callback))

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
        ack = await self._js.publish(subject, data, headers=all_headers or None)
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
        sub = await self._js.pull_subscribe(
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
        consumer = _NatsPullConsumer(sub)
        self._consumers.append(consumer)
        return consumer

    async def kv_get(self, bucket: str, key: str) -> KvEntry | None:
        kv = await self._bucket(bucket)
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:  # includes KeyDeletedError
            return None
        return KvEntry(key=key, value=entry.value or b"", revision=int(entry.revision or 0))

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        kv = await self._bucket(bucket)
        return int(await kv.put(key, value))

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        kv = await self._bucket(bucket)
        try:
            return int(await kv.create(key, value))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def kv_update(self, bucket: str, key: str, value: bytes, *, revision: int) -> int | None:
        kv = await self._bucket(bucket)
        try:
            return int(await kv.update(key, value, last=revision))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def kv_delete(self, bucket: str, key: str) -> None:
        kv = await self._bucket(bucket)
        await kv.delete(key)

    async def kv_delete_if(self, bucket: str, key: str, *, revision: int) -> bool:
        kv = await self._bucket(bucket)
        try:
            await kv.delete(key, last=revision)
        except nats.js.errors.APIError as error:
            if error.err_code in (10071, 10164):  # wrong last sequence: the key moved on
                return False
            raise
        return True

    async def kv_keys(self, bucket: str) -> list[str]:
        kv = await self._bucket(bucket)
        try:
            return list(await kv.keys())
        except nats.js.errors.NoKeysError:
            return []

    async def kv_watch(self, bucket: str, keys: str = ">") -> AsyncIterator[KvEntry | None]:
        kv = await self._bucket(bucket)
        watcher = await kv.watch(keys)
        try:
            async for entry in watcher:
                if entry is None:
                    yield None
                    continue
                yield KvEntry(
                    key=entry.key,
                    value=entry.value or b"",
                    revision=int(entry.revision or 0),
                    deleted=entry.operation in ("DEL", "PURGE"),
                )
        finally:
            # Bounded: a stop that cannot reach the server must not hold up a shutdown.
            with contextlib.suppress(*_GONE, TimeoutError):
                await asyncio.wait_for(watcher.stop(), timeout=2.0)  # type: ignore[no-untyped-call]

    async def drain(self) -> None:
        for consumer in self._consumers:
            await consumer.close()
        if self._nc.is_closed:
            return
        try:
            await asyncio.wait_for(self._nc.drain(), timeout=5.0)
        except (TimeoutError, nats.errors.Error):
            await self._nc.close()
