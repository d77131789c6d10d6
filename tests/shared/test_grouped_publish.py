"""Durable publishes in groups answered once (``Bus.js_publish_all`` and
``shared.runtime.grouped``), against a real nats-server: what the stream holds afterwards, and
how many answers came, counted as the server sends them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator

import pytest

from shared import subjects
from shared.runtime.bus import Publication
from shared.runtime.grouped import GroupedPublisher
from shared.runtime.nats import NatsBus
from tests.harness.nats import NatsServer, replace_store

STREAM = subjects.STREAM_PODS
BUS_NAME = "tessera-test"
"""The ``bus`` fixture's client name."""


def pods(*names: str, subject: str = subjects.PODS_PENDING) -> list[Publication]:
    return [Publication(subject, name.encode(), f"id.{name}") for name in names]


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """The fixture's server, with its monitoring endpoints (what the answers are counted by)."""
    with NatsServer(monitoring=True) as server:
        yield server


def sent_to(server: NatsServer, name: str) -> int:
    """How many messages the server has sent to the client ``name`` (its /connz)."""
    with urllib.request.urlopen(f"{server.monitoring_url}/connz?limit=100", timeout=10) as page:
        connz = json.loads(page.read())
    (sent,) = [c["out_msgs"] for c in connz["connections"] if c.get("name") == name]
    return int(sent)


@contextlib.asynccontextmanager
async def answers_counted(server: NatsServer) -> AsyncIterator[list[int]]:
    """How many messages the server sent to the ``bus`` fixture's client while the block ran
    (its answers: nothing else is subscribed meanwhile), in a list of one."""
    before = await asyncio.to_thread(sent_to, server, BUS_NAME)
    counted: list[int] = []
    yield counted
    counted.append(await asyncio.to_thread(sent_to, server, BUS_NAME) - before)


async def stored(server: NatsServer) -> list[bytes]:
    """What the stream holds, in order (taken off it: a work queue), read on a connection of
    its own (the pulls' answers are not the publisher's)."""
    reader = await NatsBus.connect(server.url, name="reader")
    consumer = await reader.pull_consumer(
        stream=STREAM, durable="reader", subject=subjects.PODS_ALL
    )
    held: list[bytes] = []
    while batch := await consumer.fetch(100, timeout=0.5):
        for delivery in batch:
            held.append(delivery.data)
            await delivery.ack()
    await consumer.close()
    await reader.drain()
    return held


async def test_a_group_is_stored_in_order_for_one_answer(
    bus: NatsBus, nats_server: NatsServer
) -> None:
    async with answers_counted(nats_server) as first:
        await bus.js_publish_all(STREAM, pods("a", "b"))
    assert first == [2], "no sequence known yet: each answered"
    async with answers_counted(nats_server) as answers:
        await bus.js_publish_all(
            STREAM, pods("c", "d", "e") + pods("f", subject=subjects.PODS_DELETED)
        )
    assert answers == [1]
    assert await stored(nats_server) == [b"a", b"b", b"c", b"d", b"e", b"f"]


async def test_messages_taken_off_the_work_queue_leave_the_sequence_known(
    bus: NatsBus, nats_server: NatsServer
) -> None:
    await bus.js_publish_all(STREAM, pods("a"))
    assert await stored(nats_server) == [b"a"]
    async with answers_counted(nats_server) as answers:
        await bus.js_publish_all(STREAM, pods("b", "c"))
    assert answers == [1]
    assert await stored(nats_server) == [b"b", b"c"]


@pytest.mark.parametrize("between", ["another publisher", "a duplicate"])
async def test_a_group_whose_expectation_fails_is_published_again_each_answered(
    bus: NatsBus, nats_server: NatsServer, between: str
) -> None:
    """The stream's last sequence is not the one expected: another publisher's message came
    between, or one of the group was a duplicate and not stored again. Every message is then
    published again, answered: each is stored once, none lost."""
    await bus.js_publish_all(STREAM, pods("a"))
    group = pods("b", "c", "d")
    if between == "another publisher":
        other = await NatsBus.connect(nats_server.url, name="other")
        await other.js_publish(subjects.PODS_PENDING, b"x", msg_id="id.x")
        await other.drain()
        expected = [b"a", b"x", b"b", b"c", b"d"]
    else:
        group = pods("a") + group  # stored already: de-duplicated
        expected = [b"a", b"b", b"c", b"d"]
    async with answers_counted(nats_server) as answers:
        await bus.js_publish_all(STREAM, group)
    assert answers == [1 + len(group)], "the failed expectation's, then one each"
    assert await stored(nats_server) == expected
    async with answers_counted(nats_server) as answers:
        await bus.js_publish_all(STREAM, pods("e", "f"))
    assert answers == [1], "the sequence is known again"


async def test_publishers_of_one_moment_share_answers(
    bus: NatsBus, nats_server: NatsServer
) -> None:
    publisher = GroupedPublisher(bus=bus, stream=STREAM)
    await publisher.publish(subjects.PODS_PENDING, b"first", msg_id="id.first")
    names = [f"pod-{n}" for n in range(40)]
    async with answers_counted(nats_server) as answers:
        await asyncio.gather(
            *(publisher.publish(subjects.PODS_PENDING, n.encode(), msg_id=n) for n in names)
        )
    assert answers[0] <= 2, "the first publish's group, and the one of all who came meanwhile"
    assert await stored(nats_server) == [b"first", *(n.encode() for n in names)]


async def test_a_group_that_fails_fails_for_each_publisher_and_the_next_goes(
    bus: NatsBus, nats_server: NatsServer
) -> None:
    """A group the server refuses (here: its subjects are another stream's) raises for each
    of its publishers; what is published after goes as before."""
    wrong = GroupedPublisher(bus=bus, stream=subjects.STREAM_BINDINGS)
    outcomes = await asyncio.gather(
        *(wrong.publish(subjects.PODS_PENDING, b"x", msg_id=f"x{n}") for n in range(3)),
        return_exceptions=True,
    )
    assert all(isinstance(outcome, Exception) for outcome in outcomes), outcomes
    right = GroupedPublisher(bus=bus, stream=STREAM)
    await asyncio.gather(
        *(right.publish(subjects.PODS_PENDING, f"{n}".encode(), msg_id=f"y{n}") for n in range(3))
    )
    assert await stored(nats_server) == [b"0", b"1", b"2"]


async def test_a_publisher_that_gives_up_waiting_leaves_the_others_theirs(
    bus: NatsBus, nats_server: NatsServer
) -> None:
    publisher = GroupedPublisher(bus=bus, stream=STREAM)
    waiting = [
        asyncio.create_task(
            publisher.publish(subjects.PODS_PENDING, f"{n}".encode(), msg_id=f"{n}")
        )
        for n in range(4)
    ]
    await asyncio.sleep(0)
    waiting[1].cancel()
    done = await asyncio.gather(*waiting, return_exceptions=True)
    assert isinstance(done[1], asyncio.CancelledError)
    assert [done[n] for n in (0, 2, 3)] == [None, None, None]
    assert set(await stored(nats_server)) >= {
        b"0",
        b"2",
        b"3",
    }  # the cancelled one may have gone too


async def test_a_new_store_s_stream_is_not_expected_to_go_on_from_the_old_one(
    bus: NatsBus, nats_server: NatsServer
) -> None:
    """NATS lost its store: the new stream counts from 1 again, so the sequence last seen
    stored in the old one says nothing; the next group goes one message at a time."""
    await bus.js_publish_all(STREAM, pods("a", "b", "c"))
    other = await replace_store(nats_server)
    await bus.restore_topology(reason="a write found no stream (test)")
    assert bus.store_epoch == other.store_epoch
    await other.js_publish(subjects.PODS_PENDING, b"x", msg_id="id.x")  # the new stream's 1
    async with answers_counted(nats_server) as answers:
        await bus.js_publish_all(STREAM, pods("d", "e"))
    assert answers == [2], "each answered, none expected to follow the old store's sequence"
    assert await stored(nats_server) == [b"x", b"d", b"e"]
    await other.drain()
