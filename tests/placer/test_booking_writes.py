"""A booking written with no answer from the server (``KvWrites.send_booking``), against a real
nats-server: guarded at its node's revision, its outcome is the first version of any of the
node's bookings the placer's bookings watch shows above that revision. Only where that watch is
pushed (``Watches._bookings_loaded``); the wait's ends it shares with a claim's (silence, a
dropped connection, a new store) are ``test_claim_writes``'."""

from __future__ import annotations

import msgspec
import pytest

from services.placer.writes import ConflictError
from shared import codec, subjects
from shared.messages.ledger import Booking
from shared.runtime.bus import KvWrite
from shared.runtime.nats import NatsBus
from tests.harness.clock import FakeClock
from tests.placer.test_claim_writes import Competitor, CountingBus, store_over, watching
from tests.placer.test_translate import booking
from tests.placer.test_view import view_of

MINE = booking("pod-1", (0, 1, 1))
BESIDE = msgspec.structs.replace(booking("pod-2", (1, 1, 1)), commit="beside")
"""Another pod's booking on MINE's node, on the other GPU."""
ELSEWHERE = msgspec.structs.replace(BESIDE, node="node-b")


def booked_first(booking: Booking) -> Competitor:
    """Another replica's booking, guarded at the same revision where it is on the same node."""

    async def book(bus: NatsBus, key: str, revision: int, guard: str) -> None:
        own_guard = subjects.node_bookings(booking.node)
        written = KvWrite(
            subjects.booking_key(booking.node, booking.pod_uid),
            codec.encode(booking),
            revision if own_guard == guard else 0,
            guard=own_guard,
        )
        assert await bus.kv_write_all(subjects.KV_LEDGER, [written])

    return book


async def booked(bus: NatsBus, node: str) -> set[str]:
    """The pods booked on ``node`` as the server has them."""
    entries = await bus.kv_list(subjects.KV_LEDGER, subjects.node_bookings(node))
    return {codec.decode(e.value, Booking).pod_uid for e in entries if not e.deleted}


async def test_a_booking_goes_unanswered_and_lands_as_its_watch_shows(bus: NatsBus) -> None:
    counting = CountingBus(bus)
    clock = FakeClock()
    view = view_of(MINE.node, ELSEWHERE.node)
    store = store_over(counting, clock, view)
    async with watching(bus, store, clock, subjects.BOOKING_KEYS):
        assert await store.book(MINE) == ""
    assert counting.writes == {"unanswered": 1}
    assert await booked(bus, MINE.node) == {MINE.pod_uid}
    assert view.booking_revision(MINE.node, MINE.pod_uid) > 0, "the view holds it"


async def test_another_node_s_booking_first_settles_nothing(bus: NatsBus) -> None:
    """A booking on another node lands just before: not one of this node's, so the first
    version above the guard the watch shows of this node is still this booking's (a booking
    taken for lost would be read back)."""
    counting = CountingBus(bus, ahead=booked_first(ELSEWHERE))
    clock = FakeClock()
    store = store_over(counting, clock)
    async with watching(bus, store, clock, subjects.BOOKING_KEYS):
        assert await store.book(MINE) == ""
    assert counting.writes == {"unanswered": 1}
    assert await booked(bus, MINE.node) == {MINE.pod_uid}


async def test_a_booking_beaten_by_another_on_its_node_is_lost_to_it(bus: NatsBus) -> None:
    """Another replica's booking on the node lands first: the guard refuses this one and the
    server answers nobody; the watch shows the other booking above the guard, the node is read
    back, and the decision, made on bookings that have changed, is made anew."""
    counting = CountingBus(bus, ahead=booked_first(BESIDE))
    clock = FakeClock()
    store = store_over(counting, clock)
    async with watching(bus, store, clock, subjects.BOOKING_KEYS):
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
