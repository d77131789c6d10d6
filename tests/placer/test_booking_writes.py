"""A booking written with no answer from the server (``KvWrites.send_booking``), against a real
nats-server: guarded at its node's revision, its outcome is the first version of any of the
node's bookings the placer's bookings watch shows above that revision. Only where that watch is
pushed (``Watches._bookings_loaded``); the wait's ends it shares with a claim's (silence, a
dropped connection, a new store) are ``test_claim_writes``'."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence

import msgspec
import pytest

from services.placer.writes import ConflictError, Store
from shared import codec, subjects
from shared.messages.ledger import Booking
from shared.runtime.bus import KvEntry, KvWrite
from shared.runtime.follow import follow
from shared.runtime.nats import NatsBus
from tests.harness.clock import FakeClock
from tests.harness.wait import running
from tests.placer.test_claim_writes import store_over
from tests.placer.test_translate import booking
from tests.placer.test_view import view_of

MINE = booking("pod-1", (0, 1, 1))
BESIDE = msgspec.structs.replace(booking("pod-2", (1, 1, 1)), commit="beside")
"""Another pod's booking on MINE's node, on the other GPU."""
ELSEWHERE = msgspec.structs.replace(BESIDE, node="node-b")


class CountingBus:
    """A real ``NatsBus`` that counts the bookings written (and read back) through it, by kind;
    ``ahead``: a
    booking another replica writes (guarded at the same revision) just before this bus's
    unanswered one reaches the server."""

    def __init__(self, bus: NatsBus, *, ahead: Booking | None = None) -> None:
        self._bus = bus
        self._ahead = ahead
        self.writes: Counter[str] = Counter()

    def __getattr__(self, name: str) -> object:
        return getattr(self._bus, name)

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
        self.writes["unanswered"] += 1
        if self._ahead is not None:
            ahead = self._ahead
            own_guard = subjects.node_bookings(ahead.node)
            written = KvWrite(
                subjects.booking_key(ahead.node, ahead.pod_uid),
                codec.encode(ahead),
                revision if own_guard == guard else 0,
                guard=own_guard,
            )
            assert await self._bus.kv_write_all(bucket, [written])
        return await self._bus.kv_send(
            bucket, key, value, revision=revision, create=create, guard=guard
        )

    async def kv_write_all(self, bucket: str, writes: Sequence[KvWrite]) -> tuple[int, ...] | None:
        self.writes["answered"] += 1
        return await self._bus.kv_write_all(bucket, writes)

    async def kv_list(self, bucket: str, keys: str) -> list[KvEntry]:
        self.writes["reads"] += 1
        return await self._bus.kv_list(bucket, keys)


def watching_bookings(
    bus: NatsBus, store: Store, clock: FakeClock
) -> contextlib.AbstractAsyncContextManager[None]:
    """The bookings' watch as the placer runs it without node pools: each version to
    ``Store.watched``."""

    async def on_entry(entry: KvEntry) -> None:
        value = None if entry.deleted else entry.value
        store.watched(subjects.KV_LEDGER, entry.key, value, entry.revision)

    async def on_loaded(_: set[str]) -> None:
        store.bookings_watched = True

    watch = follow(
        bus,
        subjects.KV_LEDGER,
        on_entry=on_entry,
        on_loaded=on_loaded,
        clock=clock,
        keys=subjects.BOOKING_KEYS,
    )
    return running(watch, until=lambda: store.bookings_watched, what="the bookings watched")


async def booked(bus: NatsBus, node: str) -> set[str]:
    """The pods booked on ``node`` as the server has them."""
    entries = await bus.kv_list(subjects.KV_LEDGER, subjects.node_bookings(node))
    return {codec.decode(e.value, Booking).pod_uid for e in entries if not e.deleted}


async def test_a_booking_goes_unanswered_and_lands_as_its_watch_shows(bus: NatsBus) -> None:
    counting = CountingBus(bus)
    clock = FakeClock()
    view = view_of(MINE.node, ELSEWHERE.node)
    store = store_over(counting, clock, view)
    async with watching_bookings(bus, store, clock):
        assert await store.book(MINE) == ""
    assert counting.writes == {"unanswered": 1}
    assert await booked(bus, MINE.node) == {MINE.pod_uid}
    assert view.booking_revision(MINE.node, MINE.pod_uid) > 0, "the view holds it"


async def test_another_node_s_booking_first_settles_nothing(bus: NatsBus) -> None:
    """A booking on another node lands just before: not one of this node's, so the first
    version above the guard the watch shows of this node is still this booking's (a booking
    taken for lost would be read back)."""
    counting = CountingBus(bus, ahead=ELSEWHERE)
    clock = FakeClock()
    store = store_over(counting, clock)
    async with watching_bookings(bus, store, clock):
        assert await store.book(MINE) == ""
    assert counting.writes == {"unanswered": 1}
    assert await booked(bus, MINE.node) == {MINE.pod_uid}


async def test_a_booking_beaten_by_another_on_its_node_is_lost_to_it(bus: NatsBus) -> None:
    """Another replica's booking on the node lands first: the guard refuses this one and the
    server answers nobody; the watch shows the other booking above the guard, the node is read
    back, and the decision, made on bookings that have changed, is made anew."""
    counting = CountingBus(bus, ahead=BESIDE)
    clock = FakeClock()
    store = store_over(counting, clock)
    async with watching_bookings(bus, store, clock):
        with pytest.raises(ConflictError):
            await store.book(MINE)
    assert counting.writes == {"unanswered": 1, "reads": 1}
    assert await booked(bus, MINE.node) == {BESIDE.pod_uid}


async def test_a_booking_whose_watch_is_not_pushed_is_answered(bus: NatsBus) -> None:
    counting = CountingBus(bus)
    store = store_over(counting, FakeClock())
    assert not store.bookings_watched
    assert await store.book(MINE) == ""
    assert counting.writes == {"answered": 1}
