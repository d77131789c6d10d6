"""A pod's claim written with no answer from the server (``KvWrites.transact``'s
``unanswered``): its outcome is the first version of the claim the placer's own claims watch
shows above the one it wrote over; shown none in time, or one of another store, or the
connection dropped meanwhile, the claim is read back as for a write whose answer was lost.

Against a real nats-server where the watch decides (landed, beaten), and against a bus held in
the test's hand where only a read back can (silent watch, dropped connection, a new store)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from services.placer.kvwrites import ECHO_SEEN_S
from services.placer.metrics import PlacerMetrics
from services.placer.rules.commit import ClaimVerdict, placed_claim, requeued_claim
from services.placer.rules.state import ClusterView
from services.placer.writes import Store
from shared import codec, subjects
from shared.messages.ledger import PodClaim
from shared.runtime.bus import KvEntry, KvWrite
from shared.runtime.edge import Edge
from shared.runtime.follow import follow
from shared.runtime.metrics import EdgeMetrics
from shared.runtime.nats import NatsBus
from tests.harness.clock import FakeClock
from tests.harness.wait import eventually, running
from tests.placer.test_translate import booking
from tests.placer.test_view import view_of

MINE = booking("pod-1", (0, 1, 1))
OTHER = msgspec.structs.replace(MINE, commit="other-commit", node="node-b")
KEY = subjects.claim_key(MINE.pod_uid)


Competitor = Callable[[NatsBus, str, int, str], Awaitable[None]]
"""Another writer's write that reaches the server just before an unanswered one: given the bus,
and the key, revision and guard the unanswered write is sent with."""


class CountingBus:
    """A real ``NatsBus`` that counts the writes made (and nodes read back) through it, by kind;
    ``ahead``: what another writer writes just before this bus's unanswered write."""

    def __init__(self, bus: NatsBus, *, ahead: Competitor | None = None) -> None:
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
            await self._ahead(self._bus, key, revision, guard)
        return await self._bus.kv_send(
            bucket, key, value, revision=revision, create=create, guard=guard
        )

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        self.writes["answered"] += 1
        return await self._bus.kv_create(bucket, key, value)

    async def kv_update(self, bucket: str, key: str, value: bytes, *, revision: int) -> int | None:
        self.writes["answered"] += 1
        return await self._bus.kv_update(bucket, key, value, revision=revision)

    async def kv_write_all(self, bucket: str, writes: Sequence[KvWrite]) -> tuple[int, ...] | None:
        self.writes["answered"] += 1
        return await self._bus.kv_write_all(bucket, writes)

    async def kv_list(self, bucket: str, keys: str) -> list[KvEntry]:
        self.writes["reads"] += 1
        return await self._bus.kv_list(bucket, keys)


def claimed_first(claim: PodClaim) -> Competitor:
    async def create(bus: NatsBus, key: str, revision: int, guard: str) -> None:
        assert await bus.kv_create(subjects.KV_CLAIMS, key, codec.encode(claim))

    return create


def store_over(bus: object, clock: FakeClock, view: ClusterView | None = None) -> Store:
    registry = CollectorRegistry()
    edge = Edge(bus=bus, metrics=EdgeMetrics.create(registry), clock=clock, service="t")  # type: ignore[arg-type]
    return Store(
        bus=bus,  # type: ignore[arg-type]
        edge=edge,
        view=view if view is not None else view_of(MINE.node, OTHER.node),
        clock=clock,
        metrics=PlacerMetrics.create(registry),
    )


def watching(
    bus: NatsBus, store: Store, clock: FakeClock, keys: str
) -> contextlib.AbstractAsyncContextManager[None]:
    """The placer's watch of the ledger bucket's ``keys`` (the claims', or the bookings'
    without node pools) as it runs it: each version to ``Store.watched``; loaded, the store
    sends those writes unanswered."""
    loaded = False

    async def on_entry(entry: KvEntry) -> None:
        value = None if entry.deleted else entry.value
        store.watched(subjects.KV_LEDGER, entry.key, value, entry.revision)

    async def on_loaded(_: set[str]) -> None:
        nonlocal loaded
        loaded = True
        if keys == subjects.CLAIM_KEYS:
            store.claims_watched = True
        else:
            store.bookings_watched = True

    watch = follow(
        bus, subjects.KV_LEDGER, on_entry=on_entry, on_loaded=on_loaded, clock=clock, keys=keys
    )
    return running(watch, until=lambda: loaded, what=f"{keys} watched")


async def stored_claim(bus: NatsBus) -> PodClaim:
    entry = await bus.kv_get(subjects.KV_CLAIMS, KEY)
    assert entry is not None
    return codec.decode(entry.value, PodClaim)


async def test_a_claim_goes_unanswered_and_lands_as_its_watch_shows(bus: NatsBus) -> None:
    counting = CountingBus(bus)
    clock = FakeClock()
    store = store_over(counting, clock)
    async with watching(bus, store, clock, subjects.CLAIM_KEYS):
        verdict, claim = await store.claim(MINE, None)
    assert verdict == "mine" and claim is not None and claim.booking == MINE
    assert counting.writes == {"unanswered": 1}
    assert (await stored_claim(bus)).booking == MINE


async def test_a_claim_another_commit_made_first_is_lost_to_it(bus: NatsBus) -> None:
    """The other commit's claim reaches the server just before this one: the server refuses
    this create and answers nobody; the watch shows the other claim, which is read back."""
    other = placed_claim(OTHER, None, now=1.0)
    counting = CountingBus(bus, ahead=claimed_first(other))
    clock = FakeClock()
    store = store_over(counting, clock)
    async with watching(bus, store, clock, subjects.CLAIM_KEYS):
        verdict, claim = await store.claim(MINE, None)
    assert verdict == "lost" and claim == other
    assert counting.writes == {"unanswered": 1}
    assert await stored_claim(bus) == other


@dataclass
class HandBus:
    """A claims bucket in the test's hand: an unanswered write lands or not as told, and no
    watch shows it; the test says when the connection drops and which store is in use."""

    lands: bool
    connected: bool = True
    store_epoch: str = "epoch-1"
    entries: dict[str, KvEntry] = field(default_factory=dict)
    writes: Counter[str] = field(default_factory=Counter)
    sent: list[bytes] = field(default_factory=list)
    revision: int = 10

    def _put(self, key: str, value: bytes) -> int:
        self.revision += 1
        self.entries[key] = KvEntry(key=key, value=value, revision=self.revision)
        return self.revision

    async def kv_get(self, bucket: str, key: str) -> KvEntry | None:
        self.writes["reads"] += 1
        return self.entries.get(key)

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
        self.sent.append(value)
        if self.lands:
            self._put(key, value)
        return True

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        self.writes["answered"] += 1
        return None if key in self.entries else self._put(key, value)


async def claiming(
    bus: HandBus, clock: FakeClock, view: ClusterView | None = None
) -> tuple[Store, asyncio.Task[tuple[ClaimVerdict, PodClaim | None]]]:
    store = store_over(bus, clock, view)
    store.claims_watched = True
    task = asyncio.create_task(store.claim(MINE, None))
    await eventually(lambda: bus.sent, what="the claim sent")
    return store, task


@pytest.mark.parametrize(
    ("lands", "ending", "writes"),
    [
        (True, "silence", {"unanswered": 1, "reads": 1}),
        (False, "silence", {"unanswered": 1, "reads": 1, "answered": 1}),
        (True, "connection dropped", {"unanswered": 1, "reads": 1}),
        (True, "version of a new store", {"unanswered": 1, "reads": 1}),
    ],
)
async def test_a_claim_its_watch_does_not_settle_is_read_back(
    lands: bool, ending: str, writes: dict[str, int]
) -> None:
    """Nothing the watch shows tells the outcome: the claim is read back, found when it
    landed, written again (answered) when it did not."""
    bus = HandBus(lands=lands)
    clock = FakeClock()
    store, task = await claiming(bus, clock)
    await asyncio.sleep(0.1)
    assert not task.done(), "waits for the watch"
    if ending == "silence":
        await clock.advance(ECHO_SEEN_S)
    elif ending == "connection dropped":  # noticed at once, whatever the clock says
        bus.connected = False
    else:  # the store was lost and a new one took the write nats-py sent again
        bus.store_epoch = "epoch-2"
        store.watched(subjects.KV_CLAIMS, KEY, bus.sent[0], bus.revision)
    verdict, claim = await asyncio.wait_for(task, 5)
    assert verdict == "mine" and claim is not None and claim.booking == MINE
    assert bus.writes == writes


async def test_a_version_at_or_below_the_one_written_over_settles_nothing() -> None:
    """A requeued claim at revision 5 is taken by this commit (a write over 5): version 5
    itself, shown late, tells nothing; the first version above it does."""
    requeued = requeued_claim(placed_claim(OTHER, None, now=1.0), reason="test", now=2.0)
    bus = HandBus(lands=True)
    bus.entries[KEY] = KvEntry(key=KEY, value=codec.encode(requeued), revision=5)
    view = view_of(MINE.node, OTHER.node)
    view.set_claim(MINE.pod_uid, requeued, 5)
    store, task = await claiming(bus, FakeClock(), view)
    store.watched(subjects.KV_CLAIMS, KEY, codec.encode(requeued), 5)
    await asyncio.sleep(0.1)
    assert not task.done()
    store.watched(subjects.KV_CLAIMS, KEY, bus.sent[0], bus.revision)
    verdict, claim = await asyncio.wait_for(task, 5)
    assert verdict == "mine" and claim is not None and claim.booking == MINE
    assert bus.writes == {"unanswered": 1}
    assert view.claim_revisions[MINE.pod_uid] == bus.revision


async def test_a_claim_whose_watch_has_not_loaded_is_answered() -> None:
    bus = HandBus(lands=True)
    store = store_over(bus, FakeClock())
    verdict, _ = await store.claim(MINE, None)
    assert verdict == "mine"
    assert bus.writes == {"answered": 1}
