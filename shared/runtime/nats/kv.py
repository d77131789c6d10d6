"""KV reads, writes, compare-and-set and watches over NATS (a layer of
:class:`~shared.runtime.nats.NatsBus`).

A watch is an ordered consumer over the bucket's stream that the server pushes each change to as
it is written (:class:`_Pushed`); a batched watch (``kv_watch(..., batch_s=...)``) asks a pull
consumer over the same stream for what changed, every ``batch_s`` once it has caught up
(:class:`_Batches`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg as NatsMsg
from nats.js import api as js_api

from shared.runtime.bus import BusUnavailableError, KvEntry, KvWrite
from shared.runtime.nats.store import NatsStore, unavailable
from shared.runtime.tasks import checkpointer

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


def _expectation(bucket: str, last: int, guard: str) -> dict[str, str]:
    """The headers making a write land only where the server's last sequence is ``last``: of
    its key's subject, or (``guard``, a key filter) of every subject the guard matches."""
    headers = {"Nats-Expected-Last-Subject-Sequence": str(last)}
    if guard:
        headers["Nats-Expected-Last-Subject-Sequence-Subject"] = f"$KV.{bucket}.{guard}"
    return headers


class NatsKv(NatsStore):
    """The Bus's KV operations over the buckets of the store."""

    async def kv_get(self, bucket: str, key: str) -> KvEntry | None:
        kv = await self._checked_bucket(bucket)
        try:
            # A read that goes unanswered (a cluster electing) is NATS unavailable, not a crash:
            # nats-py's timeout once stopped a placer's pool lease keeper.
            with unavailable(f"bucket {bucket} cannot be read now"):
                entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:  # includes KeyDeletedError
            return None
        return KvEntry(
            key=key, value=entry.value or b"", revision=self._revision(int(entry.revision or 0))
        )

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        kv = await self._checked_bucket(bucket)
        return self._revision(int(await self._write(lambda: kv.put(key, value))))

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        kv = await self._checked_bucket(bucket)
        try:
            return self._revision(int(await self._write(lambda: kv.create(key, value))))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def kv_update(self, bucket: str, key: str, value: bytes, *, revision: int) -> int | None:
        kv = await self._checked_bucket(bucket)
        last = self._sequence(revision)
        if last is None:  # read from a store that was lost: that entry has moved on for good
            return None
        try:
            return self._revision(int(await self._write(lambda: kv.update(key, value, last=last))))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None

    async def kv_write_all(self, bucket: str, writes: Sequence[KvWrite]) -> tuple[int, ...] | None:
        """One JetStream atomic batch (nats-server 2.12+, the bucket's stream ``allow_atomic``):
        every message but the last sent without an answer, the last one committing the batch
        and answered for all. Each carries the revision it expects as the last sequence of its
        subject, 0 for a create. A create whose key holds a delete marker expects that marker
        instead, as nats-py's ``KeyValue.create`` does: a conflict is looked into once.

        A guarded write (``KvWrite.guard``) expects its revision as the last sequence of the
        guard's subjects instead (``Nats-Expected-Last-Subject-Sequence-Subject``).

        A single write goes as a plain compare-and-set or create: on a single server a batch is
        staged on disk and synced before it is committed, which costs more than its one write.
        """
        if len(writes) == 1:
            write = writes[0]
            if write.guard:
                guarded = await self._guarded_put(bucket, write)
                return None if guarded is None else (guarded,)
            if write.revision:
                landed = await self.kv_update(
                    bucket, write.key, write.value, revision=write.revision
                )
            else:
                landed = await self.kv_create(bucket, write.key, write.value)
            return None if landed is None else (landed,)
        await self._checked_bucket(bucket)
        expected: list[int] = []
        for write in writes:
            last = self._sequence(write.revision) if write.revision else 0
            if last is None:  # read from a store that was lost: that entry has moved on for good
                return None
            expected.append(last)
        for _ in range(2):
            answer = await self._write(lambda: self._send_batch(bucket, writes, expected))
            error = answer.get("error")
            if error is None:
                first = int(answer["seq"]) - len(writes) + 1
                return tuple(self._revision(first + n) for n in range(len(writes)))
            if error.get("code") == 503:  # no stream leader now (a cluster electing)
                raise BusUnavailableError(f"bucket {bucket}: {error.get('description')}")
            if error.get("err_code") != 10071:  # not "wrong last sequence"
                raise nats.js.errors.APIError(
                    code=error.get("code"),
                    err_code=error.get("err_code"),
                    description=error.get("description"),
                )
            if not await self._expect_delete_markers(bucket, writes, expected):
                return None
        return None

    async def _guarded_put(self, bucket: str, write: KvWrite) -> int | None:
        """One guarded write (see :meth:`kv_write_all`); None when the guard's keys moved on."""
        await self._checked_bucket(bucket)
        last = self._sequence(write.revision) if write.revision else 0
        if last is None:  # read from a store that was lost: those keys have moved on for good
            return None
        try:
            ack = await self._write(
                lambda: self._js.publish(
                    f"$KV.{bucket}.{write.key}",
                    write.value,
                    headers=_expectation(bucket, last, write.guard),
                )
            )
        except nats.js.errors.APIError as error:
            if error.err_code == 10071:  # wrong last sequence
                return None
            raise
        return self._revision(int(ack.seq))

    async def _send_batch(
        self, bucket: str, writes: Sequence[KvWrite], expected: Sequence[int]
    ) -> dict[str, Any]:
        batch = secrets.token_hex(8)
        answer = None
        for number, (write, last) in enumerate(zip(writes, expected, strict=True), start=1):
            headers = {
                "Nats-Batch-Id": batch,
                "Nats-Batch-Sequence": str(number),
                **_expectation(bucket, last, write.guard),
            }
            subject = f"$KV.{bucket}.{write.key}"
            if number < len(writes):
                await self._nc.publish(subject, write.value, headers=headers)
                continue
            headers["Nats-Batch-Commit"] = "1"
            try:
                answer = await self._nc.request(
                    subject, write.value, timeout=self._js._timeout, headers=headers
                )
            except nats.errors.NoRespondersError:
                raise nats.js.errors.NoStreamResponseError from None
        assert answer is not None
        parsed: dict[str, Any] = json.loads(answer.data)
        return parsed

    async def _expect_delete_markers(
        self, bucket: str, writes: Sequence[KvWrite], expected: list[int]
    ) -> bool:
        """Point each create whose key holds a delete marker at that marker; False when none
        does (the batch lost to another writer)."""
        kv = await self._checked_bucket(bucket)
        moved = False
        for number, write in enumerate(writes):
            if write.revision or write.guard:
                continue
            try:
                with unavailable(f"bucket {bucket} cannot be read now"):
                    await kv.get(write.key)
            except nats.js.errors.KeyNotFoundError as missing:  # a deleted one carries its marker
                marker = missing.entry.revision if missing.entry is not None else 0
                if marker and marker != expected[number]:
                    expected[number] = int(marker)
                    moved = True
        return moved

    async def kv_delete(self, bucket: str, key: str) -> None:
        kv = await self._checked_bucket(bucket)
        await self._write(lambda: kv.delete(key))

    async def kv_delete_if(
        self, bucket: str, key: str, *, revision: int, guard: str = ""
    ) -> int | None:
        await self._checked_bucket(bucket)
        last = self._sequence(revision)
        if last is None:
            return None
        # What nats-py's KeyValue.delete sends, keeping the answer (the marker's revision).
        headers = {"KV-Operation": "DEL"}
        if last or guard:
            headers.update(_expectation(bucket, last, guard))
        try:
            ack = await self._write(
                lambda: self._js.publish(f"$KV.{bucket}.{key}", b"", headers=headers)
            )
        except nats.js.errors.APIError as error:
            if error.err_code in (10071, 10164):  # wrong last sequence: the key moved on
                return None
            raise
        return self._revision(int(ack.seq))

    async def kv_keys(self, bucket: str) -> list[str]:
        # Not nats-py's KeyValue.keys(): it ends at its watcher's "initial values done" marker,
        # which can come before the values (see _watch); this one comes after them.
        listed = await self._latest(bucket, ">", headers_only=True)
        return [entry.key for entry in listed if not entry.deleted]

    async def kv_list(self, bucket: str, keys: str) -> list[KvEntry]:
        return await self._latest(bucket, keys, headers_only=False)

    async def _latest(self, bucket: str, keys: str, *, headers_only: bool) -> list[KvEntry]:
        """The latest entry of each key matching ``keys``, delete markers included: a watch's
        initial values (``headers_only``: without the values)."""
        latest: dict[str, KvEntry] = {}
        async with contextlib.aclosing(self._watch(bucket, keys, headers_only=headers_only)) as w:
            async for entry in w:
                if entry is None:
                    return list(latest.values())
                latest[entry.key] = entry
        # Ended before every key was listed: the connection was lost, or the store replaced.
        raise BusUnavailableError(
            f"bucket {bucket} could not be listed whole (the connection or the store changed "
            "meanwhile); nothing was read"
        )

    def kv_watch(
        self, bucket: str, keys: str = ">", *, batch_s: float = 0.0
    ) -> AsyncGenerator[KvEntry | None, None]:
        """Initial values, ``None``, then changes; ends (once reconnected) when the connection
        is lost. A watch does not survive a server restart: nats-py's consumer behind it may
        stay silent for many seconds after the reconnect, so callers watch again and take the
        fresh initial values (which also show what was deleted meanwhile). ``batch_s``: see
        :class:`~shared.runtime.bus.Bus`; a batched watch ends when an ask goes unanswered.

        A watch reads one store: it ends when the bus takes a new store's epoch, so what it
        gave is of the store :attr:`store_epoch` names while it runs. One that fails because its
        consumer vanished while the connection stayed up makes the bus look for a replaced
        store (its epoch) before the caller watches again."""
        return self._watch(bucket, keys, headers_only=False, batch_s=batch_s)

    async def _watch(
        self, bucket: str, keys: str, *, headers_only: bool, batch_s: float = 0.0
    ) -> AsyncGenerator[KvEntry | None, None]:
        """The watch behind :meth:`kv_watch` and :meth:`kv_keys`: an ordered consumer over the
        bucket's stream, last value per key first.

        Where the initial values end is known, not guessed. nats-py's own watcher marks the end
        when the server reports nothing pending and no message has been read yet, or when a
        message reports nothing pending after it; the first can hold while the server has
        already sent every value (still unread in the socket), the second while a concurrent
        write makes the count move (nats.py issues 842 and 995): seen here as an empty key list
        in about 6 % of listings of a bucket of 5 keys under writes. Counting what the consumer
        holds is no better: a key written again while the values are replayed leaves its old
        place for a later one. So the keys are asked for first (the stream's subjects, deleted
        keys included, since a deletion is a message too), and the initial values are done once
        each of them has been delivered, whatever its place.

        A batched watch (``batch_s`` above 0) asks a pull consumer with the same start for the
        messages (:class:`_Batches`) instead of having each pushed the moment it is written; a
        key written more often between two asks than the bucket keeps history shows only its
        latest values, as it would to a watch started later.
        """
        subject = f"$KV.{bucket}.{keys}"
        stream = f"KV_{bucket}"
        await self._checked_bucket(bucket)
        renewed = self._renewed  # resolved when the bus takes another store's epoch
        # Bounded, as nats-py's own watcher: a slow reader holds the messages back in nats-py.
        # A batched watch bounds it itself (it asks for no more while a batch waits unread).
        arrived: asyncio.Queue[NatsMsg | BaseException | None] = asyncio.Queue(
            maxsize=0 if batch_s > 0 else WATCH_BATCH
        )
        subscription: _Batches | _Pushed
        with unavailable(f"bucket {bucket} cannot be watched now"):
            try:
                existing = await self._js.stream_info(stream, subjects_filter=subject)
            except nats.js.errors.NotFoundError:  # gone since the bucket was looked up
                await self.restore_topology(reason=f"watching {bucket}")
                await self._bucket(bucket)
                existing = await self._js.stream_info(stream, subjects_filter=subject)
            # The server keeps a consumer nobody listens to this long; each is deleted on
            # close as well, since a stream holds at most 1,000 of them (with nats-py's 5
            # minutes, the 1,001st listing within 5 minutes failed).
            if batch_s > 0:
                subscription = await _Batches.start(
                    self._nc,
                    self._js,
                    stream,
                    subject,
                    arrived,
                    batch_s=batch_s,
                    wait_s=WATCH_SILENT_HEARTBEATS * self.watch_heartbeat_s,
                    headers_only=headers_only,
                )
            else:
                subscription = await _Pushed.start(
                    self._nc,
                    self._js,
                    stream,
                    subject,
                    arrived,
                    heartbeat_s=self.watch_heartbeat_s,
                    headers_only=headers_only,
                )
        awaited = set(existing.state.subjects or ())
        prefix = len(f"$KV.{bucket}.")
        lost = self._lost

        # The connection's loss, or a new store's epoch, wakes a reader waiting on an empty
        # queue; one that has messages at hand reads them first and sees the loss once the queue
        # is empty. One future per watch, not one per message: a watch is the hottest loop of
        # every service.
        def wake(_: object) -> None:
            if arrived.empty():
                arrived.put_nowait(None)

        lost.add_done_callback(wake)
        renewed.add_done_callback(wake)
        consumer = ""
        stop_requested = checkpointer()
        try:
            with unavailable(f"bucket {bucket} cannot be watched now"):
                consumer = (await subscription.consumer_info()).name
            if not awaited and not renewed.done():
                yield None
            while True:
                stop_requested()  # nats-py's requests above may have swallowed a stop's cancel
                if renewed.done():  # another store's epoch taken: its values are not ours
                    return
                if arrived.empty() and lost.done():
                    await self._reconnected()
                    return
                msg = await subscription.next()
                if msg is None:
                    continue  # woken by the loss: the checks above end the watch
                if isinstance(msg, BaseException):  # an ask unanswered, a message missed
                    if lost.done():  # because the connection was lost: end as above
                        await self._reconnected()
                        return
                    await self._look_for_lost_store(f"the watch of {bucket} lost its consumer")
                    raise BusUnavailableError(
                        f"bucket {bucket} stopped answering its watch ({msg!r})"
                    ) from None
                if renewed.done():
                    return
                headers = msg.headers or {}
                yield KvEntry(
                    key=msg.subject[prefix:],
                    value=msg.data or b"",
                    revision=self._revision(stream_sequence(msg.reply)),
                    deleted=headers.get("KV-Operation") in ("DEL", "PURGE")
                    or "Nats-Marker-Reason" in headers,
                )
                if awaited:
                    awaited.discard(msg.subject)
                    if not awaited:
                        yield None
        finally:
            lost.remove_done_callback(wake)
            renewed.remove_done_callback(wake)
            # Bounded: a stop that cannot reach the server must not hold up a shutdown.
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                async with asyncio.timeout(2.0):
                    await subscription.unsubscribe()
                if consumer:
                    async with asyncio.timeout(2.0):
                        await self._js.delete_consumer(stream, consumer)


class _Pushed:
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
    ) -> _Pushed:
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


class _Batches:
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
    ) -> _Batches:
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
