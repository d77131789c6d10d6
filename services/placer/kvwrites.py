"""The placer's KV writes, each a compare-and-set (or create-only) with its outcome made certain:
the machinery :class:`~.store.Store` builds the protocol's writes on.

Every write goes through :meth:`KvWrites.transact`: read the entry (or take the cached value), let
a pure ``change`` function say what the entry should become (``None``: nothing to write, it
already is what it should be), write it at the revision read, and

- on a **conflict** (another writer got there first) read the entry again and ask ``change``
  again;
- on an **unknown outcome** (the write timed out, or the connection dropped while it was in
  flight: it may or may not have landed) read the entry back and ask ``change`` again, which
  finds its own write when it landed (and then has nothing to write) and writes again when it
  did not. Nothing is ever assumed from a write whose answer was lost.

A node's bookings are one key each (``subjects.booking_key``), and every write of one is
guarded at the latest revision among the node's keys (``KvWrite.guard``), so they change as one
entry would: :meth:`KvWrites.change_node` is the ``transact`` loop over a node's keys. Because
each write is guarded at the view's revision of the node, the view holds a node at a revision
only with every booking written up to it.

Every value read or written here is applied to the :class:`~.state.ClusterView` at once, so the
index reflects this replica's own writes without waiting for the watch to echo them. Writes for
one node (one tenant) are serialised inside a replica by a lock each; those waiting for the same
lock are written together (:meth:`KvWrites.write_together`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from services.placer.metrics import PlacerMetrics
from services.placer.rules.state import ClusterView
from shared import codec, subjects
from shared.clock import Clock
from shared.messages.assignments import AssignmentRecord
from shared.messages.ledger import Booking, NodeLedger, PodClaim, TenantCharge, TenantLedger
from shared.messages.pods import PodPending
from shared.runtime.bus import Bus, Delivery, KvWrite
from shared.runtime.echo import EchoWait
from shared.runtime.edge import Edge

log = logging.getLogger(__name__)

T = TypeVar("T")
_Batched = TypeVar("_Batched", Booking, TenantCharge)


def node_lock_key(node: str) -> str:
    return f"node/{node}"


def tenant_lock_key(tenant: str) -> str:
    return f"tenant/{tenant}"


ECHO_SEEN_S: Final = 2.0
"""How long an unanswered write (:meth:`KvWrites.transact`'s ``unanswered``) waits for its watch
to show a version above the one it wrote over, before it reads the entry back."""

MAX_ATTEMPTS = 16
"""Writes of one entry in a row that lose to another writer before the step gives up (each loss
means another writer made progress, so this is only reached under a storm)."""


class GaveUpError(Exception):
    """An entry kept changing under ``MAX_ATTEMPTS`` writes (or stayed unreadable)."""


class ConflictError(Exception):
    """A booking found its node's bookings changed under its decision (the caller decides
    anew)."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    """An entry's value (None: absent or deleted) at a revision (0: never written)."""

    value: T | None
    revision: int


@dataclass(frozen=True)
class Kind(Generic[T]):
    bucket: str
    family: str
    message: type[T]
    apply: Callable[[str, T | None, int], bool]


@dataclass
class Write:
    """One write of :meth:`Store.transact` on its way: its bytes, and the revision its watch
    delivery showed it landed at (0 until then); an unanswered one, its wait for the watch."""

    data: bytes
    landed: int = 0
    echo: EchoWait | None = None


class KvWrites:
    """KV reads and certain-outcome writes of ledger entries, pod claims, assignment records
    and tenants' charges (see the module docstring)."""

    def __init__(
        self,
        *,
        bus: Bus,
        edge: Edge,
        view: ClusterView,
        clock: Clock,
        metrics: PlacerMetrics,
        claims_with_bookings: bool = False,
    ) -> None:
        self._bus = bus
        self._claims_with_bookings = claims_with_bookings
        """Whether ``Store.book`` also claims, in the booking's batch (see there)."""
        self._edge = edge
        self._view = view
        self._clock = clock
        self._metrics = metrics
        self._locks: dict[str, asyncio.Lock] = {}
        self._queued: dict[str, list[tuple[Any, asyncio.Future[str]]]] = {}
        """Bookings per node (charges per tenant) waiting for its lock (written together)."""
        self._seen: dict[str, frozenset[str]] = {}
        """Commit id -> the bookings on its node when it was decided (while it is booked)."""
        self._requests: dict[str, PodPending | None] = {}
        """Commit id -> its pod as pending, for its claim (while it is booked)."""
        self._writing: dict[tuple[str, str], Write] = {}
        """(bucket, key) -> what this replica is writing there, until the answer comes."""
        self.claims_watched = False
        """Whether the claims' watch has loaded, so that it shows :meth:`watched` every version
        of a claim: only then does a claim go unanswered (``transact``'s ``unanswered``)."""
        self.bookings_watched = False
        """Likewise for the bookings' watch and a booking (``Store.book``)."""
        self._booking_echoes: dict[str, EchoWait] = {}
        """Node -> the wait of this replica's unanswered booking there (:meth:`send_booking`)."""
        self.bookings = Kind(subjects.KV_LEDGER, "ledger", Booking, self._apply_booking)
        self.claims = Kind(subjects.KV_CLAIMS, "claims", PodClaim, self._apply_claim)
        self.records = Kind(
            subjects.KV_ASSIGNMENTS, "assignments", AssignmentRecord, view.set_record
        )
        self.tenants = Kind(subjects.KV_TENANTS, "tenants", TenantLedger, self._apply_tenant)

    # --- reading -------------------------------------------------------------------------------

    def _apply_booking(self, key: str, booking: Booking | None, revision: int) -> bool:
        node, pod_uid = subjects.booking_of_key(key)
        return self._view.set_booking(node, pod_uid, booking, revision)

    def _apply_claim(self, key: str, claim: PodClaim | None, revision: int) -> bool:
        return self._view.set_claim(subjects.claim_uid(key), claim, revision)

    def _apply_tenant(self, key: str, ledger: TenantLedger | None, revision: int) -> bool:
        return ledger is not None and self._view.set_tenant_ledger(ledger, revision)

    async def decode(self, kind: Kind[T], key: str, data: bytes) -> T | None:
        """Decode a KV value at the edge (a value that does not decode is dead-lettered)."""
        delivery = Delivery(subject=f"$KV.{kind.bucket}.{key}", data=data)
        return await self._edge.accept(delivery, kind.message, family=kind.family)

    async def read(self, kind: Kind[T], key: str) -> Entry[T]:
        """The entry as the server has it now (and applied to the view)."""
        entry = await self._bus.kv_get(kind.bucket, key)
        if entry is None:
            return Entry(None, 0)
        value = await self.decode(kind, key, entry.value)
        if value is None:
            raise GaveUpError(f"{kind.bucket} entry {key} does not decode; see the dead letter")
        kind.apply(key, value, entry.revision)
        return Entry(value, entry.revision)

    async def read_node(self, node: str) -> Entry[NodeLedger]:
        """``node``'s bookings as the server has them now (and applied to the view), at the
        latest revision among its booking keys."""
        for entry in await self._bus.kv_list(subjects.KV_LEDGER, subjects.node_bookings(node)):
            booking = None
            if not entry.deleted:
                booking = await self.decode(self.bookings, entry.key, entry.value)
                if booking is None:
                    raise GaveUpError(f"booking {entry.key} does not decode; see the dead letter")
            self.bookings.apply(entry.key, booking, entry.revision)
        return self._cached_ledger(node)

    # --- writing -------------------------------------------------------------------------------

    def echoed(self, bucket: str, key: str, value: bytes, revision: int) -> bool:
        """Whether a watch delivery of ``key`` is this replica's write still waiting for its
        answer: most come back before the answer does, and decoding them only repeats what
        :meth:`transact` applies when the answer comes (or, whatever ends the write, at
        ``revision`` then)."""
        write = self._writing.get((bucket, key))
        if write is None or write.data != value:
            return False
        write.landed = revision
        return True

    def watched(self, bucket: str, key: str, value: bytes | None, revision: int) -> None:
        """The watch shows ``key`` at ``revision`` (``value`` None: deleted): the outcome of this
        replica's unanswered write there, if one waits (``shared.runtime.echo``)."""
        write = self._writing.get((bucket, key))
        if write is not None and write.echo is not None:
            write.echo.settle(revision, value, epoch=self._bus.store_epoch)
        booked = subjects.booked_at(key) if bucket == subjects.KV_LEDGER else None
        echo = None if booked is None else self._booking_echoes.get(booked[0])
        if echo is not None:  # any booking of the node: the first above the guard is the outcome
            echo.settle(revision, value if key == echo.key else None, epoch=self._bus.store_epoch)

    async def transact(
        self,
        kind: Kind[T],
        key: str,
        change: Callable[[T | None], T | None],
        *,
        start: Entry[T] | None = None,
        unanswered: bool = False,
    ) -> Entry[T]:
        """Bring entry ``key`` to what ``change`` says (see the module docstring).

        ``start``: the cached entry to try first (saves a read on the fast path). Raises
        :class:`GaveUpError` when it kept changing. ``unanswered``: the first write goes with no
        answer from the server where a watch shows this replica the key (a claim, with
        ``claims_watched``): its outcome is the first version the watch shows above the one it
        wrote over (:meth:`watched`), one message fewer through the server than an answered
        write; shown none in time, the entry is read back as for a lost answer.
        """
        current = start if start is not None else await self.read(kind, key)
        for attempt in range(MAX_ATTEMPTS):
            wanted = change(current.value)
            if wanted is None:
                return current
            data = codec.encode(wanted)
            slot = (kind.bucket, key)
            write = self._writing[slot] = Write(data)
            try:
                if unanswered and attempt == 0 and self.claims_watched:
                    revision = await self._send(kind.bucket, key, current, write)
                elif current.revision == 0 or current.value is None:
                    revision = await self._bus.kv_create(kind.bucket, key, data)
                else:
                    revision = await self._bus.kv_update(
                        kind.bucket, key, data, revision=current.revision
                    )
            except Exception as error:
                # The write may have landed or not: only a read can tell.
                self._metrics.unknown_outcomes.labels(entry=kind.family).inc()
                log.warning(
                    "KV write outcome unknown; reading it back",
                    extra={"bucket": kind.bucket, "key": key, "error": type(error).__name__},
                )
                current = await self.read(kind, key)
                continue
            finally:
                if self._writing.get(slot) is write:
                    del self._writing[slot]
                if write.landed:  # its watch delivery came first and was left to us
                    kind.apply(key, wanted, write.landed)
            if revision is None:
                self._metrics.conflicts.labels(entry=kind.family).inc()
                current = await self.read(kind, key)
                continue
            kind.apply(key, wanted, revision)
            return Entry(wanted, revision)
        raise GaveUpError(f"{kind.bucket} entry {key} kept changing under {MAX_ATTEMPTS} writes")

    async def _send(self, bucket: str, key: str, current: Entry[Any], write: Write) -> int | None:
        """Send ``write`` over ``current`` unanswered (``Bus.kv_send``) and wait up to
        :data:`ECHO_SEEN_S` of this replica's clock for the watch to show what became of it
        (``EchoWait.send``, which raises ``OutcomeUnknownError`` when it cannot tell); None
        also when it could not land (``current`` is of a store that was lost)."""
        echo = write.echo = EchoWait(
            key, above=current.revision, value=write.data, epoch=self._bus.store_epoch
        )
        return await echo.send(
            self._bus,
            bucket,
            seen_s=ECHO_SEEN_S,
            create=current.value is None,
            sleep=self._clock.sleep,
        )

    async def send_booking(self, node: str, write: KvWrite) -> int | None:
        """Send the guarded booking ``write`` unanswered (``Bus.kv_send``): the first version of
        any of ``node``'s bookings the watch shows above the guard's revision is this booking
        (landed) or the one that beat it; as :meth:`_send` otherwise."""
        echo = self._booking_echoes[node] = EchoWait(
            write.key, above=write.revision, value=write.value, epoch=self._bus.store_epoch
        )
        try:
            return await echo.send(
                self._bus,
                subjects.KV_LEDGER,
                seen_s=ECHO_SEEN_S,
                guard=write.guard,
                sleep=self._clock.sleep,
            )
        finally:
            if self._booking_echoes.get(node) is echo:
                del self._booking_echoes[node]

    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def node_lock(self, node: str) -> asyncio.Lock:
        return self._lock(node_lock_key(node))

    def _cached_ledger(self, node: str) -> Entry[NodeLedger]:
        ledger, revision = self._view.ledger(node)
        return Entry(ledger, revision)

    async def write_together(
        self,
        lock: str,
        item: _Batched,
        write: Callable[[list[_Batched]], Awaitable[dict[str, str]]],
    ) -> str:
        """Write ``item`` with every other one waiting for the same ``lock``, by one ``write``
        that returns why items (by commit id) were refused; "" for ``item`` when it was not."""
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._queued.setdefault(lock, []).append((item, waiter))
        try:
            async with self._lock(lock):
                if not waiter.done():
                    batch = [(b, w) for b, w in self._queued.pop(lock, []) if not w.done()]
                    try:
                        refused = await write([b for b, _ in batch])
                    except Exception as error:
                        for _, pending in batch:
                            if not pending.done():
                                pending.set_exception(error)
                    else:
                        for done, pending in batch:
                            if not pending.done():
                                pending.set_result(refused.get(done.commit, ""))
        except BaseException:
            waiter.cancel()  # stopped while waiting: not written (or already decided)
            raise
        return waiter.result()

    async def change_node(
        self,
        node: str,
        change: Callable[[NodeLedger | None], NodeLedger | None],
        *,
        start: Entry[NodeLedger] | None = None,
    ) -> None:
        """Bring ``node``'s bookings to what ``change`` says, as :meth:`transact` brings an
        entry: each booking added, changed or deleted is written guarded at the node's revision
        (the view then holds the node whole at the revision it landed at); a write that lost, or
        whose answer was lost, reads the node again and asks ``change`` again."""
        current = start if start is not None else await self.read_node(node)
        for _ in range(MAX_ATTEMPTS):
            wanted = change(current.value)
            if wanted is None:
                return
            if not await self._write_difference(node, current, wanted):
                current = await self.read_node(node)
                continue
            current = self._cached_ledger(node)
        raise GaveUpError(f"node {node}'s bookings kept changing under {MAX_ATTEMPTS} writes")

    async def _write_difference(
        self, node: str, current: Entry[NodeLedger], wanted: NodeLedger
    ) -> bool:
        """Write the first difference between ``current`` and ``wanted``; whether it landed
        (False: it lost, or its answer was lost)."""
        held = {b.pod_uid: b for b in (current.value.bookings if current.value else ())}
        kept = {b.pod_uid for b in wanted.bookings}
        changed = next((b for b in wanted.bookings if held.get(b.pod_uid) != b), None)
        gone = next((uid for uid in held if uid not in kept), None)
        uid = changed.pod_uid if changed is not None else gone
        if uid is None:
            return True
        key = subjects.booking_key(node, uid)
        try:
            if changed is not None:
                data = codec.encode(changed)
                guarded = KvWrite(key, data, current.revision, guard=subjects.node_bookings(node))
                revisions = await self._bus.kv_write_all(subjects.KV_LEDGER, [guarded])
                if revisions is not None:
                    self.bookings.apply(key, changed, revisions[0])
                    return True
            else:
                # Guarded like a booking, not by the key alone: the view applies the marker's
                # revision as the node's, so nothing else may have landed on the node between.
                marker = await self._bus.kv_delete_if(
                    subjects.KV_LEDGER,
                    key,
                    revision=current.revision,
                    guard=subjects.node_bookings(node),
                )
                if marker is not None:
                    self.bookings.apply(key, None, marker)
                    return True
        except Exception as error:
            # The write may have landed or not: only a read can tell.
            self._metrics.unknown_outcomes.labels(entry="ledger").inc()
            log.warning(
                "KV booking outcome unknown; reading it back",
                extra={"key": key, "error": type(error).__name__},
            )
            return False
        self._metrics.conflicts.labels(entry="ledger").inc()
        return False

    async def delete_if(self, kind: Kind[T], key: str, revision: int) -> bool:
        """Delete ``key`` only if still at ``revision`` (purging after retention)."""
        return await self._bus.kv_delete_if(kind.bucket, key, revision=revision) is not None
