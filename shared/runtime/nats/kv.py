"""KV reads, writes, compare-and-set and watches over NATS (a layer of
:class:`~shared.runtime.nats.NatsBus`).

A watch is an ordered consumer over the bucket's stream that the server pushes each change to as
it is written; a batched watch (``kv_watch(..., batch_s=...)``) asks a pull consumer over the same
stream for what changed, every ``batch_s`` once it has caught up (both in ``watchers.py``)."""

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

from shared.runtime.bus import BusUnavailableError, KvEntry, KvWrite
from shared.runtime.nats.store import _DISCONNECTED, WRONG_LAST_SEQUENCE, NatsStore, unavailable
from shared.runtime.nats.watchers import (
    WATCH_BATCH,
    WATCH_SILENT_HEARTBEATS,
    BatchedWatch,
    PushedWatch,
    stream_sequence,
)
from shared.runtime.tasks import checkpointer


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

    async def kv_send(
        self,
        bucket: str,
        key: str,
        value: bytes,
        *,
        revision: int,
        create: bool = False,
        guard: str = "",
    ) -> bool:
        """A core publish to the key's subject carrying the expected last sequence and no reply
        subject: JetStream checks the expectation as for any write and, with nobody to answer,
        answers nobody."""
        await self._checked_bucket(bucket)
        last = self._sequence(revision) if revision else 0
        if last is None:  # read from a store that was lost: that entry has moved on for good
            if guard or not create:
                return False
            last = 0  # the deletion went with its store
        if not self.connected:
            raise BusUnavailableError("not connected to NATS; nothing was sent")
        try:
            await self._nc.publish(
                f"$KV.{bucket}.{key}", value, headers=_expectation(bucket, last, guard)
            )
        except _DISCONNECTED:
            raise BusUnavailableError("not connected to NATS; nothing was sent") from None
        return True

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
            if error.get("err_code") != WRONG_LAST_SEQUENCE:
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
            if error.err_code == WRONG_LAST_SEQUENCE:
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
            if error.err_code in (WRONG_LAST_SEQUENCE, 10164):  # the key moved on
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
        messages (:class:`BatchedWatch`) instead of having each pushed the moment it is written; a
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
        subscription: BatchedWatch | PushedWatch
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
                subscription = await BatchedWatch.start(
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
                subscription = await PushedWatch.start(
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
