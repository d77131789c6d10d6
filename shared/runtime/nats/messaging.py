"""Core publish/subscribe/request, JetStream publish and durable pull consumers over NATS (a
layer of :class:`~shared.runtime.nats.NatsBus`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence

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
    OutcomeUnknownError,
    Publication,
    PullConsumer,
    Subscription,
)
from shared.runtime.nats.connection import log
from shared.runtime.nats.store import (
    _DISCONNECTED,
    _MISSING,
    WRONG_LAST_SEQUENCE,
    NatsStore,
    unavailable,
)

PROBE_ANSWER_S = 1.0
"""How long the server's answer to a pull that does not wait (``no_wait``) is waited for."""
UNTAKEN_S = 2.0
"""Messages a pull brought that no fetch took this long are given back (nak): the consumer's
reader stopped taking (a placer replica left without a node pool, or deciding a backlog), and
another reader can take them now rather than after the ack wait."""
_PULL_ENDED = ("Leadership Change", "Server Shutdown")
"""A pull's 409 that only ends it: asked again, the next leader or server answers."""
_Attach = Callable[[], Awaitable[None]]
"""Attach a durable consumer again (create it when the server has none)."""

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
    """A durable pull consumer, read through pulls that outlive one fetch.

    A fetch hands over each message as it comes: the first one ends it. How it asks:

    - after a quiet spell, first for what is there, up to the batch, without waiting;
    - then, if nothing was there, for the next message, one only;
    - while messages come, for a batch that stays for the next ones: it lasts the fetch's
      timeout, and what it brings after a fetch ended waits for the next fetch, which asks the
      server again only once that pull was answered in full, expired or was refused.

    So a steady stream of pods costs one pull a batch, not one or two a pod (the pull, and the
    server's "nothing there" to it), and a fetch never takes more than its batch. The server
    takes turns among the pulls waiting on one durable: when a burst comes after a quiet spell,
    each waiting replica takes one pod and the first to ask again takes all there is, so a small
    burst is decided in order by one replica rather than dealt out pod by pod to replicas that
    decide at once on views without each other's choices (two replicas dealt a node's four
    slices and a two-GPU claim packed the slices onto two GPUs, leaving the claim no pair).

    Replies come to this consumer's own inbox, a subscription kept for its lifetime, each pull's
    statuses to a subject of its own, so a late status of an expired pull ends nothing (messages
    come with their own subject and count against the last pull: one that came late only makes
    the next pull come sooner).

    The consumer is attached again when the server says it is gone (with its stream, when NATS
    lost its store): the placers' and the binder's work must go on. While a cluster elects the
    consumer's leader, attaching again fails; the inbox stays, so the consumer delivers again
    as soon as it is back (a subscription dropped before its successor was attached once left
    every later pull unheard, and a placer took no pod after one of three servers was killed).
    """

    def __init__(self, nc: NatsClient, inbox: str, next_subject: str, attach: _Attach) -> None:
        self._nc = nc
        self._inbox = inbox
        self._next_subject = next_subject
        self._attach = attach
        self._sub: NatsSubscription | None = None
        self._arrived: deque[NatsMsg] = deque()
        self._changed = asyncio.Event()
        self._pulls = 0
        """How many pulls were sent: the last one's replies come to ``<inbox>.<pulls>``."""
        self._left = 0
        """How many messages the last pull may still bring (0: it is over)."""
        self._until = 0.0
        """When the last pull expires (the loop's clock): over then, answered or not (a pull
        is lost with the connection)."""
        self._missing = False
        """The server said the consumer is gone: attach it again before the next pull."""
        self._brought = False
        """Whether the last pull brought a message (messages are coming)."""
        self._refused = ""
        """Why the server refused the last pull (the fetch that waits on it raises it)."""
        self._fetching = False
        self._fetched_at = 0.0
        """When the last fetch ended (the loop's clock)."""
        self._untaken: asyncio.TimerHandle | None = None
        self._giving_back: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(
        cls, nc: NatsClient, *, stream: str, durable: str, attach: _Attach
    ) -> _NatsPullConsumer:
        inbox = nc.new_inbox()
        consumer = cls(nc, inbox, f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}", attach)
        consumer._sub = await nc.subscribe(f"{inbox}.*", cb=consumer._take)
        return consumer

    async def _take(self, msg: NatsMsg) -> None:
        status = (msg.headers or {}).get(js_api.Header.STATUS)
        if status is None:  # a message comes with its own subject: counted to the last pull
            self._arrived.append(msg)
            self._left -= 1
            self._brought = True
            if not self._fetching and self._untaken is None:
                self._untaken = asyncio.get_running_loop().call_later(UNTAKEN_S, self._give_back)
        elif status == "100":  # a heartbeat (none is asked for)
            return
        elif msg.subject == f"{self._inbox}.{self._pulls}":
            # 404/408: nothing more; 409: refused, deleted, or moved on; 503: nobody there
            self._left = 0
            description = (msg.headers or {}).get(js_api.Header.DESCRIPTION, "")
            if status == "503" or "deleted" in description.lower():
                self._missing = True
            elif status not in ("404", "408") and description not in _PULL_ENDED:
                self._refused = f"status {status} {description}".strip()
        self._changed.set()

    def _give_back(self) -> None:
        """Give back what no fetch took for :data:`UNTAKEN_S` (checked again if one did)."""
        self._untaken = None
        if self._fetching or not self._arrived:
            return
        loop = asyncio.get_running_loop()
        idle = loop.time() - self._fetched_at
        if idle < UNTAKEN_S:
            self._untaken = loop.call_later(UNTAKEN_S - idle, self._give_back)
            return
        untaken = list(self._arrived)
        self._arrived.clear()
        task = loop.create_task(self._nak(untaken))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    @staticmethod
    async def _nak(messages: list[NatsMsg]) -> None:
        for msg in messages:
            with contextlib.suppress(*_GONE, *_DISCONNECTED):
                await msg.nak()

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        self._fetching = True
        try:
            return await self._fetch(batch, timeout)
        finally:
            self._fetching = False
            self._fetched_at = asyncio.get_running_loop().time()

    async def _fetch(self, batch: int, timeout: float) -> list[Delivery]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        probe = True
        while not self._arrived:
            now = loop.time()
            if now >= deadline:
                return []
            if self._missing:
                await self._attach()  # may fail (an election): the next fetch tries again
                self._missing = False
                log.warning("durable consumer attached again (it was gone from the server)")
            if self._left <= 0 or now >= self._until:
                if self._brought:  # messages are coming: a pull that stays for the next ones
                    await self._pull(batch, deadline - now)
                elif probe:  # after a quiet spell: whatever is there, up to the batch
                    probe = False
                    await self._pull(batch, PROBE_ANSWER_S, no_wait=True)
                else:
                    await self._pull(1, deadline - now)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(min(deadline, self._until)):
                    await self._changed.wait()
            if self._refused:  # asked again at once, it would be refused again: back off
                refused, self._refused = self._refused, ""
                raise BusUnavailableError(f"the pull was refused ({refused}); nothing fetched")
        taken = [self._arrived.popleft() for _ in range(min(batch, len(self._arrived)))]
        return [_delivery(m, jetstream=True) for m in taken]

    async def _pull(self, batch: int, expires_s: float, *, no_wait: bool = False) -> None:
        if not self._nc.is_connected:
            raise BusUnavailableError("not connected to NATS; nothing was fetched")
        self._pulls += 1
        self._left = batch
        self._brought = False
        self._until = asyncio.get_running_loop().time() + expires_s
        ask: dict[str, object] = {"batch": batch}
        if no_wait:  # with an expiry too, the server would wait for it, no_wait or not
            ask["no_wait"] = True
        else:
            ask["expires"] = int(expires_s * 1e9)
        try:
            await self._nc.publish(
                self._next_subject, json.dumps(ask).encode(), reply=f"{self._inbox}.{self._pulls}"
            )
        except _DISCONNECTED:
            self._left = 0
            raise BusUnavailableError("not connected to NATS; nothing was fetched") from None

    async def close(self) -> None:
        """Stop pulling; what a pull brought and no fetch took goes back at once (nak)."""
        if self._sub is not None:
            with contextlib.suppress(*_GONE):
                await self._sub.unsubscribe()
        if self._untaken is not None:
            self._untaken.cancel()
        untaken = list(self._arrived)
        self._arrived.clear()
        await self._nak(untaken)


def _publication_headers(publication: Publication, stream: str) -> dict[str, str]:
    return {"Nats-Msg-Id": publication.msg_id, "Nats-Expected-Stream": stream}


class NatsMessaging(NatsStore):
    """The Bus's messaging: core subjects and the JetStream work streams."""

    def __init__(
        self, client: NatsClient, *, request_timeout: float = 5.0, replicas: int = 1
    ) -> None:
        super().__init__(client, request_timeout=request_timeout, replicas=replicas)
        self._consumers: list[_NatsPullConsumer] = []
        self._stored_last: dict[tuple[str, str], int] = {}
        """(Stream, store epoch) -> the sequence this client's last answered ``js_publish_all``
        message was stored at (absent: unknown, or a call is under way)."""

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

    async def js_publish_all(self, stream: str, publications: Sequence[Publication]) -> None:
        """Every message but the last goes as a core publish with no reply subject; the last
        expects the stream's last sequence to be the one this client's last answered message
        was stored at plus those before it (``Nats-Expected-Last-Sequence``). The server stores
        it only when each of them was stored and nothing else came between, and its answer then
        answers for them all. Where the expectation fails (another publisher came between, one
        was a duplicate or lost, or no sequence is known yet), each is published again,
        answered; those already stored are then duplicates."""
        stored = (stream, self.store_epoch)  # a new store's stream counts from 1 again
        last = self._stored_last.pop(stored, None)
        if last is not None and len(publications) > 1:
            *leading, trailing = publications
            if not self._nc.is_connected:
                raise BusUnavailableError("not connected to NATS; nothing was sent")
            for sent, publication in enumerate(leading):
                try:
                    await self._nc.publish(
                        publication.subject,
                        publication.data,
                        headers=_publication_headers(publication, stream),
                    )
                except _DISCONNECTED:
                    if not sent:
                        raise BusUnavailableError(
                            "not connected to NATS; nothing was sent"
                        ) from None
                    raise OutcomeUnknownError(
                        f"the NATS connection dropped after {sent} of {len(publications)} "
                        "messages; publish them again"
                    ) from None
            headers = _publication_headers(trailing, stream)
            headers["Nats-Expected-Last-Sequence"] = str(last + len(leading))
            try:
                ack = await self._write(
                    lambda: self._js.publish(trailing.subject, trailing.data, headers=headers)
                )
            except nats.js.errors.APIError as error:
                if error.err_code != WRONG_LAST_SEQUENCE:
                    raise
            else:
                self._stored_last[stored] = int(ack.seq)
                return
        for publication in publications:
            headers = _publication_headers(publication, stream)
            ack = await self._write(
                functools.partial(
                    self._js.publish, publication.subject, publication.data, headers=headers
                )
            )
            if ack.duplicate:  # stored earlier: its sequence need not be the stream's last
                self._stored_last.pop(stored, None)
            else:
                self._stored_last[stored] = int(ack.seq)

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

        config = js_api.ConsumerConfig(
            name=durable,
            durable_name=durable,
            filter_subject=subject,
            ack_policy=js_api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
        )

        async def create() -> None:
            try:
                await self._js.consumer_info(stream, durable)
            except nats.js.errors.NotFoundError:
                await self._js.add_consumer(stream, config=config)

        async def attach() -> None:
            """The consumer again, after the server said it is gone (with its stream, when
            NATS lost its store)."""
            with unavailable(f"consumer {durable} cannot be attached now"):
                try:
                    await create()
                except (*_MISSING, nats.js.errors.NotFoundError):
                    await self.restore_topology(reason=f"consumer {durable} was gone")
                    await create()

        await attach()
        consumer = await _NatsPullConsumer.start(
            self._nc, stream=stream, durable=durable, attach=attach
        )
        self._consumers.append(consumer)
        return consumer
