"""The two kinds of KV watch subscription behind ``NatsKv.kv_watch``: :class:`PushedWatch`, an
ordered consumer the server pushes each change to as it is written, and :class:`BatchedWatch`,
a pull consumer asked for what changed every ``batch_s``. Both hand the watch the messages
through one bounded queue, and a message missed or a consumer gone as an exception in it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from nats.aio.msg import Msg as NatsMsg
from nats.js import api as js_api

WATCH_INACTIVE_S = 5.0
"""How long the server keeps a KV watch's consumer once nobody listens (see ``NatsBus._watch``)."""

WATCH_BATCH = 256
"""How many changes a batched watch asks for at once (and how many its reader may hold back)."""

WATCH_ANSWER_S = 5.0
"""How long a batched watch waits for the answer to an ask, beyond the time the ask itself may
wait for a change: none means its consumer, or the server holding it, is gone, and the watch
ends (the caller watches again)."""


WATCH_SILENT_HEARTBEATS = 3
"""A pushed watch that hears nothing, not even the server's idle heartbeat, for this many
heartbeat intervals has lost its consumer (deleted, or lost with a server the connection did not
go through): it fails, and its caller watches again. A quiet batched watch's ask waits this many
heartbeat intervals for a change."""


def sequences(reply: str) -> tuple[int, int]:
    """The stream and consumer sequences of a JetStream message from its reply subject (what
    nats-py's ``Msg.metadata`` parses, without building the rest): ``$JS.ACK.<stream>.
    <consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>``, or the newer form with
    a domain and an account hash after ``ACK`` and a random token at the end."""
    tokens = reply.split(".")
    first = 5 if len(tokens) == 9 else 7
    return int(tokens[first]), int(tokens[first + 1])


def stream_sequence(reply: str) -> int:
    """The stream sequence of a JetStream message from its reply subject (:func:`sequences`)."""
    return sequences(reply)[0]


class PushedWatch:
    """The messages of a pushed watch: an ordered consumer the server pushes each change to.

    Not nats-py's ordered consumer: it checks whether a flow-control answer is due every 0.25 s
    for as long as the watch lives, four wake-ups a second per watch whatever is written, which
    was about 40 % of the simulated nodes' idle CPU (three watches per node; ``benchmarks/
    RESULTS.md``). Here the answer goes out when the message that asked for it is taken, after
    every message before it was handed on: the server still never runs more than its window ahead
    of the reader, as the watch's queue is bounded and a full one holds up this subscription.

    What nats-py's ordered consumer does on trouble, this one leaves to its caller, who watches
    again (fresh initial values): a message missed (a consumer sequence skipped, or an idle
    heartbeat that names a later one) or a status other than a heartbeat ends the watch with an
    error, and so does a consumer that falls silent (:meth:`_check`: one timer per silence
    interval, not one per message)."""

    def __init__(
        self,
        nc: Any,
        arrived: asyncio.Queue[NatsMsg | BaseException | None],
        *,
        heartbeat_s: float,
    ) -> None:
        self._nc = nc
        self._arrived = arrived
        self._loop = asyncio.get_running_loop()
        self._silence_s = WATCH_SILENT_HEARTBEATS * heartbeat_s
        self._heard = self._loop.time()
        """When the last message or heartbeat arrived (the loop's clock)."""
        self._watchdog = self._loop.call_later(self._silence_s, self._check)
        self._delivered = 0
        """The consumer sequence of the last message handed on."""
        self._failed = False
        self._inbox: Any = None
        self._consumer: Any = None

    @classmethod
    async def start(
        cls,
        nc: Any,
        js: Any,
        stream: str,
        subject: str,
        arrived: asyncio.Queue[NatsMsg | BaseException | None],
        *,
        heartbeat_s: float,
        headers_only: bool,
    ) -> PushedWatch:
        pushed = cls(nc, arrived, heartbeat_s=heartbeat_s)
        # Listening before the consumer exists: the server pushes as soon as it does.
        inbox = nc.new_inbox()
        pushed._inbox = await nc.subscribe(inbox, cb=pushed._take)
        try:
            pushed._consumer = await js.add_consumer(
                stream,
                config=js_api.ConsumerConfig(
                    deliver_subject=inbox,
                    ack_policy=js_api.AckPolicy.NONE,
                    deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT,
                    filter_subject=subject,
                    headers_only=headers_only or None,
                    inactive_threshold=WATCH_INACTIVE_S,
                    idle_heartbeat=heartbeat_s,
                    flow_control=True,
                    max_deliver=1,
                    num_replicas=1,
                    mem_storage=True,
                ),
            )
        except BaseException:
            await pushed.unsubscribe()
            raise
        return pushed

    async def consumer_info(self) -> Any:
        return self._consumer

    async def unsubscribe(self) -> None:
        self._watchdog.cancel()
        await self._inbox.unsubscribe()

    async def next(self) -> NatsMsg | BaseException | None:
        return await self._arrived.get()

    def _check(self) -> None:
        """Fail the watch once nothing arrived for the silence interval, else look again when
        it would be over."""
        silent = self._loop.time() - self._heard
        if self._arrived.full():  # messages wait for the reader, not the other way round
            self._watchdog = self._loop.call_later(self._silence_s, self._check)
        elif silent < self._silence_s:
            self._watchdog = self._loop.call_later(self._silence_s - silent, self._check)
        elif not self._failed:
            self._failed = True
            self._arrived.put_nowait(RuntimeError(f"no message or heartbeat for {silent:.1f} s"))

    async def _take(self, msg: NatsMsg) -> None:
        self._heard = self._loop.time()
        if self._failed:
            return  # the watch ends with the error already queued
        headers = msg.headers or {}
        status = headers.get(js_api.Header.STATUS)
        if status is None:
            delivered = sequences(msg.reply)[1]
            if delivered != self._delivered + 1:
                await self._fail(f"message {self._delivered + 1} of the consumer was missed")
                return
            self._delivered = delivered
            await self._arrived.put(msg)
        elif status != "100":
            description = headers.get(js_api.Header.DESCRIPTION, "")
            await self._fail(f"status {status} {description}".strip())
        elif msg.reply:  # a flow-control request: every message before it was handed on
            await self._nc.publish(msg.reply)
        else:  # an idle heartbeat
            stalled = headers.get(js_api.Header.CONSUMER_STALLED)
            if stalled:  # the server waits for a flow-control answer it missed
                await self._nc.publish(stalled)
            last = headers.get(js_api.Header.LAST_CONSUMER)
            if last is not None and int(last) != self._delivered:
                await self._fail(f"the consumer sent up to {last}, {self._delivered} arrived")

    async def _fail(self, why: str) -> None:
        self._failed = True
        await self._arrived.put(RuntimeError(why))


class BatchedWatch:
    """The messages of a batched watch: its consumer is pulled every ``batch_s`` while changes
    keep coming, so a reader that may lag that long wakes once per batch rather than once per
    change (a placer replica woke for each of the other replicas' writes, about 150 us of CPU
    each on a machine with more processes than cores).

    Each ask is a no-wait pull of up to :data:`WATCH_BATCH` messages, answered by the messages
    there are and then a status (404: nothing more; 408: the ask expired): nats-py's own fetch
    cannot ask without also waiting for the next message. An ask that finds nothing is followed
    by one that waits for the next change, up to ``wait_s`` (408 when none came): a quiet watch
    asks once per ``wait_s``, not once per ``batch_s`` (two placer replicas asked 40 times a
    second while nothing happened), and the first change after a quiet spell comes at once.
    Its consumer is one replica in memory, like a pushed watch's: on a JetStream cluster it is
    not replicated like its stream (a watch lost with its server is watched again). The
    subscription's interface is the one the watch uses of nats-py's: ``consumer_info`` and
    ``unsubscribe``."""

    def __init__(
        self,
        nc: Any,
        consumer: Any,
        next_subject: str,
        arrived: asyncio.Queue[NatsMsg | BaseException | None],
    ) -> None:
        self._nc = nc
        self._inbox: Any = None
        """The subscription the answers come to (made in :meth:`start`, it delivers to
        :meth:`_take`)."""
        self._consumer = consumer
        self._next_subject = next_subject
        self._arrived = arrived
        self._answered = asyncio.Event()
        self._asked = 0
        """How many messages the ask in flight asked for (a full answer ends without a status)."""
        self._got = 0
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        nc: Any,
        js: Any,
        stream: str,
        subject: str,
        arrived: asyncio.Queue[NatsMsg | BaseException | None],
        *,
        batch_s: float,
        wait_s: float,
        headers_only: bool,
    ) -> BatchedWatch:
        consumer = await js.add_consumer(
            stream,
            config=js_api.ConsumerConfig(
                ack_policy=js_api.AckPolicy.NONE,
                deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT,
                filter_subject=subject,
                headers_only=headers_only or None,
                inactive_threshold=WATCH_INACTIVE_S,
                max_waiting=1,
                num_replicas=1,
                mem_storage=True,
            ),
        )
        batches = cls(nc, consumer, f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer.name}", arrived)
        batches._inbox = await nc.subscribe(nc.new_inbox(), cb=batches._take)
        batches._task = asyncio.create_task(batches._ask(batch_s, wait_s))
        return batches

    async def consumer_info(self) -> Any:
        return self._consumer

    async def next(self) -> NatsMsg | BaseException | None:
        return await self._arrived.get()

    async def unsubscribe(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._inbox.unsubscribe()

    async def _take(self, msg: NatsMsg) -> None:
        status = (msg.headers or {}).get(js_api.Header.STATUS)
        if status is None:
            self._got += 1
            self._arrived.put_nowait(msg)
            if self._got == self._asked:  # a full answer ends without a status
                self._answered.set()
        elif status in ("404", "408"):
            self._answered.set()
        else:  # the consumer is gone, or the server refuses: end the watch
            description = (msg.headers or {}).get(js_api.Header.DESCRIPTION, "")
            self._arrived.put_nowait(RuntimeError(f"status {status} {description}".strip()))

    async def _ask(self, batch_s: float, wait_s: float) -> None:
        try:
            while True:
                if self._arrived.qsize() < WATCH_BATCH:  # else the reader is behind: later
                    got = await self._pull(WATCH_BATCH, wait_s=0.0)
                    if got == WATCH_BATCH:
                        continue  # more may be there: ask again at once
                    if got == 0:  # quiet: wait for the next change, asking again on expiry
                        while not await self._pull(1, wait_s=wait_s):
                            pass
                await asyncio.sleep(batch_s)  # let the next changes gather
        except Exception as error:  # unanswered, or not connected: the watch ends (a cancel,
            # a BaseException, passes)
            self._arrived.put_nowait(error)

    async def _pull(self, batch: int, *, wait_s: float) -> int:
        """Ask for up to ``batch`` messages, without waiting (``wait_s`` 0) or waiting up to
        ``wait_s`` for them; how many came. No answer in time raises TimeoutError."""
        ask: dict[str, object] = {"batch": batch}
        if wait_s > 0:
            ask["expires"] = int(wait_s * 1e9)
        else:
            ask["no_wait"] = True
        self._answered.clear()
        self._asked = batch
        self._got = 0
        await self._nc.publish(
            self._next_subject, json.dumps(ask).encode(), reply=self._inbox.subject
        )
        async with asyncio.timeout(wait_s + WATCH_ANSWER_S):
            await self._answered.wait()
        return self._got
