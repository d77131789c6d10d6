"""The NATS Bus adapter against a real nats-server: pub/sub, JetStream durability, KV CAS, watch."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import nats
import pytest
from nats.aio.msg import Msg as NatsMsg

from shared import subjects
from shared.config import NatsSecurity, NodeSettings, Settings
from shared.runtime.bus import (
    NODE_WATCH_HEARTBEAT_S,
    WATCH_HEARTBEAT_S,
    BusUnavailableError,
    Delivery,
    KvEntry,
    KvWrite,
    NoResponderError,
    OutcomeUnknownError,
    PullConsumer,
)
from shared.runtime.lifecycle import bus_identity, connect_nats
from shared.runtime.nats import NatsBus
from shared.runtime.nats.messaging import _NatsPullConsumer
from shared.runtime.nats.watchers import WATCH_SILENT_HEARTBEATS, PushedWatch, sequences
from tests.harness.nats import NatsServer
from tests.harness.wait import eventually


async def test_core_publish_reaches_subscriber(bus: NatsBus) -> None:
    received: asyncio.Queue[Delivery] = asyncio.Queue()

    async def handler(delivery: Delivery) -> None:
        await received.put(delivery)

    sub = await bus.subscribe("tessera.test.core", handler)
    await bus.publish("tessera.test.core", b"hello", headers={"X-Kind": "greeting"})
    delivery = await asyncio.wait_for(received.get(), timeout=5)
    assert delivery.subject == "tessera.test.core"
    assert delivery.data == b"hello"
    assert delivery.headers["X-Kind"] == "greeting"
    await sub.unsubscribe()


async def test_queue_group_delivers_each_message_once(bus: NatsBus) -> None:
    seen: list[bytes] = []

    async def handler(delivery: Delivery) -> None:
        seen.append(delivery.data)

    subs = [await bus.subscribe("tessera.test.q", handler, queue="workers") for _ in range(2)]
    for i in range(20):
        await bus.publish("tessera.test.q", str(i).encode())
    for _ in range(100):
        if len(seen) == 20:
            break
        await asyncio.sleep(0.02)
    assert sorted(seen, key=int) == [str(i).encode() for i in range(20)]
    for sub in subs:
        await sub.unsubscribe()


async def test_request_gets_the_reply_of_one_responder(bus: NatsBus) -> None:
    async def answer(delivery: Delivery) -> None:
        await bus.publish(delivery.reply, delivery.data.upper())

    subs = [await bus.subscribe("tessera.test.ask", answer, queue="answer") for _ in range(2)]
    assert await bus.request("tessera.test.ask", b"pod?", timeout=5) == b"POD?"
    for sub in subs:
        await sub.unsubscribe()
    with pytest.raises(NoResponderError, match=r"nobody answers on tessera\.test\.ask"):
        await bus.request("tessera.test.ask", b"pod?", timeout=5)

    async def silent(delivery: Delivery) -> None:
        return None

    sub = await bus.subscribe("tessera.test.ask", silent)
    with pytest.raises(TimeoutError, match=r"no answer on tessera\.test\.ask within 0\.2 s"):
        await bus.request("tessera.test.ask", b"pod?", timeout=0.2)
    await sub.unsubscribe()


async def test_topology_creation_is_idempotent(nats_server: NatsServer) -> None:
    first = await NatsBus.connect(nats_server.url, name="first")
    await first.kv_put(subjects.KV_NODES, "n1", b"kept")
    second = await NatsBus.connect(nats_server.url, name="second")
    entry = await second.kv_get(subjects.KV_NODES, "n1")
    assert entry is not None and entry.value == b"kept"
    await first.drain()
    await second.drain()


async def test_pods_spread_over_three_consumers_are_handed_over_as_they_come(
    nats_server: NatsServer,
) -> None:
    """Pods that stream in (one every 4 ms) to three consumers of one durable (three placers)
    are handed over as they come, after a pause too. A pull of a batch once held most pods
    until the next one for that consumer came (the server's "nothing more" to such a pull
    follows the next message, and nats-py waits for it): 20 ms for a tenth of the pods here,
    and at the end of a stream up to the whole second of the pull (p99 800 ms at 250 pods/s in
    ``benchmarks/placer_service.py``)."""
    publisher = await NatsBus.connect(nats_server.url, name="publisher")
    workers = [await NatsBus.connect(nats_server.url, name=f"placer-{n}") for n in range(3)]
    consumers = [
        await worker.pull_consumer(
            stream=subjects.STREAM_PODS,
            durable="spread",
            subject=subjects.PODS_PENDING,
            ack_wait=30,
        )
        for worker in workers
    ]
    loop = asyncio.get_running_loop()
    sent: dict[bytes, float] = {}
    waited: dict[bytes, float] = {}
    pods = 300

    async def take(consumer: PullConsumer) -> None:
        while len(waited) < pods:
            for delivery in await consumer.fetch(64, timeout=1.0):
                waited[delivery.data] = loop.time() - sent[delivery.data]
                await delivery.ack()

    taking = [asyncio.create_task(take(consumer)) for consumer in consumers]
    for n in range(pods):
        if n % 150 == 0:
            await asyncio.sleep(1.5)  # the consumers' pulls expire, waiting
        sent[f"pod-{n}".encode()] = loop.time()
        await publisher.js_publish(subjects.PODS_PENDING, f"pod-{n}".encode())
        await asyncio.sleep(0.004)
    await asyncio.wait_for(asyncio.gather(*taking), timeout=20)
    waits = sorted(waited.values())
    tenth = waits[len(waits) * 9 // 10]
    assert tenth < 0.01, (
        f"a tenth of the pods waited {tenth * 1000:.1f} ms or more to be handed over"
    )
    for worker in workers:
        await worker.drain()
    await publisher.drain()


async def test_a_steady_stream_costs_one_pull_a_batch_not_one_a_pod(
    nats_server: NatsServer,
) -> None:
    """A placer at 250 pods/s sent a pull for nearly every pod (and heard "nothing there" to
    many): two of its seven messages a pod. A pull that brought a message stays for the next
    ones, so pods streamed in one by one cost one pull a batch, and each is still handed over
    as it comes. The pulls are counted as the server gets them, on their subject."""
    publisher = await NatsBus.connect(nats_server.url, name="publisher")
    worker = await NatsBus.connect(nats_server.url, name="placer")
    consumer = await worker.pull_consumer(
        stream=subjects.STREAM_PODS, durable="steady", subject=subjects.PODS_PENDING
    )
    observer = await nats.connect(nats_server.url, name="observer")
    pulls: list[bytes] = []

    async def count(msg: NatsMsg) -> None:
        pulls.append(msg.data)

    await observer.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{subjects.STREAM_PODS}.steady", cb=count)
    await observer.flush()
    loop = asyncio.get_running_loop()
    sent: dict[bytes, float] = {}
    waited: list[float] = []
    pods, batch = 100, 16

    async def take() -> None:
        while len(waited) < pods:
            for delivery in await consumer.fetch(batch, timeout=1.0):
                waited.append(loop.time() - sent[delivery.data])
                await delivery.ack()

    taking = asyncio.create_task(take())
    for n in range(pods):
        sent[f"pod-{n}".encode()] = loop.time()
        await publisher.js_publish(subjects.PODS_PENDING, f"pod-{n}".encode())
        await asyncio.sleep(0.004)
    await asyncio.wait_for(taking, timeout=20)
    # A probe and a pull of one before the first pod, then a pull a batch (and one more for
    # each pull that expired on a slow machine); a pull a pod was over a hundred.
    assert len(pulls) <= 2 + pods // batch + 3, pulls
    assert sorted(waited)[pods * 9 // 10] < 0.01, "pods were held before being handed over"
    await observer.close()
    await worker.drain()
    await publisher.drain()


async def test_what_a_pull_brought_and_no_fetch_took_goes_to_another_reader(
    nats_server: NatsServer,
) -> None:
    """A pull stays for the messages after the fetch that asked. A reader that stops taking (a
    placer replica left without a node pool) would keep what it brought until the ack wait
    (30 s for pods); it gives them back instead, and another reader takes them."""
    publisher = await NatsBus.connect(nats_server.url, name="publisher")
    workers = [await NatsBus.connect(nats_server.url, name=f"placer-{n}") for n in range(2)]
    first, second = [
        await worker.pull_consumer(
            stream=subjects.STREAM_PODS, durable="handed", subject=subjects.PODS_PENDING
        )
        for worker in workers
    ]
    publishing = asyncio.create_task(publisher.js_publish(subjects.PODS_PENDING, b"pod-0"))
    taken = await first.fetch(8, timeout=2.0)
    await publishing
    fetching = asyncio.create_task(first.fetch(8, timeout=2.0))  # a pull that stays
    await asyncio.sleep(0.2)
    await publisher.js_publish(subjects.PODS_PENDING, b"pod-1")
    taken += await fetching  # the first reader stops taking here
    for n in (2, 3):
        await publisher.js_publish(subjects.PODS_PENDING, f"pod-{n}".encode())
    await asyncio.sleep(0.3)  # brought by the pull that stayed, and not taken
    loop = asyncio.get_running_loop()
    started = loop.time()
    handed: list[Delivery] = []
    while len(handed) < 2 and loop.time() - started < 10:
        handed += await second.fetch(8, timeout=1.0)
    assert [d.data for d in taken] == [b"pod-0", b"pod-1"]
    assert sorted(d.data for d in handed) == [b"pod-2", b"pod-3"]
    assert all(d.num_delivered == 2 for d in handed), "given back, then delivered again"
    assert loop.time() - started < 5, "given back long before the ack wait"
    for worker in workers:
        await worker.drain()
    await publisher.drain()


async def test_durable_consumer_redelivers_unacked_then_resumes_after_restart(
    nats_server: NatsServer,
) -> None:
    publisher = await NatsBus.connect(nats_server.url, name="publisher")
    for i in range(3):
        await publisher.js_publish(subjects.PODS_PENDING, f"pod-{i}".encode())

    worker = await NatsBus.connect(nats_server.url, name="worker")
    consumer = await worker.pull_consumer(
        stream=subjects.STREAM_PODS, durable="placer", subject=subjects.PODS_PENDING, ack_wait=0.5
    )
    batch = await consumer.fetch(3, timeout=2)
    assert [d.data for d in batch] == [b"pod-0", b"pod-1", b"pod-2"]
    await batch[0].ack()
    await batch[1].ack()
    # pod-2 is not acked: after ack_wait it comes back, marked as a second delivery.
    again = await consumer.fetch(1, timeout=3)
    assert [d.data for d in again] == [b"pod-2"]
    assert again[0].num_delivered == 2
    await again[0].ack()
    await worker.drain()

    # A new process attaching to the same durable continues after what was acked.
    await publisher.js_publish(subjects.PODS_PENDING, b"pod-3")
    restarted = await NatsBus.connect(nats_server.url, name="worker-2")
    consumer2 = await restarted.pull_consumer(
        stream=subjects.STREAM_PODS, durable="placer", subject=subjects.PODS_PENDING, ack_wait=0.5
    )
    resumed = await consumer2.fetch(5, timeout=2)
    assert [d.data for d in resumed] == [b"pod-3"]
    await resumed[0].ack()
    assert await consumer2.fetch(1, timeout=0.3) == []
    await restarted.drain()
    await publisher.drain()


async def test_js_publish_deduplicates_by_message_id(bus: NatsBus) -> None:
    first = await bus.js_publish(subjects.PODS_PENDING, b"x", msg_id="uid-1")
    second = await bus.js_publish(subjects.PODS_PENDING, b"x", msg_id="uid-1")
    assert first == second


async def test_kv_compare_and_set_conflict_is_data(bus: NatsBus) -> None:
    bucket = subjects.KV_ASSIGNMENTS
    key = subjects.assignment_key("gpu-node.example.com", "uid-1")
    rev1 = await bus.kv_create(bucket, key, b"reserved")
    assert rev1 is not None
    assert await bus.kv_create(bucket, key, b"again") is None

    rev2 = await bus.kv_update(bucket, key, b"bound", revision=rev1)
    assert rev2 is not None and rev2 > rev1
    # A second writer still holding rev1 loses the race and learns it as data.
    assert await bus.kv_update(bucket, key, b"bound-by-other", revision=rev1) is None
    entry = await bus.kv_get(bucket, key)
    assert entry == KvEntry(key=key, value=b"bound", revision=rev2)


async def test_a_sent_write_lands_only_at_its_revision_and_nothing_answers_it(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    """``kv_send``: the same compare-and-set as ``kv_update``, with no reply through the server
    (a writer that watches the key learns the outcome there)."""
    bucket = subjects.KV_ASSIGNMENTS
    key = subjects.assignment_key("gpu-node.example.com", "uid-1")
    rev1 = await bus.kv_create(bucket, key, b"bound")
    assert rev1 is not None
    replies = await nats.connect(nats_server.url)
    answered: list[str] = []

    async def count(msg: NatsMsg) -> None:
        answered.append(msg.subject)

    await replies.subscribe("_INBOX.>", cb=count)
    await replies.flush()
    try:
        assert await bus.kv_send(bucket, key, b"allocated", revision=rev1)
        assert await bus.kv_send(bucket, key, b"lost the race", revision=rev1)
        await asyncio.sleep(0.3)
        assert answered == [], "the server answered a write that asked for no answer"
        entry = await bus.kv_get(bucket, key)  # a read is answered: one reply
        assert entry == KvEntry(key=key, value=b"allocated", revision=rev1 + 1)
        assert await bus.kv_update(bucket, key, b"released", revision=rev1 + 1) == rev1 + 2
        await eventually(lambda: len(answered) == 2, what="the read's and the update's answers")
    finally:
        await replies.close()


async def test_kv_writes_of_one_batch_land_all_or_none(bus: NatsBus) -> None:
    bucket = subjects.KV_LEDGER
    node, claim = subjects.booking_key("n1", "uid-0"), subjects.claim_key("uid-1")
    first = await bus.kv_create(bucket, node, b"one booking")
    assert first is not None
    landed = await bus.kv_write_all(
        bucket, [KvWrite(node, b"two bookings", first), KvWrite(claim, b"placed", 0)]
    )
    assert landed is not None and landed[1] == landed[0] + 1
    assert await bus.kv_get(bucket, node) == KvEntry(node, b"two bookings", landed[0])
    assert await bus.kv_get(bucket, claim) == KvEntry(claim, b"placed", landed[1])

    # One write that loses (the claim exists; the node moved on) and nothing of the batch lands.
    other = subjects.claim_key("uid-2")
    for writes in (
        [KvWrite(node, b"three", landed[0]), KvWrite(other, b"x", 0), KvWrite(claim, b"y", 0)],
        [KvWrite(other, b"x", 0), KvWrite(node, b"three", first)],
    ):
        assert await bus.kv_write_all(bucket, writes) is None
        assert await bus.kv_get(bucket, other) is None
        assert await bus.kv_get(bucket, node) == KvEntry(node, b"two bookings", landed[0])


async def test_a_batched_create_over_a_deleted_key_lands_as_kv_create_does(
    bus: NatsBus,
) -> None:
    bucket = subjects.KV_LEDGER
    claim = subjects.claim_key("uid-1")
    revision = await bus.kv_create(bucket, claim, b"deleted")
    assert revision is not None and await bus.kv_delete_if(bucket, claim, revision=revision)
    node = subjects.booking_key("n1", "uid-0")
    landed = await bus.kv_write_all(bucket, [KvWrite(node, b"b", 0), KvWrite(claim, b"c", 0)])
    assert landed is not None
    assert await bus.kv_get(bucket, claim) == KvEntry(claim, b"c", landed[1])
    assert await bus.kv_write_all(bucket, [KvWrite(claim, b"again", 0)]) is None


@pytest.mark.parametrize("batched", [False, True], ids=["one write", "batch"])
async def test_a_guarded_write_lands_only_while_no_key_of_its_guard_moved(
    bus: NatsBus, batched: bool
) -> None:
    bucket, guard = subjects.KV_LEDGER, subjects.node_bookings("n1")
    first, second = subjects.booking_key("n1", "uid-1"), subjects.booking_key("n1", "uid-2")

    async def write(key: str, value: bytes, seen: int) -> int | None:
        writes = [KvWrite(key, value, seen, guard=guard)]
        if batched:  # with a claim of its own, as a booking's batch goes
            writes.append(KvWrite(subjects.claim_key(value.decode()), value, 0))
        landed = await bus.kv_write_all(bucket, writes)
        return None if landed is None else landed[0]

    one = await write(first, b"a", 0)  # no booking on the node yet
    assert one is not None
    assert await write(second, b"b", 0) is None  # the node changed since 0
    other_node = await bus.kv_create(bucket, subjects.booking_key("n2", "uid-3"), b"c")
    assert other_node is not None  # a key the guard does not match moves nothing
    two = await write(second, b"b", one)
    assert two is not None
    await bus.kv_delete(bucket, first)  # a deletion moves the node too
    assert await write(first, b"a2", two) is None
    assert await bus.kv_get(bucket, first) is None
    listed = await bus.kv_list(bucket, guard)
    assert {e.key: e.deleted for e in listed} == {first: True, second: False}
    marker = max(e.revision for e in listed)
    assert await write(first, b"a2", marker) is not None


async def test_kv_get_delete_and_keys(bus: NatsBus) -> None:
    bucket = subjects.KV_INVENTORY
    assert await bus.kv_keys(bucket) == []
    assert await bus.kv_get(bucket, "missing") is None
    await bus.kv_put(bucket, "n1", b"a")
    await bus.kv_put(bucket, "n2", b"b")
    assert sorted(await bus.kv_keys(bucket)) == ["n1", "n2"]
    await bus.kv_delete(bucket, "n1")
    assert await bus.kv_get(bucket, "n1") is None
    assert await bus.kv_keys(bucket) == ["n2"]


BATCHES = pytest.mark.parametrize(
    "batch_s", [pytest.param(0.0, id="pushed"), pytest.param(0.05, id="batched")]
)
"""A watch sent each change as it is written, and one that asks for them every 50 ms."""


@BATCHES
async def test_kv_watch_gives_initial_values_marker_then_changes(
    bus: NatsBus, batch_s: float
) -> None:
    bucket = subjects.KV_ASSIGNMENTS
    await bus.kv_put(bucket, subjects.assignment_key("n1", "a"), b"1")
    await bus.kv_put(bucket, subjects.assignment_key("n2", "b"), b"other node")
    watch = bus.kv_watch(bucket, subjects.assignment_keys_of("n1"), batch_s=batch_s)
    first = await asyncio.wait_for(anext(watch), timeout=5)
    assert first is not None and first.value == b"1"
    assert await asyncio.wait_for(anext(watch), timeout=5) is None
    await bus.kv_put(bucket, subjects.assignment_key("n1", "c"), b"2")
    change = await asyncio.wait_for(anext(watch), timeout=5)
    assert change is not None and change.key == "n1.c" and change.value == b"2"
    await bus.kv_delete(bucket, subjects.assignment_key("n1", "c"))
    deletion = await asyncio.wait_for(anext(watch), timeout=5)
    assert deletion is not None and deletion.deleted
    await watch.aclose()


@BATCHES
async def test_keys_and_initial_values_are_whole_while_other_writers_update_the_keys(
    nats_server: NatsServer, bus: NatsBus, batch_s: float
) -> None:
    # Regression: nats-py's KeyValue.keys() and watch() can mark the initial values done before
    # any arrived (nats.py issue 842): an empty key list for a bucket of 5 keys in about 6 % of
    # listings while other clients wrote, so a test's read of the whole cluster state missed
    # every record now and then (and a placer could turn ready on a partial view).
    bucket = subjects.KV_ASSIGNMENTS
    keys = {f"n1.p{i}" for i in range(5)}
    writer = await NatsBus.connect(nats_server.url, name="writer")
    for key in keys:
        await writer.kv_put(bucket, key, b"0")
    stop = asyncio.Event()

    async def write(key: str) -> None:
        while not stop.is_set():
            await writer.kv_put(bucket, key, b"x" * 100)

    writers = [asyncio.create_task(write(key)) for key in sorted(keys)[:3]]
    try:
        for _ in range(300):
            assert set(await bus.kv_keys(bucket)) == keys
        for _ in range(50):
            seen = set()
            watch = bus.kv_watch(bucket, batch_s=batch_s)
            async for entry in watch:
                if entry is None:
                    break
                seen.add(entry.key)
            await watch.aclose()
            assert seen == keys
    finally:
        stop.set()
        await asyncio.gather(*writers)
        await writer.drain()


@BATCHES
async def test_listings_and_closed_watches_leave_no_consumer_on_the_server(
    nats_server: NatsServer, bus: NatsBus, batch_s: float
) -> None:
    # A stream holds at most 1,000 consumers, and nats-py's watcher asks the server to keep its
    # consumer 5 minutes after use: 1,000 listings within 5 minutes made the next one fail.
    bucket = subjects.KV_ASSIGNMENTS
    await bus.kv_put(bucket, "n1.a", b"1")
    for _ in range(20):
        assert await bus.kv_keys(bucket) == ["n1.a"]
    watch = bus.kv_watch(bucket, batch_s=batch_s)
    assert await asyncio.wait_for(anext(watch), timeout=5) is not None
    assert await asyncio.wait_for(anext(watch), timeout=5) is None
    await watch.aclose()
    client = await nats.connect(nats_server.url)
    try:
        info = await client.jetstream().stream_info(f"KV_{bucket}")
        assert info.state.consumer_count == 0
    finally:
        await client.close()


async def test_a_batched_watch_gives_every_key_s_latest_value_in_order(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    # Changes written while the watch waits between asks come in the next answers, in order; a
    # full answer is followed by another ask at once; a deletion comes as one. A key written
    # more often than the bucket keeps its history between two asks shows only its latest
    # values, as a KV watch that starts later would: every reader mirrors latest values.
    bucket = subjects.KV_LEDGER
    await bus.kv_put(bucket, "n0", b"start")
    watch = bus.kv_watch(bucket, batch_s=0.2)
    writer = await NatsBus.connect(nats_server.url, name="writer")
    try:
        assert (await asyncio.wait_for(anext(watch), timeout=5)) is not None
        assert await asyncio.wait_for(anext(watch), timeout=5) is None
        written = [await writer.kv_put(bucket, f"k{i}", str(i).encode()) for i in range(600)]
        again = [await writer.kv_put(bucket, "hot", str(n).encode()) for n in range(20)]
        await writer.kv_delete(bucket, "k3")
        seen: list[KvEntry] = []
        while not seen or not seen[-1].deleted:
            entry = await asyncio.wait_for(anext(watch), timeout=5)
            assert entry is not None
            seen.append(entry)
        assert [e.revision for e in seen[:600]] == written
        assert [e.value for e in seen[:600]] == [str(i).encode() for i in range(600)]
        rewrites = seen[600:-1]
        assert [e.key for e in rewrites] == ["hot"] * len(rewrites)
        assert [e.revision for e in rewrites] == again[-len(rewrites) :]
        assert (seen[-1].key, seen[-1].deleted) == ("k3", True)
    finally:
        await watch.aclose()
        await writer.drain()


async def test_a_quiet_batched_watch_asks_once_per_wait_not_once_per_batch(
    nats_server: NatsServer,
) -> None:
    # Two placer replicas' batched watches asked 40 times a second while nothing was written.
    # Now an ask that finds nothing is followed by one that waits (3 heartbeats, here 0.6 s)
    # for the next change; one that expires is asked again, and the watch goes on.
    bus = await NatsBus.connect(nats_server.url, name="watcher", watch_heartbeat_s=0.2)
    client = await nats.connect(nats_server.url)
    bucket = subjects.KV_LEDGER
    asks = 0

    async def count(_: NatsMsg) -> None:
        nonlocal asks
        asks += 1

    await client.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.KV_{bucket}.>", cb=count)
    watch = bus.kv_watch(bucket, batch_s=0.05)
    try:
        assert await asyncio.wait_for(anext(watch), timeout=5) is None
        await asyncio.sleep(0.3)
        asks = 0
        await asyncio.sleep(1.5)  # asking every 50 ms: about 30 asks
        assert asks <= 4
        await bus.kv_put(bucket, "n1", b"after the quiet")
        change = await asyncio.wait_for(anext(watch), timeout=5)
        assert change is not None and change.value == b"after the quiet"
    finally:
        await watch.aclose()
        await client.close()
        await bus.drain()


async def test_a_batched_watch_sees_the_first_change_after_a_quiet_spell_at_once(
    bus: NatsBus,
) -> None:
    # Its ask waits for that change, rather than the next ask a batch interval (3 s) later.
    bucket = subjects.KV_LEDGER
    watch = bus.kv_watch(bucket, batch_s=3.0)
    loop = asyncio.get_running_loop()
    try:
        assert await asyncio.wait_for(anext(watch), timeout=5) is None
        await asyncio.sleep(4.0)  # past the first batch interval: caught up, and quiet
        written = loop.time()
        await bus.kv_put(bucket, "n1", b"first")
        change = await asyncio.wait_for(anext(watch), timeout=10)
        assert change is not None and change.value == b"first"
        assert loop.time() - written < 1.5  # the next ask came 2 s after the write
    finally:
        await watch.aclose()


@pytest.mark.parametrize(
    ("role", "settings", "heartbeat_s"),
    [
        ("deviceplugin", NodeSettings(node="gpu-1"), NODE_WATCH_HEARTBEAT_S),
        ("inventory", NodeSettings(node="gpu-1"), NODE_WATCH_HEARTBEAT_S),
        ("placer", Settings(), WATCH_HEARTBEAT_S),
        ("binder", Settings(), WATCH_HEARTBEAT_S),
    ],
)
@pytest.mark.usefixtures("bus")  # gives the store its epoch first, as a placer or binder does
async def test_a_service_s_watches_get_its_role_s_idle_heartbeat(
    nats_server: NatsServer, role: str, settings: Settings, heartbeat_s: float
) -> None:
    # Heartbeats cost the server per watch: the per-node services' three watches each are the
    # ones that grow with the cluster, so they hear from an idle server less often.
    bus = await connect_nats(
        nats_server.url, f"tessera-{role}", identity=bus_identity(role, settings)
    )
    watch = bus.kv_watch(subjects.KV_LEDGER)
    client = await nats.connect(nats_server.url)
    try:
        assert await asyncio.wait_for(anext(watch), timeout=5) is None
        consumers = await client.jetstream().consumers_info(f"KV_{subjects.KV_LEDGER}")
        assert [c.config.idle_heartbeat for c in consumers] == [heartbeat_s]
    finally:
        await watch.aclose()
        await client.close()
        await bus.drain()


@BATCHES
async def test_a_kv_watch_ends_after_a_server_restart_and_a_new_one_sees_changes(
    batch_s: float,
) -> None:
    # Regression (found by the chaos test of `tessera up`): after a restart of nats-server the
    # watch's consumer stayed silent for ~18 s, so a device plugin missed its records. A batched
    # watch may also end by failing, when an ask goes unanswered before the reconnect is seen.
    with NatsServer() as server:
        bus = await NatsBus.connect(server.url, name="watcher")
        bucket = subjects.KV_ASSIGNMENTS
        await bus.kv_put(bucket, "n1.a", b"1")
        watch = bus.kv_watch(bucket, batch_s=batch_s)
        assert (await asyncio.wait_for(anext(watch), timeout=5)) is not None
        assert await asyncio.wait_for(anext(watch), timeout=5) is None
        server.kill()
        server.start()
        ended = (StopAsyncIteration, BusUnavailableError) if batch_s else StopAsyncIteration
        with pytest.raises(ended):
            await asyncio.wait_for(anext(watch), timeout=20)
        # A watch that ends (rather than fails) ends once reconnected.
        assert bus.connected or batch_s
        await eventually(lambda: bus.connected, timeout=20, what="the reconnect")
        await bus.kv_put(bucket, "n1.b", b"2")
        again = bus.kv_watch(bucket)
        keys = set()
        async for entry in again:
            if entry is None:
                break
            keys.add(entry.key)
        assert keys == {"n1.a", "n1.b"}
        await again.aclose()
        await bus.drain()


@pytest.mark.parametrize(
    ("node", "token"),
    [
        pytest.param("node-1", "node-1", id="plain"),
        pytest.param("gpu-7.dc1.example.com", "gpu-7_dc1_example_com", id="fqdn"),
    ],
)
def test_node_names_become_single_tokens(node: str, token: str) -> None:
    assert subjects.node_token(node) == token
    assert subjects.node_from_token(token) == node
    assert subjects.inventory(node) == f"tessera.inventory.{token}"


async def test_every_operation_while_disconnected_raises_bus_unavailable() -> None:
    # Regression: reads, watches and consumers let nats-py's "outbound buffer limit exceeded"
    # through while the bus reconnected (it buffers nothing), so a handler of
    # BusUnavailableError missed them; a chaos run's checks failed on one after a late kill.
    with NatsServer() as server:
        bus = await NatsBus.connect(server.url, name="cut-off")
        await bus.kv_put(subjects.KV_NODES, "n1", b"facts")
        await bus.js_publish(subjects.PODS_PENDING, b"pod")
        consumer = await bus.pull_consumer(
            stream=subjects.STREAM_PODS, durable="d", subject=subjects.PODS_PENDING
        )
        assert len(await consumer.fetch(1, timeout=2)) == 1
        server.kill()
        await eventually(lambda: not bus.connected, timeout=10, what="the disconnect")
        operations: dict[str, Callable[[], Awaitable[object]]] = {
            "kv_get": lambda: bus.kv_get(subjects.KV_NODES, "n1"),
            "kv_keys": lambda: bus.kv_keys(subjects.KV_NODES),
            "kv_watch": lambda: anext(bus.kv_watch(subjects.KV_NODES)),
            "kv_watch batched": lambda: anext(bus.kv_watch(subjects.KV_NODES, batch_s=0.1)),
            "kv_put": lambda: bus.kv_put(subjects.KV_NODES, "n1", b"new"),
            "kv_create": lambda: bus.kv_create(subjects.KV_NODES, "n2", b"new"),
            "kv_update": lambda: bus.kv_update(subjects.KV_NODES, "n1", b"new", revision=1),
            "kv_delete": lambda: bus.kv_delete(subjects.KV_NODES, "n1"),
            "publish": lambda: bus.publish("tessera.test", b"x"),
            "js_publish": lambda: bus.js_publish(subjects.PODS_PENDING, b"x"),
            "request": lambda: bus.request("tessera.test", b"x", timeout=1),
            "pull_consumer": lambda: bus.pull_consumer(
                stream=subjects.STREAM_PODS, durable="d", subject=subjects.PODS_PENDING
            ),
            "fetch": lambda: consumer.fetch(1, timeout=1),
        }
        outcomes: dict[str, str] = {}
        for name, operation in operations.items():
            try:
                await asyncio.wait_for(operation(), timeout=10)
                outcomes[name] = "nothing raised"
            except Exception as error:
                outcomes[name] = f"{type(error).__module__}.{type(error).__name__}: {error}"
        wrong = {
            name: outcome
            for name, outcome in outcomes.items()
            if not outcome.startswith("shared.runtime.bus.BusUnavailableError: ")
            or "not connected to NATS" not in outcome
        }
        assert wrong == {}
        server.start()
        await eventually(lambda: bus.connected, timeout=20, what="the reconnect")
        entry = await bus.kv_get(subjects.KV_NODES, "n1")
        assert entry is not None and entry.value == b"facts"  # nothing was written meanwhile
        await bus.drain()


async def test_bus_reconnects_after_a_server_restart_and_keeps_durable_state() -> None:
    with NatsServer() as server:
        bus = await NatsBus.connect(server.url, name="survivor")
        await bus.js_publish(subjects.PODS_PENDING, b"before")
        await bus.kv_put(subjects.KV_NODES, "n1", b"facts")
        server.kill()
        for _ in range(100):
            if not bus.connected:
                break
            await asyncio.sleep(0.02)
        assert not bus.connected
        server.start()
        for _ in range(300):
            if bus.connected:
                break
            await asyncio.sleep(0.02)
        assert bus.connected
        # JetStream and KV state survived on disk; the same client works again.
        await bus.js_publish(subjects.PODS_PENDING, b"after")
        consumer = await bus.pull_consumer(
            stream=subjects.STREAM_PODS, durable="d", subject=subjects.PODS_PENDING
        )
        assert [d.data for d in await consumer.fetch(5, timeout=2)] == [b"before", b"after"]
        entry = await bus.kv_get(subjects.KV_NODES, "n1")
        assert entry is not None
        assert entry.value == b"facts"
        await bus.drain()


async def test_not_connected_until_the_reconnect_callback_ran() -> None:
    """nats-py reports the new connection up before it calls the bus's reconnected callback;
    a write in between was failed as 'the connection dropped before the answer' (seen in CI
    right after a server restart). The nats-py callbacks are driven here in that order."""
    with NatsServer() as server:
        # The write in between waits a request timeout for the store check, then is refused.
        bus = await NatsBus.connect(server.url, name="between", request_timeout=0.5)
        bus._on_disconnect()  # the lost connection's callback ran; nats-py is up again already
        assert not bus.connected
        with pytest.raises(BusUnavailableError):
            await bus.kv_put(subjects.KV_NODES, "n1", b"facts")
        bus._on_reconnect()
        assert bus.connected
        assert await bus.kv_put(subjects.KV_NODES, "n1", b"facts") > 0
        await bus.drain()


async def test_writes_while_disconnected_are_refused_at_once_and_never_land() -> None:
    """nats-py would buffer these and send them after the reconnect, long after the caller gave
    up (issue 9, item 2): the bus refuses them instead, and nothing of them lands later."""
    with NatsServer() as server:
        bus = await NatsBus.connect(server.url, name="outage")
        key = subjects.assignment_key("n1", "uid-1")
        revision = await bus.kv_put(subjects.KV_ASSIGNMENTS, key, b"bound")
        server.kill()
        for _ in range(500):
            if not bus.connected:
                break
            await asyncio.sleep(0.01)
        writes = {
            "kv_update": bus.kv_update(subjects.KV_ASSIGNMENTS, key, b"claimed", revision=revision),
            "kv_put": bus.kv_put(subjects.KV_ASSIGNMENTS, key, b"overwritten"),
            "kv_create": bus.kv_create(subjects.KV_ASSIGNMENTS, "n1.uid-2", b"new"),
            "kv_delete": bus.kv_delete(subjects.KV_ASSIGNMENTS, key),
            "js_publish": bus.js_publish(subjects.PODS_PENDING, b"late"),
            "publish": bus.publish("tessera.test.late", b"late"),
        }
        for write in writes.values():
            with pytest.raises(BusUnavailableError, match="nothing was sent"):
                await asyncio.wait_for(write, timeout=1)  # at once, not after a timeout
        assert bus.connection_status().state == "reconnecting"
        server.start()
        for _ in range(1000):
            if bus.connected:
                break
            await asyncio.sleep(0.01)
        assert bus.connected
        entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
        assert entry == KvEntry(key=key, value=b"bound", revision=revision)
        assert await bus.kv_get(subjects.KV_ASSIGNMENTS, "n1.uid-2") is None
        consumer = await bus.pull_consumer(
            stream=subjects.STREAM_PODS, durable="late", subject=subjects.PODS_PENDING
        )
        assert await consumer.fetch(1, timeout=0.5) == []
        status = bus.connection_status()
        assert (status.state, status.disconnects, status.reconnects) == ("connected", 1, 1)
        await bus.drain()


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T`` = stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def stopped(pid: int) -> None:
    """Wait until the kernel has really stopped ``pid`` (SIGSTOP is delivered asynchronously)."""
    for _ in range(500):
        if process_state(pid) in ("T", "t"):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


@pytest.mark.parametrize("batched", [False, True], ids=["compare-and-set", "batch"])
async def test_a_write_whose_answer_never_comes_has_an_unknown_outcome_at_once(
    batched: bool,
) -> None:
    """The server stops answering, then dies: the waiting compare-and-set (or batch) says its
    outcome is unknown as soon as the connection drops, instead of timing out seconds later."""
    with NatsServer() as server:
        bus = await NatsBus.connect(server.url, name="in-flight", request_timeout=30.0)
        key = subjects.assignment_key("n1", "uid-1")
        revision = await bus.kv_put(subjects.KV_ASSIGNMENTS, key, b"bound")
        os.kill(server.pid, signal.SIGSTOP)
        await stopped(server.pid)
        try:
            write = asyncio.ensure_future(
                bus.kv_write_all(
                    subjects.KV_ASSIGNMENTS,
                    [
                        KvWrite(key, b"claimed", revision),
                        KvWrite(subjects.assignment_key("n1", "uid-2"), b"reserved", 0),
                    ],
                )
                if batched
                else bus.kv_update(subjects.KV_ASSIGNMENTS, key, b"claimed", revision=revision)
            )
            await asyncio.sleep(0.2)
            assert not write.done(), "a stopped server cannot answer"
        finally:
            server.kill()
        with pytest.raises(OutcomeUnknownError, match="may or may not have been applied"):
            await asyncio.wait_for(write, timeout=10)
        server.start()
        for _ in range(1000):
            if bus.connected:
                break
            await asyncio.sleep(0.01)
        entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
        assert entry is not None and entry.value == b"bound", "read back: it did not land"
        await bus.drain()


async def test_streams_are_bounded_pods_by_acknowledgement_the_rest_by_age(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    import nats
    from nats.js.api import RetentionPolicy

    client = await nats.connect(nats_server.url)
    try:
        js = client.jetstream()
        pods = (await js.stream_info(subjects.STREAM_PODS)).config
        assert pods.retention == RetentionPolicy.WORK_QUEUE
        for name, age in subjects.STREAM_MAX_AGE_S.items():
            config = (await js.stream_info(name)).config
            assert config.retention == RetentionPolicy.LIMITS
            assert config.max_age == pytest.approx(age), name
    finally:
        await client.close()


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.KV_tessera-ledger.abc123.1.4711.9.1732400000000000000.0",
        "$JS.ACK._.ACCHASH.KV_tessera-ledger.abc123.2.4712.10.1732400000000000000.3.rnd",
        "$JS.ACK.hub.ACCHASH.KV_x.c.1.1.1.1732400000000000000.0.token",
    ],
)
def test_a_watch_reads_the_sequences_as_nats_py_does(reply: str) -> None:
    expected = NatsMsg.Metadata._from_reply(reply).sequence
    assert sequences(reply) == (expected.stream, expected.consumer)


async def test_a_watch_answers_the_server_s_flow_control_as_it_reads(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    # 8 MB of initial values: the server asks for flow-control answers on the way and sends
    # nothing more until it has one. Unanswered, only an idle heartbeat naming the stall would
    # unblock it, and the one here is 30 s apart.
    values = 2000
    for i in range(values):
        await bus.kv_put(subjects.KV_LEDGER, f"k{i}", b"x" * 4000)
    reader = await NatsBus.connect(nats_server.url, name="reader", watch_heartbeat_s=30.0)
    watch = reader.kv_watch(subjects.KV_LEDGER)
    try:
        keys = []
        async with asyncio.timeout(10):
            async for entry in watch:
                if entry is None:
                    break
                keys.append(entry.key)
                if len(keys) % 100 == 0:
                    await asyncio.sleep(0.01)  # a reader slower than the server
        assert keys == [f"k{i}" for i in range(values)]
    finally:
        await watch.aclose()
        await reader.drain()


async def test_a_watch_whose_consumer_was_deleted_fails_once_it_hears_nothing(
    nats_server: NatsServer,
) -> None:
    # No message, no heartbeat: the consumer is gone (deleted, or lost with the server that held
    # it while the connection stayed up), and the caller must watch again.
    heartbeat_s = 0.2
    reader = await NatsBus.connect(nats_server.url, name="reader", watch_heartbeat_s=heartbeat_s)
    watch = reader.kv_watch(subjects.KV_LEDGER)
    client = await nats.connect(nats_server.url)
    stream = f"KV_{subjects.KV_LEDGER}"
    try:
        assert await asyncio.wait_for(anext(watch), timeout=5) is None
        for consumer in await client.jetstream().consumers_info(stream):
            await client.jetstream().delete_consumer(stream, consumer.name)
        started = asyncio.get_running_loop().time()
        with pytest.raises(BusUnavailableError, match="no message or heartbeat"):
            await asyncio.wait_for(anext(watch), timeout=5)
        waited = asyncio.get_running_loop().time() - started
        assert waited >= (WATCH_SILENT_HEARTBEATS - 1) * heartbeat_s
    finally:
        await watch.aclose()
        await client.close()
        await reader.drain()


async def test_a_watch_whose_reader_is_late_is_not_taken_for_silent(
    nats_server: NatsServer, bus: NatsBus
) -> None:
    # A reader busy for many heartbeat intervals leaves the watch's queue full and the messages
    # after it waiting in the client: nothing arrives meanwhile, yet the consumer is alive.
    heartbeat_s = 0.2
    values = 600
    for i in range(values):
        await bus.kv_put(subjects.KV_LEDGER, f"k{i}", b"x")
    reader = await NatsBus.connect(nats_server.url, name="reader", watch_heartbeat_s=heartbeat_s)
    watch = reader.kv_watch(subjects.KV_LEDGER)
    try:
        first = await asyncio.wait_for(anext(watch), timeout=5)
        assert first is not None
        await asyncio.sleep(3 * WATCH_SILENT_HEARTBEATS * heartbeat_s)
        keys = [first.key]
        async with asyncio.timeout(10):
            async for entry in watch:
                if entry is None:
                    break
                keys.append(entry.key)
        assert keys == [f"k{i}" for i in range(values)]
    finally:
        await watch.aclose()
        await reader.drain()


def _pushed_message(*, consumer_sequence: int = 0, headers: dict[str, str] | None = None) -> Any:
    reply = (
        f"$JS.ACK.KV_x.c.1.{consumer_sequence + 10}.{consumer_sequence}.1732400000000000000.0"
        if consumer_sequence
        else ""
    )
    client: Any = None  # never asked: the watch reads only the fields
    return NatsMsg(_client=client, subject="$KV.x.k", reply=reply, data=b"v", headers=headers)


@pytest.mark.parametrize(
    ("arriving", "fails"),
    [
        pytest.param([1, 2, 3], "", id="in order"),
        pytest.param([1, 3], "message 2 of the consumer was missed", id="a message skipped"),
        pytest.param(
            [1, {"Status": "100", "Description": "Idle Heartbeat", "Nats-Last-Consumer": "1"}],
            "",
            id="a heartbeat after the last message",
        ),
        pytest.param(
            [1, {"Status": "100", "Description": "Idle Heartbeat", "Nats-Last-Consumer": "2"}],
            "the consumer sent up to 2, 1 arrived",
            id="a heartbeat naming a message that never came",
        ),
        pytest.param(
            [{"Status": "409", "Description": "Consumer Deleted"}],
            "status 409 Consumer Deleted",
            id="a status other than a heartbeat",
        ),
    ],
)
async def test_a_pushed_watch_hands_on_messages_in_order_or_fails(
    arriving: list[int | dict[str, str]], fails: str
) -> None:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    pushed = PushedWatch(None, queue, heartbeat_s=1.0)
    for item in arriving:
        if isinstance(item, int):
            await pushed._take(_pushed_message(consumer_sequence=item))
        else:
            await pushed._take(_pushed_message(headers=item))
    pushed._watchdog.cancel()
    taken = [queue.get_nowait() for _ in range(queue.qsize())]
    data = [sequences(m.reply)[1] for m in taken if not isinstance(m, BaseException)]
    errors = [str(m) for m in taken if isinstance(m, BaseException)]
    assert errors == ([fails] if fails else [])
    assert data == [i for i in arriving if isinstance(i, int)][: len(data)]
    if not fails:
        assert len(data) == sum(isinstance(i, int) for i in arriving)


@pytest.mark.parametrize(
    ("status", "description", "then"),
    [
        pytest.param("408", "Request Timeout", "pulled again", id="expired"),
        pytest.param("404", "No Messages", "pulled again", id="nothing there"),
        pytest.param("409", "Leadership Change", "pulled again", id="a new leader"),
        pytest.param("409", "Server Shutdown", "pulled again", id="a server stopping"),
        pytest.param("409", "Consumer Deleted", "attached again", id="consumer deleted"),
        pytest.param("503", "", "attached again", id="nobody answers"),
        pytest.param("409", "Exceeded MaxWaiting", "backs off", id="refused"),
    ],
)
async def test_a_pulls_status_ends_it_and_says_what_comes_next(
    status: str, description: str, then: str
) -> None:
    """A status on the last pull's subject ends that pull; what the fetch does next depends on
    it. The same status of an earlier pull, arriving late, ends nothing."""

    async def attach() -> None:
        return None

    consumer = _NatsPullConsumer(cast(Any, None), "_INBOX.t", "next", attach)
    consumer._pulls, consumer._left = 3, 5
    headers = {"Status": status, "Description": description}
    late = NatsMsg(_client=cast(Any, None), subject="_INBOX.t.2", data=b"", headers=headers)
    await consumer._take(late)
    assert consumer._left == 5, "a late status of an earlier pull ended the current one"
    current = NatsMsg(_client=cast(Any, None), subject="_INBOX.t.3", data=b"", headers=headers)
    await consumer._take(current)
    outcome = (
        "attached again"
        if consumer._missing
        else "backs off"
        if consumer._refused
        else "pulled again"
    )
    assert (consumer._left, outcome) == (0, then)


def _limited(*denied: str) -> str:
    """A server configuration with users ``admin`` (anything) and ``limited``, who may publish
    anything but the ``denied`` subjects. A JetStream request the server refuses goes
    unanswered and times out, as it does while a cluster elects its leaders."""
    quoted = ", ".join(f'"{subject}"' for subject in denied)
    return (
        "authorization { users = [\n  {user: admin, password: admin}\n"
        "  {user: limited, password: limited, permissions: {publish: "
        f'{{allow: [">"], deny: [{quoted}]}}}}}}\n] }}\n'
    )


_NO_CONSUMER_CREATION = _limited("$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>")
"""``limited`` may pull from a consumer but not create one: attaching again fails for it."""


async def _connect_as(server: NatsServer, user: str, **options: Any) -> NatsBus:
    return await NatsBus.connect(
        server.url, name=user, security=NatsSecurity(user=user, password=user), **options
    )


async def test_a_consumer_attached_again_in_vain_keeps_delivering_once_it_is_back() -> None:
    """A 3-server cluster lost the placers' consumer leader: pulls found no responder, so the
    consumer was attached again, which timed out during the election. The subscription had
    been dropped first, so the server discarded every later pull (its reply subject had no
    listener) and no pod was placed again. Here the consumer is deleted and attaching again
    is refused once; when the consumer is back it delivers to the same client."""
    with NatsServer(config=_NO_CONSUMER_CREATION) as server:
        admin = await _connect_as(server, "admin")
        worker = await _connect_as(server, "limited", request_timeout=1.0)

        def attach(bus: NatsBus) -> Awaitable[PullConsumer]:
            return bus.pull_consumer(
                stream=subjects.STREAM_PODS, durable="elected", subject=subjects.PODS_PENDING
            )

        try:
            await attach(admin)
            consumer = await attach(worker)
            await admin._js.delete_consumer(subjects.STREAM_PODS, "elected")
            await admin.js_publish(subjects.PODS_PENDING, b"pod")
            with pytest.raises(BusUnavailableError, match="elected cannot be attached now"):
                await consumer.fetch(1, timeout=1.0)  # no responder; the worker cannot create it
            await attach(admin)  # the consumer's leader is elected
            delivered: list[bytes] = []
            for _ in range(5):
                delivered += [d.data for d in await consumer.fetch(1, timeout=1.0)]
                if delivered:
                    break
            assert delivered == [b"pod"]
        finally:
            await worker.drain()
            await admin.drain()


async def test_a_bucket_that_cannot_be_looked_up_is_nats_unavailable() -> None:
    """A three-server chaos run: a placer's pool lease write had to look its bucket up first
    (a JetStream request of its own), which timed out while the cluster elected its leaders;
    nats-py's raw timeout passed every handler and stopped all three placers. The lookup's
    failure is NATS unavailable, nothing done. Here the lookup times out for a user that may
    not ask for stream information."""
    with NatsServer(config=_limited("$JS.API.STREAM.INFO.>")) as server:
        admin = await _connect_as(server, "admin")
        blind = await _connect_as(server, "limited", request_timeout=0.5, topology=False)
        try:
            with pytest.raises(BusUnavailableError, match="cannot be looked up now"):
                await blind.kv_put(subjects.KV_NODES, "n1", b"facts")
            with pytest.raises(BusUnavailableError, match="cannot be looked up now"):
                await blind.kv_get(subjects.KV_NODES, "n1")
            assert await admin.kv_get(subjects.KV_NODES, "n1") is None, "nothing was written"
        finally:
            await blind.drain()
            await admin.drain()


async def test_a_bucket_that_cannot_be_watched_is_nats_unavailable() -> None:
    """The same run stopped another placer listing the pool leases: the listing's consumer
    could not be created in time. Here a user that may not create consumers lists a bucket."""
    with NatsServer(config=_NO_CONSUMER_CREATION) as server:
        admin = await _connect_as(server, "admin")
        worker = await _connect_as(server, "limited", request_timeout=0.5)
        try:
            with pytest.raises(BusUnavailableError, match="cannot be watched now"):
                await worker.kv_keys(subjects.KV_NODES)
        finally:
            await worker.drain()
            await admin.drain()


async def test_a_read_that_gets_no_answer_is_nats_unavailable() -> None:
    """A three-server chaos run stopped a placer: during an election a pool lease's read went
    unanswered, and nats-py's own timeout passed every handler of the lease keeper. Here the
    server refuses the reads of one user, who then waits in vain as during an election."""
    with NatsServer(config=_limited(f"$JS.API.STREAM.MSG.GET.KV_{subjects.KV_NODES}")) as server:
        admin = await _connect_as(server, "admin")
        worker = await _connect_as(server, "limited", request_timeout=0.5)
        try:
            await admin.kv_put(subjects.KV_NODES, "n1", b"facts")
            with pytest.raises(BusUnavailableError, match="cannot be read now"):
                await worker.kv_get(subjects.KV_NODES, "n1")
            assert await admin.kv_get(subjects.KV_NODES, "n1") is not None
        finally:
            await worker.drain()
            await admin.drain()


async def test_a_check_for_lost_streams_that_gets_no_answer_is_nats_unavailable() -> None:
    """Seen in a three-server chaos run: a write found no stream during an election, the check
    for lost streams it started went unanswered, and nats-py's timeout stopped the placer."""
    with NatsServer(config=_limited("$JS.API.STREAM.INFO.*")) as server:
        admin = await _connect_as(server, "admin")
        worker = await _connect_as(server, "limited", request_timeout=0.5, topology=False)
        try:
            with pytest.raises(BusUnavailableError, match="cannot be checked for lost streams"):
                await worker.restore_topology(reason="a write found no stream")
        finally:
            await worker.drain()
            await admin.drain()


async def test_kv_runs_again_after_a_reconnect_while_a_stream_does_not_answer() -> None:
    """A three-server chaos run: after a reconnect a device plugin checked every stream and
    bucket before any KV operation could run again, and one stream slow to answer (its leader
    still being elected) failed that check for 25 s: every Allocate on its node was refused.
    KV waits only for the store's epoch now; here one stream never answers its check."""
    with NatsServer(config=_limited("$JS.API.STREAM.INFO.TESSERA_PODS")) as server:
        admin = await _connect_as(server, "admin")
        await admin.drain()
        partial = await _connect_as(server, "limited", request_timeout=0.5, topology=False)
        try:
            server.kill()
            await eventually(lambda: not partial.connected, what="the disconnect")
            server.start()
            await eventually(lambda: partial.connected, timeout=30, what="the reconnect")

            async def written() -> bool:
                try:
                    await partial.kv_put(subjects.KV_NODES, "n1", b"facts")
                except BusUnavailableError:
                    return False
                return True

            await eventually(written, timeout=10, interval=0.2, what="a KV write accepted")
            entry = await partial.kv_get(subjects.KV_NODES, "n1")
            assert entry is not None and entry.value == b"facts"
        finally:
            await partial.drain()
