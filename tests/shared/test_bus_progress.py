"""Bus additions the placer needs: in-progress acks, stream sequences, max_ack_pending, and a
delete that only happens at a given revision."""

from __future__ import annotations

import asyncio

from shared import subjects
from shared.runtime.nats import NatsBus


async def test_a_message_kept_in_progress_is_not_redelivered(bus: NatsBus) -> None:
    consumer = await bus.pull_consumer(
        stream=subjects.STREAM_PODS,
        durable="progress",
        subject=subjects.PODS_ALL,
        ack_wait=1.0,
        max_ack_pending=10_000,
    )
    first = await bus.js_publish(subjects.PODS_PENDING, b"one")
    (held,) = await consumer.fetch(1, 5.0)
    assert held.sequence == first
    for _ in range(4):  # 2 s in all: twice the ack wait
        await asyncio.sleep(0.5)
        await held.in_progress()
    assert await consumer.fetch(1, 0.5) == []  # still ours
    await asyncio.sleep(1.5)  # no more progress: it goes back
    (again,) = await consumer.fetch(1, 5.0)
    assert (again.sequence, again.num_delivered) == (first, 2)
    await again.ack()
    await consumer.close()


async def test_delete_if_only_deletes_the_revision_it_was_given(bus: NatsBus) -> None:
    first = await bus.kv_put(subjects.KV_CLAIMS, "pod-1", b"a")
    second = await bus.kv_put(subjects.KV_CLAIMS, "pod-1", b"b")
    assert not await bus.kv_delete_if(subjects.KV_CLAIMS, "pod-1", revision=first)
    assert (await bus.kv_get(subjects.KV_CLAIMS, "pod-1")) is not None
    assert await bus.kv_delete_if(subjects.KV_CLAIMS, "pod-1", revision=second)
    assert await bus.kv_get(subjects.KV_CLAIMS, "pod-1") is None
    assert await bus.kv_create(subjects.KV_CLAIMS, "pod-1", b"c") is not None  # free again
