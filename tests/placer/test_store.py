"""The placer's store: a write whose own watch delivery comes back before its answer.

NATS delivers a replica's KV write to its own watch about as soon as it answers the write, and
most often first. The watch then leaves the value to the write (``Store.echoed``) instead of
decoding and applying it again; these tests hold the write's answer back to show that the view
gets the value exactly once whatever ends the write.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from services.placer.metrics import PlacerMetrics
from services.placer.rules.indexes import UNREADABLE
from services.placer.rules.state import ClusterView
from services.placer.writes import Store
from shared import codec, subjects
from shared.commits import record_of
from shared.messages.ledger import Booking, NodeLedger
from shared.runtime.bus import KvEntry
from shared.runtime.edge import Edge
from shared.runtime.metrics import EdgeMetrics
from shared.runtime.nats import NatsBus
from tests.harness.clock import FakeClock
from tests.placer.test_translate import booking
from tests.placer.test_view import view_of

BOOKING = booking("pod-1", (0, 1, 1))
KEY = subjects.assignment_key(BOOKING.node, BOOKING.pod_uid)


@dataclass
class HeldAnswerBus:
    """A KV bucket whose create lands at once and answers when ``answer`` is set."""

    answer: asyncio.Event
    landed: asyncio.Event
    written: bytes = b""

    async def kv_get(self, bucket: str, key: str) -> KvEntry | None:
        return None

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        self.written = value
        self.landed.set()
        await self.answer.wait()
        return 7


async def writing(bus: HeldAnswerBus) -> tuple[Store, ClusterView, asyncio.Task[object]]:
    view = view_of(BOOKING.node)
    registry = CollectorRegistry()
    clock = FakeClock()
    edge = Edge(bus=bus, metrics=EdgeMetrics.create(registry), clock=clock, service="test")  # type: ignore[arg-type]
    store = Store(
        bus=bus,  # type: ignore[arg-type]
        edge=edge,
        view=view,
        clock=clock,
        metrics=PlacerMetrics.create(registry),
    )
    task = asyncio.create_task(store.fence(BOOKING))  # a record written create-only
    await bus.landed.wait()
    return store, view, task


@pytest.mark.parametrize("ending", ["answered", "cancelled"])
async def test_an_own_write_delivered_before_its_answer_is_applied_once_by_the_write(
    ending: str,
) -> None:
    bus = HeldAnswerBus(answer=asyncio.Event(), landed=asyncio.Event())
    store, view, task = await writing(bus)
    assert KEY not in view.records

    assert store.echoed(subjects.KV_ASSIGNMENTS, KEY, bus.written, 7)
    assert KEY not in view.records, "left to the write: not applied by the watch"

    if ending == "answered":
        bus.answer.set()
        await task
    else:  # a stop while the answer is on its way: the delivery showed the write landed
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    record = view.records[KEY]
    assert record.revision == 7
    assert (record.commit, record.state) == (record_of(BOOKING).commit, "released")
    assert not store.echoed(subjects.KV_ASSIGNMENTS, KEY, bus.written, 8), "write is over"


@pytest.mark.parametrize(
    ("bucket", "key", "other"),
    [
        (subjects.KV_ASSIGNMENTS, KEY, True),  # same key, another value: another writer's
        (subjects.KV_LEDGER, KEY, False),  # the same bytes in another bucket
        (subjects.KV_ASSIGNMENTS, subjects.assignment_key(BOOKING.node, "pod-2"), False),
    ],
)
async def test_a_delivery_that_is_not_the_write_in_flight_is_the_watchs_to_apply(
    bucket: str, key: str, other: bool
) -> None:
    bus = HeldAnswerBus(answer=asyncio.Event(), landed=asyncio.Event())
    store, _, task = await writing(bus)
    value = codec.encode({"another": "value"}) if other else bus.written
    assert not store.echoed(bucket, key, value, 7)
    bus.answer.set()
    await task


def _store_over(bus: NatsBus) -> tuple[Store, ClusterView]:
    """A replica's store and view of nodes n1 and n2 (one 16 GiB GPU each) over a real bucket,
    with no watch: the view learns only what this store writes and reads."""
    view = view_of("n1", "n2", gpus=1)
    registry = CollectorRegistry()
    clock = FakeClock()
    edge = Edge(bus=bus, metrics=EdgeMetrics.create(registry), clock=clock, service="test")
    metrics = PlacerMetrics.create(registry)
    return Store(bus=bus, edge=edge, view=view, clock=clock, metrics=metrics), view


async def test_a_replica_that_missed_a_booking_learns_it_before_booking_over_it(
    bus: NatsBus,
) -> None:
    """Each booking has a key of its own, and the view holds a node at the latest revision among
    them: a write that lands may move that revision on only when nothing else landed on the
    node in between, or the view would hold the node at a revision it has not seen whole.

    Replica A unbooks while replica B's booking on the same GPU, which A never saw, has landed.
    Had A's delete been checked by its key alone, A's view would hold the node at the delete's
    revision without B's booking, and A's next booking would land over it (the protocol model
    found this: ``a GPU 0 memory`` over-committed in the ledger)."""
    a, a_view = _store_over(bus)
    b, _ = _store_over(bus)
    mine, theirs = booking("x", (0, 4096, 100)), booking("y", (0, 8192, 100))
    assert await a.book(mine) == ""
    await b.read_node("n1")
    assert await b.book(theirs) == ""
    assert a_view.ledger("n1")[0] == NodeLedger(node="n1", bookings=(mine,))  # y unseen

    await a.unbook(mine)  # its delete loses to y, reads the node and deletes again
    assert a_view.ledger("n1")[0] == NodeLedger(node="n1", bookings=(theirs,))
    # 12 GiB would fit beside x's 4 GiB, not beside y's 8 GiB.
    refused = await a.book(booking("z", (0, 12288, 100)))
    assert refused == "GPU 0: 12288 MiB asked, 8192 free"
    listed = await bus.kv_list(subjects.KV_LEDGER, subjects.node_bookings("n1"))
    assert {e.key: e.deleted for e in listed} == {
        subjects.booking_key("n1", "x"): True,
        subjects.booking_key("n1", "y"): False,
    }


async def test_an_earlier_version_s_entry_becomes_booking_keys_or_keeps_its_node_unplaceable(
    bus: NatsBus,
) -> None:
    store, view = _store_over(bus)
    held = (booking("x", (0, 4096, 100)), booking("y", (0, 2048, 100)))
    legacy = subjects.node_token("n1")
    entry = NodeLedger(node="n1", bookings=held)
    await bus.kv_put(subjects.KV_LEDGER, legacy, codec.encode(entry))
    # A replica that converted x already (two replicas starting at once) changes nothing.
    await bus.kv_create(subjects.KV_LEDGER, subjects.booking_key("n1", "x"), codec.encode(held[0]))
    await bus.kv_put(subjects.KV_LEDGER, subjects.node_token("n2"), b"not a ledger")

    assert await store.convert_legacy_ledgers() == 1
    assert await bus.kv_get(subjects.KV_LEDGER, legacy) is None
    assert view.ledger("n1")[0] == entry
    for kept in held:
        stored = await bus.kv_get(subjects.KV_LEDGER, subjects.booking_key("n1", kept.pod_uid))
        assert stored is not None and codec.decode(stored.value, Booking) == kept
    assert view.reason("n2") == UNREADABLE
    assert await bus.kv_get(subjects.KV_LEDGER, subjects.node_token("n2")) is not None
