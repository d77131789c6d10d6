"""``RecordMirror.write``: a compare-and-set the server does not answer, its outcome read from
the mirror's own watch, against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from shared import codec, subjects
from shared.clock import SystemClock
from shared.messages.assignments import AssignmentRecord
from shared.runtime.bus import OutcomeUnknownError
from shared.runtime.edge import Edge
from shared.runtime.metrics import EdgeMetrics
from shared.runtime.nats import NatsBus
from shared.runtime.records import RecordMirror
from tests.deviceplugin.builders import NODE, container, record, share
from tests.harness.nats import NatsServer, replace_store
from tests.harness.wait import eventually, running

KEY = subjects.assignment_key(NODE, "pod-1")
BOUND = record("pod-1", container("main", share(0)))


def allocated(at: float) -> bytes:
    return codec.encode(msgspec.structs.replace(BOUND, state="allocated", bound_at=at))


def mirror_of(bus: NatsBus) -> RecordMirror:
    clock = SystemClock()
    edge = Edge(bus=bus, metrics=EdgeMetrics.create(CollectorRegistry()), clock=clock, service="t")
    return RecordMirror(bus=bus, edge=edge, clock=clock, keys=subjects.assignment_keys_of(NODE))


def following(mirror: RecordMirror) -> contextlib.AbstractAsyncContextManager[None]:
    return running(mirror.run(), until=lambda: mirror.loaded, what="the records loaded")


async def gone_silent(bus: NatsBus) -> RecordMirror:
    """A mirror whose watch loaded the records and then went silent (stopped)."""
    mirror = mirror_of(bus)
    async with following(mirror):
        pass
    return mirror


async def stored(bus: NatsBus) -> tuple[AssignmentRecord, int]:
    entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, KEY)
    assert entry is not None
    return codec.decode(entry.value, AssignmentRecord), entry.revision


async def test_a_write_that_landed_is_its_revision_as_the_watch_shows_it(bus: NatsBus) -> None:
    created = await bus.kv_create(subjects.KV_ASSIGNMENTS, KEY, codec.encode(BOUND))
    assert created is not None
    mirror = mirror_of(bus)
    async with following(mirror):
        landed = await mirror.write(KEY, allocated(1.0), revision=created)
        assert landed is not None and landed > created
        value, revision = await stored(bus)
        assert (value.state, revision) == ("allocated", landed)
        view = mirror.latest(KEY)
        assert view is not None and (view.revision, view.record.state) == (landed, "allocated")


async def test_a_write_another_version_beat_is_none_and_leaves_that_version(
    bus: NatsBus,
) -> None:
    """The other writer's version reaches the server first: the first version above the one
    written over is not this write, which the server refused."""
    created = await bus.kv_create(subjects.KV_ASSIGNMENTS, KEY, codec.encode(BOUND))
    assert created is not None
    mirror = mirror_of(bus)
    async with following(mirror):
        other = await bus.kv_update(subjects.KV_ASSIGNMENTS, KEY, allocated(2.0), revision=created)
        assert other is not None
        assert await mirror.write(KEY, allocated(1.0), revision=created) is None
        await asyncio.sleep(0.2)
        assert await stored(bus) == (codec.decode(allocated(2.0), AssignmentRecord), other)


async def test_a_write_over_a_version_the_mirror_saw_replaced_is_not_sent(
    bus: NatsBus,
) -> None:
    created = await bus.kv_create(subjects.KV_ASSIGNMENTS, KEY, codec.encode(BOUND))
    assert created is not None
    mirror = mirror_of(bus)
    async with following(mirror):
        other = await bus.kv_update(subjects.KV_ASSIGNMENTS, KEY, allocated(2.0), revision=created)
        await eventually(lambda: mirror.revision(KEY) == other, what="the other version seen")
        assert await mirror.write(KEY, allocated(1.0), revision=created) is None
    assert (await stored(bus))[1] == other


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "refused"])
async def test_a_write_no_watch_showed_in_time_is_of_unknown_outcome(
    bus: NatsBus, lands: bool
) -> None:
    """With no watch running (one that went silent) nothing tells the write's outcome: the
    caller must read the key back, which shows whether it landed."""
    created = await bus.kv_create(subjects.KV_ASSIGNMENTS, KEY, codec.encode(BOUND))
    assert created is not None
    mirror = await gone_silent(bus)
    if not lands:  # a version the silent watch does not show
        assert await bus.kv_update(
            subjects.KV_ASSIGNMENTS, KEY, codec.encode(BOUND), revision=created
        )
    with pytest.raises(OutcomeUnknownError, match=f"0.3 s passed before a version of {KEY}"):
        await mirror.write(KEY, allocated(1.0), revision=created, seen_s=0.3)
    value, _ = await stored(bus)
    assert value.state == ("allocated" if lands else "bound")


async def test_a_record_created_again_after_its_deletion_went_with_a_lost_store(
    nats_server: NatsServer,
) -> None:
    """The mirror saw the key deleted in a store that was lost since: the create does not name
    that deletion (no version of the new store has its revision) and lands."""
    bus = await NatsBus.connect(nats_server.url, name="writer", watch_heartbeat_s=0.2)
    other: NatsBus | None = None
    mirror = mirror_of(bus)
    try:
        async with following(mirror):
            created = await mirror.create(KEY, codec.encode(BOUND))
            assert created is not None
            await bus.kv_delete(subjects.KV_ASSIGNMENTS, KEY)
            await eventually(lambda: mirror.revision(KEY) > created, what="the deletion seen")
            other = await replace_store(nats_server)
            await bus.restore_topology(reason="the store was replaced (test)")
            assert bus.store_epoch == other.store_epoch
            landed = await mirror.create(KEY, allocated(1.0))
            assert landed is not None
            assert (await stored(bus)) == (codec.decode(allocated(1.0), AssignmentRecord), landed)
    finally:
        if other is not None:
            await other.drain()
        await bus.drain()


async def test_a_write_whose_connection_dropped_is_of_unknown_outcome_at_once(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    """nats-py sends what it had not flushed again after a reconnect, maybe to a new store: a
    write waiting for its version when the connection drops is of unknown outcome then, not
    once the wait is over (the caller reads it back when NATS is back, as for a lost answer)."""
    created = await bus.kv_create(subjects.KV_ASSIGNMENTS, KEY, codec.encode(BOUND))
    assert created is not None
    mirror = await gone_silent(bus)  # no version of the key is ever shown
    write = asyncio.create_task(mirror.write(KEY, allocated(1.0), revision=created, seen_s=60))
    await asyncio.sleep(0.2)
    assert not write.done()
    nats_server.kill()
    try:
        with pytest.raises(OutcomeUnknownError, match="the NATS connection dropped before"):
            async with asyncio.timeout(10):
                await write
    finally:
        nats_server.start()
        await eventually(lambda: bus.connected, timeout=30, what="the reconnect")


@pytest.mark.parametrize("loaded", [True, False], ids=["asked-answered", "watch-never-loaded"])
async def test_an_answered_write_is_taken_in_without_the_watch_and_loses_to_a_later_version(
    bus: NatsBus, loaded: bool
) -> None:
    """``answered``: for a writer that found the watch behind; and every write of a mirror whose
    watch never loaded (nothing would show it). No watch follows the key here."""
    created = await bus.kv_create(subjects.KV_ASSIGNMENTS, KEY, codec.encode(BOUND))
    assert created is not None
    mirror = await gone_silent(bus) if loaded else mirror_of(bus)
    landed = await mirror.write(KEY, allocated(1.0), revision=created, answered=loaded)
    assert landed is not None and landed > created
    view = mirror.latest(KEY)
    assert view is not None and (view.revision, view.record.state) == (landed, "allocated")
    stale = mirror_of(bus)  # knows nothing of it: the server refuses the write
    assert await stale.write(KEY, allocated(2.0), revision=created, answered=True) is None
    value, revision = await stored(bus)
    assert (value.bound_at, revision) == (1.0, landed)
