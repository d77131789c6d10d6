"""The store behind the bus, replaced: what a client reads is always of the store whose epoch it
reports (a real nats-server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from shared import subjects
from shared.runtime.bus import BusUnavailableError, KvEntry
from shared.runtime.nats import NatsBus
from tests.harness.nats import NatsServer, replace_store

BUCKET = subjects.KV_LEDGER


async def _initial(watch: AsyncGenerator[KvEntry | None, None]) -> list[KvEntry]:
    """A watch's initial values (up to its ``None``)."""
    values: list[KvEntry] = []
    while (entry := await asyncio.wait_for(anext(watch), timeout=10)) is not None:
        values.append(entry)
    return values


async def test_a_watch_reads_one_store_and_the_bus_says_which(nats_server: NatsServer) -> None:
    """The store replaced behind a live connection. A watch started on the new store before this
    client took the new epoch (the forced order of a lost store that a placer once took for the
    old one, keeping the old store's bookings) ends once the client takes it, and every watch
    after that reads the new store under the new epoch, with revisions above any the lost store
    was reported at."""
    watcher = await NatsBus.connect(nats_server.url, name="watcher", watch_heartbeat_s=0.2)
    other: NatsBus | None = None
    old_revision = await watcher.kv_put(BUCKET, "book.n1.a", b"a")
    old = watcher.store_epoch
    first = watcher.kv_watch(BUCKET)
    try:
        assert [e.key for e in await _initial(first)] == ["book.n1.a"]
        other = await replace_store(nats_server)
        assert other.store_epoch != old
        await other.kv_put(BUCKET, "book.n1.b", b"b")

        # Started now, it reads the new store while this client still holds the old epoch.
        early = watcher.kv_watch(BUCKET)
        assert [e.key for e in await _initial(early)] == ["book.n1.b"]

        # The first watch lost its consumer with the stream; the client learns of the new store
        # then (or, at the latest, when a write or a consumer finds a stream gone).
        with pytest.raises(BusUnavailableError):
            await asyncio.wait_for(anext(first), timeout=10)
        await watcher.restore_topology(reason="a write found no stream (test)")
        assert watcher.store_epoch == other.store_epoch

        # The early watch's values were the new store's taken under the old epoch: it ends.
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(early), timeout=10)

        again = watcher.kv_watch(BUCKET)
        (entry,) = await _initial(again)
        assert entry.key == "book.n1.b"
        assert entry.revision > old_revision
        assert watcher.store_epoch == other.store_epoch
        await again.aclose()
        await early.aclose()
    finally:
        await first.aclose()
        if other is not None:
            await other.drain()
        await watcher.drain()


async def test_a_watch_that_loses_its_store_tells_the_client_of_the_new_one(
    nats_server: NatsServer,
) -> None:
    """The store replaced behind a live connection: the watch that lost its consumer with the
    stream makes the client look at the store's epoch before it watches again, so the next
    watch's values come under the new epoch (nothing else told it: no write and no consumer of
    its found a stream gone)."""
    watcher = await NatsBus.connect(nats_server.url, name="watcher", watch_heartbeat_s=0.2)
    watch = watcher.kv_watch(BUCKET)
    other: NatsBus | None = None
    try:
        assert await _initial(watch) == []
        other = await replace_store(nats_server)
        with pytest.raises(BusUnavailableError):
            await asyncio.wait_for(anext(watch), timeout=10)
        again = watcher.kv_watch(BUCKET)
        assert await _initial(again) == []
        assert watcher.store_epoch == other.store_epoch
        await again.aclose()
    finally:
        await watch.aclose()
        if other is not None:
            await other.drain()
        await watcher.drain()
