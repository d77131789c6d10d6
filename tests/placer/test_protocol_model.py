"""The commit protocol under every interleaving hypothesis finds: a state machine over replicas.

Three placer replicas run the *real* protocol code (``Store`` and ``CommitProtocol``, deciding with
the real core) against one in-memory KV whose every operation waits at a gate. The machine picks
which waiting operation runs next and how it ends: it lands, it lands but the answer is lost (a
timeout: the writer must read back), or it is lost on the way. Each replica's view of the KV
follows by watch events the machine delivers late and in bulk, so decisions are taken on stale
views as in a real cluster. A claim written after its booking (not in its batch), and that
booking, go with no answer: the replica learns the outcome when the machine delivers its watch
events, or reads it back once 2 s of the machine's clock passed with none. Replicas decide pods
(two may decide the same pod at once), delete them, see bindings fail, time reservations out,
run reconciliation, and are killed mid-step and restarted from KV.

The binder takes its work from the pods' claims as it mirrors them (late, like the replicas'
views): it binds a placed claim's booking by writing its record ``bound`` with the rules the real
binder uses (``shared.commits.record_action``, create-only or compare-and-set at the revision its
mirror holds), at any moment; it also withdraws bound records of pods that ended, and a device
plugin (or the binder settling) moves bound records to ``allocated``.

Two pods belong to tenant ``team``, whose quota is one GPU share: every replica checks it on its
own (stale) view when deciding, and charges the tenant's usage entry by compare-and-set before
booking, as the service does.

After every step: no GPU is over-committed in the ledger or by live records (memory, cores,
logical slots, exclusivity), no pod has two live records, every live record is booked, and no
tenant is over its quota: its charges add up to no more than the quota, every live record of its
pods is charged, so its live records hold no more than the quota. When the machine ends,
everything in flight is let through (the watches catching up and time passing until nothing
is), pod messages never acked are delivered again, every replica
reconciles, the binder's mirror catches up and it binds what is left, and then every booking is
claimed and recorded, every placed claim booked and recorded, and every charge is a live
record's: nothing lost, nothing left half done.

A commit books and claims in one atomic batch, as on a replicated store;
:class:`SerialProtocolMachine` is the same machine with the claim written after the booking, as
on a single NATS server.

:class:`PooledProtocolMachine` is the same machine with the nodes in node pools
(``--pools``): each replica decides on the nodes of the pools it holds first and on every node
when none fits, and the machine moves the pools among the replicas at any moment, including
states no lease allows for long (two replicas holding one pool: a lease taken over from a holder
that was only slow; none holding it), with the same invariants.

Each guard the protocol relies on has a broken machine without it, driven through the race that
needs it, whose invariants must catch it: :class:`BrokenQuotaMachine` (the tenant's charge left
out), :class:`UnguardedMachine` (bookings written without the node's guard),
:class:`StaleBindMachine` (the binder writing its record over whatever is there, trusting the
revision its mirror last saw) and :class:`ClaimlessBindMachine` (the binder binding bookings no
placed claim names).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)
from prometheus_client import CollectorRegistry

from services.binder.rules.plan import stranded
from services.placer.core.groups import TenancyConfig, TenantQuota
from services.placer.core.model import Decision
from services.placer.core.profiles import build_profile
from services.placer.kvwrites import ECHO_SEEN_S
from services.placer.metrics import PlacerMetrics
from services.placer.protocol import CommitProtocol
from services.placer.rules import decider, translate
from services.placer.rules.state import ClusterView
from services.placer.writes import ConflictError, Store
from shared import codec, commits, subjects
from shared.messages.assignments import AssignmentRecord, released, settled
from shared.messages.ledger import Booking, NodeLedger, PodClaim, TenantLedger
from shared.messages.pods import PodPending
from shared.runtime.bus import (
    Handler,
    KvEntry,
    KvWrite,
    Publication,
    PullConsumer,
    Subscription,
)
from shared.runtime.edge import Edge
from shared.runtime.metrics import EdgeMetrics
from tests.harness.clock import FakeClock
from tests.placer import wire

NODES = {"a": 2, "b": 2}
SLOTS = 3
"""Logical devices per node (fewer than two GPUs could take shares, so slots bind too)."""
PODS: dict[str, PodPending] = {
    "p0": wire.pending("p0", memory_mib=9000, cores=40),
    "p1": wire.pending("p1", memory_mib=9000, cores=40),
    "p2": wire.pending("p2", shares=1, memory_mib=None, cores=None),  # a whole GPU
    "p3": wire.pending("p3", memory_mib=4000, cores=70),
    "p4": wire.pending("p4", shares=2, memory_mib=6000, cores=30),
    "q0": wire.pending("q0", memory_mib=4000, cores=20, namespace="team"),
    "q1": wire.pending("q1", memory_mib=4000, cores=20, namespace="team"),
}
QUOTA_GPUS = 1
QUOTAS: dict[str, tuple[int | None, int | None]] = {"team": (QUOTA_GPUS, None)}
TENANCY = TenancyConfig(quotas=(TenantQuota(tenant="team", gpus=QUOTA_GPUS),))
INVENTORIES = {name: wire.inventory(name, gpus) for name, gpus in NODES.items()}
REPLICAS = 3

pytestmark = pytest.mark.timeout(600)
"""A search that passes takes seconds; one that finds a failure shrinks it for minutes. Cut short
by the suite's 60 s, hypothesis reported the cut itself as a failure that replays differently
(``FlakyStrategyDefinition``) and never showed the example."""

Fate = Literal["land", "land-lost", "lost"]


# --- the gated KV ----------------------------------------------------------------------------


@dataclass
class _Op:
    replica: int
    what: str
    done: asyncio.Future[Fate]


class Kv:
    """One in-memory JetStream: KV buckets with revisions and a de-duplicating publish."""

    def __init__(self, *, guards: bool = True) -> None:
        self.guards = guards
        """Whether a guarded write checks its guard (:class:`UnguardedMachine`: it does not)."""
        self.values: dict[str, dict[str, tuple[bytes | None, int]]] = {}
        self.revision = 0
        self.published: list[tuple[str, bytes]] = []
        self._msg_ids: set[str] = set()
        self.listeners: list[Callable[[str, str, bytes | None, int], None]] = []

    def get(self, bucket: str, key: str) -> KvEntry | None:
        value, revision = self.values.get(bucket, {}).get(key, (None, 0))
        return None if value is None else KvEntry(key=key, value=value, revision=revision)

    def _write(self, bucket: str, key: str, value: bytes | None) -> int:
        self.revision += 1
        self.values.setdefault(bucket, {})[key] = (value, self.revision)
        for listener in self.listeners:
            listener(bucket, key, value, self.revision)
        return self.revision

    def create(self, bucket: str, key: str, value: bytes) -> int | None:
        return None if self.get(bucket, key) is not None else self._write(bucket, key, value)

    def update(self, bucket: str, key: str, value: bytes, revision: int) -> int | None:
        current = self.values.get(bucket, {}).get(key, (None, 0))[1]
        return self._write(bucket, key, value) if current == revision else None

    def write_all(self, bucket: str, writes: Sequence[KvWrite]) -> tuple[int, ...] | None:
        for write in writes:
            if write.guard and not self.guards:
                continue  # written whatever the node's bookings hold now
            if write.guard:  # the latest of every key it matches, deleted ones included
                current = max((rev for _, rev in self._matching(bucket, write.guard)), default=0)
                if current != write.revision:
                    return None
                continue
            value, current = self.values.get(bucket, {}).get(write.key, (None, 0))
            if (value is not None or write.revision) and current != write.revision:
                return None
        return tuple(self._write(bucket, write.key, write.value) for write in writes)

    def _matching(self, bucket: str, keys: str) -> list[tuple[str, int]]:
        """(key, revision) of every key the NATS filter ``keys`` matches (``*``: one token)."""
        wanted = keys.split(".")
        return [
            (key, rev)
            for key, (_, rev) in self.values.get(bucket, {}).items()
            if len(key.split(".")) == len(wanted)
            and all(w in ("*", t) for w, t in zip(wanted, key.split("."), strict=True))
        ]

    def list(self, bucket: str, keys: str) -> list[KvEntry]:
        held = self.values.get(bucket, {})
        return [
            KvEntry(key, held[key][0] or b"", rev, deleted=held[key][0] is None)
            for key, rev in self._matching(bucket, keys)
        ]

    def delete_if(self, bucket: str, key: str, revision: int, guard: str = "") -> int | None:
        if guard and not self.guards:
            return self._write(bucket, key, None)
        if guard:
            current = max((rev for _, rev in self._matching(bucket, guard)), default=0)
        else:
            current = self.values.get(bucket, {}).get(key, (None, 0))[1]
        if current != revision:
            return None
        return self._write(bucket, key, None)

    def publish(self, subject: str, data: bytes, msg_id: str | None) -> int:
        if msg_id is None or msg_id not in self._msg_ids:
            self.published.append((subject, data))
        if msg_id is not None:
            self._msg_ids.add(msg_id)
        return len(self.published)

    def put(self, bucket: str, key: str, value: bytes) -> int:
        return self._write(bucket, key, value)

    def entries(self, bucket: str) -> dict[str, tuple[bytes, int]]:
        return {
            key: (value, rev)
            for key, (value, rev) in self.values.get(bucket, {}).items()
            if value is not None
        }


class Gates:
    """Every KV operation of a replica waits here until the machine lets it through."""

    def __init__(self) -> None:
        self.pending: list[_Op] = []
        self.open = False
        """Settling at the end: every operation lands at once."""

    async def wait(self, replica: int, what: str) -> Fate:
        if self.open:
            return "land"
        op = _Op(replica, what, asyncio.get_running_loop().create_future())
        self.pending.append(op)
        return await op.done


class GatedBus:
    """The Bus port over :class:`Kv`, each operation gated (reads always land)."""

    def __init__(self, kv: Kv, gates: Gates, replica: int) -> None:
        self.kv = kv
        self.gates = gates
        self.replica = replica

    @property
    def connected(self) -> bool:
        return True

    async def _through(self, what: str, apply: Callable[[], Any], *, read: bool = False) -> Any:
        fate = await self.gates.wait(self.replica, what)
        if read or fate == "land":
            return apply()
        if fate == "land-lost":
            apply()
        raise TimeoutError(f"{what}: no answer")

    async def kv_get(self, bucket: str, key: str) -> KvEntry | None:
        entry: KvEntry | None = await self._through(
            f"get {bucket}/{key}", lambda: self.kv.get(bucket, key), read=True
        )
        return entry

    async def kv_create(self, bucket: str, key: str, value: bytes) -> int | None:
        return await self._through(  # type: ignore[no-any-return]
            f"create {bucket}/{key}", lambda: self.kv.create(bucket, key, value)
        )

    async def kv_update(self, bucket: str, key: str, value: bytes, *, revision: int) -> int | None:
        return await self._through(  # type: ignore[no-any-return]
            f"update {bucket}/{key}@{revision}",
            lambda: self.kv.update(bucket, key, value, revision),
        )

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
        """Unanswered: it lands (at ``revision`` only) or is lost on the way, and says nothing;
        the writer learns which from its watch (:meth:`ProtocolMachine.watch_catches_up`)."""
        fate = await self.gates.wait(self.replica, f"send {bucket}/{key}@{revision}")
        if fate != "lost" and guard:
            self.kv.write_all(bucket, [KvWrite(key, value, revision, guard=guard)])
        elif fate != "lost":
            self.kv.update(bucket, key, value, revision)
        return True

    async def kv_write_all(self, bucket: str, writes: Sequence[KvWrite]) -> tuple[int, ...] | None:
        keys = ",".join(write.key for write in writes)
        return await self._through(  # type: ignore[no-any-return]
            f"batch {bucket}/{keys}", lambda: self.kv.write_all(bucket, writes)
        )

    async def kv_delete_if(
        self, bucket: str, key: str, *, revision: int, guard: str = ""
    ) -> int | None:
        return await self._through(  # type: ignore[no-any-return]
            f"delete {bucket}/{key}", lambda: self.kv.delete_if(bucket, key, revision, guard)
        )

    async def kv_list(self, bucket: str, keys: str) -> list[KvEntry]:
        entries: list[KvEntry] = await self._through(
            f"list {bucket}/{keys}", lambda: self.kv.list(bucket, keys), read=True
        )
        return entries

    async def js_publish(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        return await self._through(  # type: ignore[no-any-return]
            f"publish {subject}", lambda: self.kv.publish(subject, data, msg_id)
        )

    # Not used by the protocol's steps.
    async def js_publish_all(self, stream: str, publications: Sequence[Publication]) -> None:
        raise NotImplementedError

    async def publish(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> None:
        return None

    async def subscribe(self, subject: str, handler: Handler, *, queue: str = "") -> Subscription:
        raise NotImplementedError

    async def pull_consumer(
        self,
        *,
        stream: str,
        durable: str,
        subject: str,
        ack_wait: float = 30.0,
        max_deliver: int = -1,
        max_ack_pending: int | None = None,
    ) -> PullConsumer:
        raise NotImplementedError

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        raise NotImplementedError

    async def kv_delete(self, bucket: str, key: str) -> None:
        raise NotImplementedError

    async def kv_keys(self, bucket: str) -> list[str]:
        raise NotImplementedError

    def kv_watch(
        self, bucket: str, keys: str = ">", *, batch_s: float = 0.0
    ) -> AsyncGenerator[KvEntry | None, None]:
        raise NotImplementedError

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        raise NotImplementedError

    @property
    def store_epoch(self) -> str:
        return ""

    async def drain(self) -> None:
        return None


# --- replicas --------------------------------------------------------------------------------


def apply_entry(
    view: ClusterView, bucket: str, key: str, data: bytes | None, revision: int
) -> None:
    """What the service's KV watch handlers do with one entry."""
    if bucket == subjects.KV_CLAIMS and key != subjects.claim_uid(key):
        uid = subjects.claim_uid(key)
        view.set_claim(uid, codec.decode(data, PodClaim) if data is not None else None, revision)
    elif bucket == subjects.KV_LEDGER:
        booking = codec.decode(data, Booking) if data is not None else None
        view.set_booking(*subjects.booking_of_key(key), booking, revision)
    elif bucket == subjects.KV_ASSIGNMENTS:
        record = codec.decode(data, AssignmentRecord) if data is not None else None
        view.set_record(key, record, revision)
    elif bucket == subjects.KV_TENANTS and data is not None:
        view.set_tenant_ledger(codec.decode(data, TenantLedger), revision)


@dataclass
class Replica:
    number: int
    view: ClusterView
    store: Store
    protocol: CommitProtocol
    inbox: list[tuple[str, str, bytes | None, int]] = field(default_factory=list)
    tasks: dict[asyncio.Task[Any], None] = field(default_factory=dict)
    """In the order spawned (a set's order follows the tasks' addresses, so a kill cancelled
    them in an order that changed with whatever else the process had imported)."""


PROFILE = build_profile("binpack")


# --- the machine -----------------------------------------------------------------------------


Entries = dict[str, tuple[bytes, int]]


class ProtocolMachine(RuleBasedStateMachine):
    charges = True
    """Whether a commit charges its tenant's quota (:class:`BrokenQuotaMachine` does not)."""
    guards = True
    """Whether a booking's guard is checked (:class:`UnguardedMachine`: it is not)."""
    binder_writes_at_revision = True
    """The binder writes a record create-only or at the revision its mirror holds
    (:class:`StaleBindMachine`: over whatever is there)."""
    binder_binds_claims = True
    """The binder binds the booking a placed claim names (:class:`ClaimlessBindMachine`: every
    booking it sees)."""
    pools = 1
    """Node pools (:class:`PooledProtocolMachine` has 3: node ``a`` in pool 0, ``b`` in 2)."""
    claims_with_bookings = True
    """Each booking's batch claims its pod too (a replicated store); :class:`SerialProtocolMachine`
    claims by the next write, as on a single server."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.kv = Kv(guards=self.guards)
        self.gates = Gates()
        self.clock = FakeClock()
        self.commits = 0
        """Commit ids count up: a run depends on the examples drawn, never on the global
        random state earlier tests left (which made the broken-quota check order-dependent)."""
        self.replicas = [self._replica(n) for n in range(REPLICAS)]
        self.kv.listeners.append(self._fan_out)
        self.unacked: Counter[str] = Counter()
        """Pod messages taken for a commit and not acked (the commit failed, or its replica was
        killed): JetStream delivers them again (at the end, :meth:`teardown` does)."""
        self.mirror: dict[str, Entries] = {}
        """The binder's mirror: each bucket as its watch last delivered it
        (:meth:`binder_watch`)."""

    def _next_commit(self) -> int:
        self.commits += 1
        return self.commits

    def _fan_out(self, bucket: str, key: str, data: bytes | None, revision: int) -> None:
        for replica in self.replicas:
            replica.inbox.append((bucket, key, data, revision))

    def _replica(self, number: int) -> Replica:
        view = ClusterView(
            inventory_stale_s=1e9, task_mix_window=100, tenancy=TENANCY, pools=self.pools
        )
        for name, inventory in INVENTORIES.items():
            view.set_inventory(
                msgspec.structs.replace(inventory, observed_at=self.clock.now()),
                now=self.clock.now(),
            )
            view.set_facts(wire.facts(name, slots=SLOTS, at=self.clock.now()))
        buckets = (
            subjects.KV_LEDGER,  # the claims too
            subjects.KV_ASSIGNMENTS,
            subjects.KV_TENANTS,
        )
        for bucket in buckets:
            for key, (data, revision) in self.kv.entries(bucket).items():
                apply_entry(view, bucket, key, data, revision)
        view.finish_load(self.clock.now())
        registry = CollectorRegistry()
        bus = GatedBus(self.kv, self.gates, number)
        metrics = PlacerMetrics.create(registry)
        edge = Edge(
            bus=bus, metrics=EdgeMetrics.create(registry), clock=self.clock, service="model"
        )
        store = Store(
            bus=bus,
            edge=edge,
            view=view,
            clock=self.clock,
            metrics=metrics,
            claims_with_bookings=self.claims_with_bookings,
        )
        # Its watches are the machine's delivery of its inbox.
        store.claims_watched = store.bookings_watched = True
        protocol = CommitProtocol(
            store=store, bus=bus, view=view, clock=self.clock, metrics=metrics
        )
        return Replica(number=number, view=view, store=store, protocol=protocol)

    def _run(self, work: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(work)

    async def _settle(self) -> None:
        for _ in range(40):
            await asyncio.sleep(0)

    def _spawn(self, replica: Replica, work: Coroutine[Any, Any, Any]) -> None:
        async def guarded() -> None:
            with contextlib.suppress(Exception):  # a failed step is retried by a later rule
                await work

        async def start() -> None:
            task = asyncio.get_running_loop().create_task(guarded())
            replica.tasks[task] = None
            task.add_done_callback(lambda done: replica.tasks.pop(done, None))
            await self._settle()

        self._run(start())

    # --- rules ---------------------------------------------------------------------------------

    @rule(replica=st.integers(0, REPLICAS - 1), pod=st.sampled_from(sorted(PODS)))
    def decide(self, replica: int, pod: str) -> None:
        """A replica takes a pod message: decide on its view, book, claim."""
        r = self.replicas[replica]
        request = translate.pod_request(PODS[pod])
        claim = r.view.claim(pod)
        if claim is not None and claim.state in ("placed", "deleted"):
            if claim.state == "placed" and claim.booking is not None:
                self._spawn(r, r.protocol.keep_booked(claim.booking))
            return
        outcome = decider.decide(r.view, PROFILE, request, now=self.clock.now())
        if not isinstance(outcome, Decision):
            return
        booking = translate.booking_of(
            outcome.reservation,
            PODS[pod],
            tenant=r.view.tenancy.tenant_of(request).tenant,
            commit=f"r{replica}.{self._next_commit():08x}",
            decided_at=self.clock.now(),
            placer_id=f"r{replica}",
        )
        r.view.add_tentative(booking)
        self.unacked[pod] += 1

        async def commit() -> None:
            try:
                if self.charges:
                    refused, _ = await r.protocol.book(booking, request=PODS[pod])
                else:  # the commit without the tenant's charge: the node's booking only
                    try:
                        refused = "node" if await r.store.book(booking, request=PODS[pod]) else ""
                    except ConflictError:
                        refused = "node"
                if not refused:
                    await r.protocol.finish(booking, PODS[pod])
                    self.unacked[pod] -= 1  # acked (a refused one is handed back)
            finally:
                r.view.drop_tentative(booking.node, booking.pod_uid)

        self._spawn(r, commit())

    @rule(
        replica=st.integers(0, REPLICAS - 1),
        pod=st.sampled_from(sorted(PODS)),
        really=st.integers(0, 2),
    )
    def delete(self, replica: int, pod: str, really: int) -> None:
        if really:  # deletions a third as often as the other rules: pods must get placed
            return
        r = self.replicas[replica]
        self._spawn(r, r.protocol.release_deleted(pod, reason="deleted"))

    @rule(
        replica=st.integers(0, REPLICAS - 1),
        pod=st.sampled_from(sorted(PODS)),
        timeout=st.booleans(),
    )
    def binding_fails_or_times_out(self, replica: int, pod: str, timeout: bool) -> None:
        r = self.replicas[replica]
        claim = r.view.claim(pod)
        if claim is None or claim.booking is None:
            return
        self._spawn(
            r,
            r.protocol.release_requeue(
                pod, claim.booking.node, reason="test", only_reserved=timeout
            ),
        )

    # --- the binder ----------------------------------------------------------------------------

    @rule()
    def binder_watch(self) -> None:
        """The binder's watches deliver what changed: its mirror of claims, bookings and
        records is the KV as it is now (until the next changes)."""
        for bucket in (subjects.KV_LEDGER, subjects.KV_ASSIGNMENTS):
            self.mirror[bucket] = dict(self.kv.entries(bucket))

    def _mirrored(self, bucket: str, key: str) -> tuple[bytes, int] | None:
        return self.mirror.get(bucket, {}).get(key)

    def _to_bind(self, pod: str) -> list[Booking]:
        """What the binder binds of ``pod``, from its mirror: the booking its placed claim names
        (the broken binder: every booking of the pod)."""
        if not self.binder_binds_claims:
            return [
                codec.decode(data, Booking)
                for key, (data, _) in self.mirror.get(subjects.KV_LEDGER, {}).items()
                if key.startswith("book.") and subjects.booking_of_key(key)[1] == pod
            ]
        found = self._mirrored(subjects.KV_CLAIMS, subjects.claim_key(pod))
        claim = codec.decode(found[0], PodClaim) if found else None
        if claim is None or claim.state != "placed" or claim.booking is None:
            return []
        return [claim.booking]

    @rule(pod=st.sampled_from(sorted(PODS)))
    def binder_binds(self, pod: str) -> None:
        """The binder binds ``pod``: writes the record of the booking its claim names, as its
        mirror shows them, ``bound`` (``shared.commits.record_action``): create-only on an
        empty key, compare-and-set over a released record of an older commit."""
        for booking in self._to_bind(pod):
            key = subjects.assignment_key(booking.node, booking.pod_uid)
            found = self._mirrored(subjects.KV_ASSIGNMENTS, key)
            current = codec.decode(found[0], AssignmentRecord) if found else None
            if commits.record_action(current, booking.commit) != "write":
                continue
            record = commits.placed_over(
                current, commits.record_of(booking, bound_at=self.clock.now())
            )
            data = codec.encode(record)
            if not self.binder_writes_at_revision:
                self.kv.put(subjects.KV_ASSIGNMENTS, key, data)
            elif found is None:
                self.kv.create(subjects.KV_ASSIGNMENTS, key, data)
            else:
                self.kv.update(subjects.KV_ASSIGNMENTS, key, data, found[1])

    @rule(pod=st.sampled_from(sorted(PODS)))
    def binder_withdraws(self, pod: str) -> None:
        """The binder's bound -> released compare-and-set when the pod ended before its GPUs
        were allocated (``services.binder.rules.plan.stranded``); the placers learn of it only
        later."""
        for key, (data, revision) in self.kv.entries(subjects.KV_ASSIGNMENTS).items():
            record = codec.decode(data, AssignmentRecord)
            if record.pod_uid == pod and stranded(record):
                gone = released(record, now=self.clock.now())
                self.kv.update(subjects.KV_ASSIGNMENTS, key, codec.encode(gone), revision)

    @rule(pod=st.sampled_from(sorted(PODS)))
    def plugin_or_binder_allocates(self, pod: str) -> None:
        """A device plugin's bound -> allocated compare-and-set, or the binder's settling of an
        admitted pod's record (``services.binder.rules.plan.served_elsewhere``): the same write."""
        for key, (data, revision) in self.kv.entries(subjects.KV_ASSIGNMENTS).items():
            record = codec.decode(data, AssignmentRecord)
            if record.pod_uid == pod and stranded(record):
                done = settled(record, now=self.clock.now())
                self.kv.update(subjects.KV_ASSIGNMENTS, key, codec.encode(done), revision)

    @rule(replica=st.integers(0, REPLICAS - 1))
    def reconcile(self, replica: int) -> None:
        r = self.replicas[replica]
        self._spawn(r, r.protocol.reconcile(grace_s=0.0))

    @precondition(lambda self: bool(self.gates.pending))
    @rule(
        steps=st.lists(
            st.tuples(
                st.integers(0, 1000),
                st.sampled_from(["land", "land", "land", "land", "land-lost", "lost"]),
            ),
            min_size=1,
            max_size=8,
        )
    )
    def let_some_through(self, steps: list[tuple[int, Fate]]) -> None:
        """The next few waiting operations, in the order picked, each with its fate."""
        for pick, fate in steps:
            if not self.gates.pending:
                return
            op = self.gates.pending.pop(pick % len(self.gates.pending))
            if not op.done.done():
                op.done.set_result(fate)
            self._run(self._settle())

    @rule(replica=st.integers(0, REPLICAS - 1))
    def watch_catches_up(self, replica: int) -> None:
        self._run(self._catch_up(self.replicas[replica]))

    async def _catch_up(self, r: Replica) -> None:
        """The replica's watches deliver what changed since they last did, as the service's
        handlers take it: the outcome of a write sent unanswered, then the view."""
        changes, r.inbox = r.inbox, []
        for change in changes:
            r.store.watched(*change)
            apply_entry(r.view, *change)
        await self._settle()

    @rule(replica=st.integers(0, REPLICAS - 1))
    def kill_and_restart(self, replica: int) -> None:
        """SIGKILL: whatever the replica had in flight stops where it is; a fresh one loads KV."""
        old = self.replicas[replica]

        async def kill() -> None:
            for task in list(old.tasks):
                task.cancel()
            await self._settle()

        self._run(kill())
        self.gates.pending = [op for op in self.gates.pending if op.replica != replica]
        self.replicas[replica] = self._replica(replica)

    @precondition(lambda self: self.pools > 1)
    @rule(replica=st.integers(0, REPLICAS - 1), held=st.frozensets(st.integers(0, 2)))
    def pools_move(self, replica: int, held: frozenset[int]) -> None:
        """The replica holds ``held`` from now on (whatever any other replica holds)."""
        self.replicas[replica].view.set_owned(held)

    @rule(seconds=st.sampled_from([1.0, 200.0]))
    def time_passes(self, seconds: float) -> None:
        self._run(self.clock.advance(seconds))

    # --- invariants ----------------------------------------------------------------------------

    def _state(self) -> wire.ClusterState:
        state = wire.ClusterState()
        for key, (data, _) in self.kv.entries(subjects.KV_LEDGER).items():
            if key != subjects.claim_uid(key):
                state.claims[subjects.claim_uid(key)] = codec.decode(data, PodClaim)
                continue
            node, _ = subjects.booking_of_key(key)
            held = state.ledgers[node].bookings if node in state.ledgers else ()
            booking = codec.decode(data, Booking)
            state.ledgers[node] = NodeLedger(node=node, bookings=(*held, booking))
        for key, (data, _) in self.kv.entries(subjects.KV_ASSIGNMENTS).items():
            state.records[key] = codec.decode(data, AssignmentRecord)
        for data, _ in self.kv.entries(subjects.KV_TENANTS).values():
            ledger = codec.decode(data, TenantLedger)
            state.tenants[ledger.tenant] = ledger
        return state

    @invariant()
    def nothing_over_committed_and_one_record_per_pod(self) -> None:
        state = self._state()
        wire.check_capacity(state, INVENTORIES, slots={name: SLOTS for name in NODES})
        live = state.live_records()
        pods = [r.pod_uid for r in live]
        assert len(pods) == len(set(pods)), f"two live records for one pod: {sorted(pods)}"
        booked = {(b.node, b.pod_uid, b.commit) for b in state.bookings()}
        for record in live:
            key = (record.node, record.pod_uid, record.commit)
            assert key in booked, f"a live record without its booking: {key}"
        wire.check_quotas(state, QUOTAS)
        if self.charges:  # the broken machine has no charges to check
            wire.check_charges(state, QUOTAS)

    def teardown(self) -> None:
        try:
            self.gates.open = True
            for op in self.gates.pending:
                if not op.done.done():
                    op.done.set_result("land")
            self.gates.pending = []

            async def drain() -> None:
                # The watches catch up and time passes until nothing is in flight: a write sent
                # unanswered learns its outcome from its watch, or reads back when none came.
                for _ in range(100):
                    if not any(replica.tasks for replica in self.replicas):
                        return
                    for replica in self.replicas:
                        await self._catch_up(replica)
                    await self.clock.advance(ECHO_SEEN_S)
                raise AssertionError("work still in flight after 100 rounds")

            self._run(drain())
            redelivered = sorted(pod for pod, count in self.unacked.items() if count > 0)
            self.replicas[0] = self._replica(0)  # a fresh view takes the redeliveries
            for pod in redelivered:
                self.unacked[pod] = 0
                self.decide(replica=0, pod=pod)

            async def reconciled(number: int) -> None:
                """A fresh view of everything, then repair (its claims answered by its watch,
                which catches up as :func:`drain` goes)."""
                replica = self.replicas[number] = self._replica(number)
                repair = asyncio.get_running_loop().create_task(
                    replica.protocol.reconcile(grace_s=0.0)
                )
                replica.tasks[repair] = None
                repair.add_done_callback(lambda done: replica.tasks.pop(done, None))
                await drain()
                repair.result()

            async def finish() -> None:
                await drain()
                for number in range(REPLICAS):
                    await reconciled(number)
                    await reconciled(number)

            self._run(finish())
            self.binder_watch()  # the binder's reconciliation: every placed claim bound
            for pod in sorted(PODS):
                self.binder_binds(pod)
            state = self._state()
            if currently_in_test_context():  # not when a test drives the machine by hand
                event(f"live records at the end: {len(state.live_records())}")
                event(f"claims: {sorted(c.state for c in state.claims.values())}")
            wire.check_invariants(
                state, INVENTORIES, slots={name: SLOTS for name in NODES}, bound=True
            )
            wire.check_quotas(state, QUOTAS)
            if self.charges:  # and nothing charged that is not placed
                wire.check_charges(state, QUOTAS)
                team = state.tenants.get("team")
                charged = {c.commit for c in team.charges} if team else set()
                recorded = {r.commit for r in state.live_records() if r.namespace == "team"}
                assert charged == recorded, (charged, recorded)
        finally:
            self.loop.close()


ProtocolMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestProtocol = ProtocolMachine.TestCase


class PooledProtocolMachine(ProtocolMachine):
    """The machine with three node pools moved among the replicas by a rule."""

    pools = 3


PooledProtocolMachine.TestCase.settings = ProtocolMachine.TestCase.settings
TestPooledProtocol = PooledProtocolMachine.TestCase


class SerialProtocolMachine(ProtocolMachine):
    """The same machine with each claim written after its booking, not in its batch: the
    protocol on a single NATS server (``Store.book``)."""

    claims_with_bookings = False


SerialProtocolMachine.TestCase.settings = ProtocolMachine.TestCase.settings
TestSerialProtocol = SerialProtocolMachine.TestCase


class BrokenQuotaMachine(ProtocolMachine):
    """Every replica checks the quota on its own view only: two of them place ``team``'s pods at
    once and the tenant ends over its quota."""

    charges = False


class UnguardedMachine(ProtocolMachine):
    """A booking is written whatever the node's bookings hold now (its guard is not checked):
    each replica books on its own view of the node."""

    guards = False


class SerialUnguardedMachine(SerialProtocolMachine):
    """:class:`UnguardedMachine` on a single server: each booking written on its own, sent
    unanswered."""

    guards = False


class StaleBindMachine(ProtocolMachine):
    """The binder writes its record over whatever the key holds, trusting the revision its
    mirror last saw (a put, not a create or a compare-and-set)."""

    binder_writes_at_revision = False


class ClaimlessBindMachine(SerialProtocolMachine):
    """The binder binds every booking it sees, not only the one a placed claim names (on a
    single server, where a booking lands before its claim)."""

    binder_binds_claims = False


def _two_replicas_place_both_team_pods_at_once(machine: ProtocolMachine) -> None:
    """The interleaving the search shrinks to: replica 1 decides ``q1`` for the first GPU of node
    ``a``; replica 0, not having seen it, decides ``p0`` there and ``q0`` beside it on the
    second GPU; the machine then lets everything through. Replica 0's booking finds the ledger
    changed, reads it again and books what still fits: capacity is checked again, the tenant's
    quota only where it is charged."""
    machine.decide(replica=1, pod="q1")
    machine.decide(replica=0, pod="p0")
    machine.decide(replica=0, pod="q0")
    machine.teardown()


def test_a_quota_checked_only_on_each_replicas_view_is_caught() -> None:
    """The race the charge exists for, driven by hand: without the charge the machine catches the
    tenant over its quota; with it, the same race ends within the quota.

    Not a derandomized search: which examples hypothesis draws changed with the tests that ran
    before in the process (the search found this in 300 examples alone, not after the binder's
    tests), so a search here passed or failed by test order."""
    with pytest.raises(AssertionError, match="over its quota"):
        _two_replicas_place_both_team_pods_at_once(BrokenQuotaMachine())
    _two_replicas_place_both_team_pods_at_once(ProtocolMachine())


@contextlib.contextmanager
def _driving(machine: ProtocolMachine) -> Iterator[ProtocolMachine]:
    """Drive ``machine`` by hand and tear it down at the end; when a step fails first, stop what
    its replicas have in flight and close its loop before the failure goes on."""
    try:
        yield machine
    except BaseException:
        for replica in machine.replicas:
            for task in list(replica.tasks):
                task.cancel()
        machine.gates.open = True
        for op in machine.gates.pending:
            if not op.done.done():
                op.done.set_result("lost")
        machine._run(machine._settle())
        machine.loop.close()
        raise
    machine.teardown()


def _let_next(machine: ProtocolMachine, replica: int, what: str = "") -> None:
    """Let the first waiting operation of ``replica`` (whose name starts with ``what``) land,
    then check the invariants. Named, not by position: a change of how many operations a step
    has in flight at once must not turn a driven race into another one."""
    pick = next(
        i
        for i, op in enumerate(machine.gates.pending)
        if op.replica == replica and op.what.startswith(what)
    )
    machine.let_some_through(steps=[(pick, "land")])
    machine.nothing_over_committed_and_one_record_per_pod()


def _two_replicas_book_one_gpu_on_stale_views(machine: ProtocolMachine, booking: str) -> None:
    """Replica 0 books ``p2`` (a whole GPU) on node ``a``; replica 1, which has not seen it,
    decides ``p0`` onto the same GPU and books it. With its guard, replica 1's booking finds
    the node's bookings moved on, reads them again and decides anew; without, it lands."""
    with _driving(machine):
        machine.decide(replica=0, pod="p2")
        _let_next(machine, 0, booking)
        machine.decide(replica=1, pod="p0")
        while machine.gates.pending:
            _let_next(machine, machine.gates.pending[0].replica)


@pytest.mark.parametrize(
    ("unguarded", "guarded", "booking"),
    [
        (UnguardedMachine, ProtocolMachine, "batch tessera-ledger"),
        (SerialUnguardedMachine, SerialProtocolMachine, "send tessera-ledger/book."),
    ],
    ids=["in the claim's batch", "unanswered"],
)
def test_a_booking_that_skips_the_node_s_guard_is_caught(
    unguarded: type[ProtocolMachine], guarded: type[ProtocolMachine], booking: str
) -> None:
    """Two replicas book one GPU, each on its own view: caught without the guard (a GPU held
    whole and shared), safe with it; a booking in its claim's batch as one sent unanswered on
    its own."""
    with pytest.raises(AssertionError, match="GPU 0"):
        _two_replicas_book_one_gpu_on_stale_views(unguarded(), booking)
    _two_replicas_book_one_gpu_on_stale_views(guarded(), booking)


def _bind_after_a_reserve_timeout(machine: ProtocolMachine) -> None:
    """``p0`` is placed and the binder's mirror shows its claim; replica 1 then times the
    placement out (fence, claim ``requeued``, booking given back) before the binder binds from
    that mirror. The binder's create-only write finds the fence and writes nothing; a binder
    that writes over whatever is there brings the fenced commit back to life."""
    with _driving(machine):
        machine.decide(replica=0, pod="p0")
        _let_next(machine, 0, "batch tessera-ledger")
        machine.binder_watch()
        machine.watch_catches_up(replica=1)
        machine.binding_fails_or_times_out(replica=1, pod="p0", timeout=True)
        while machine.gates.pending:
            _let_next(machine, machine.gates.pending[0].replica)
        machine.binder_binds(pod="p0")
        machine.nothing_over_committed_and_one_record_per_pod()


def test_a_bind_that_trusts_a_stale_revision_is_caught() -> None:
    """The binder's record write must be create-only or at the revision it read: caught when it
    writes over the fence (a live record whose booking was given back), safe otherwise."""
    with pytest.raises(AssertionError, match="a live record without its booking"):
        _bind_after_a_reserve_timeout(StaleBindMachine())
    _bind_after_a_reserve_timeout(ProtocolMachine())


def _a_loser_s_booking_beside_the_winner_s(machine: ProtocolMachine) -> None:
    """Replica 0 places ``p0`` on node ``a`` (booking, then claim); a booking of ``p0`` on node
    ``b`` that no claim names is still in the ledger (the loser of two replicas that decided it at
    once, on one server, before it gives its booking back). The binder then binds ``p0``."""
    with _driving(machine):
        machine.decide(replica=0, pod="p0")
        while machine.gates.pending:
            _let_next(machine, 0)
        _booked_without_claim(machine, "p0", node="b")
        machine.binder_watch()
        machine.binder_binds(pod="p0")
        machine.nothing_over_committed_and_one_record_per_pod()


def test_a_bind_of_a_booking_no_claim_names_is_caught() -> None:
    """Only the booking a placed claim names is the pod's: a binder binding the other replica's
    booking too gives the pod two live records; one that binds from the claim, one."""
    with pytest.raises(AssertionError, match="two live records"):
        _a_loser_s_booking_beside_the_winner_s(ClaimlessBindMachine())
    _a_loser_s_booking_beside_the_winner_s(SerialProtocolMachine())


def _booked_without_claim(machine: ProtocolMachine, pod: str, *, node: str = "") -> None:
    """Write ``pod``'s booking (on ``node``, when given) to the ledger with no claim: what a
    placer stopped between the booking and the claim of a restore leaves (a commit books and
    claims in one batch)."""
    view = machine.replicas[0].view
    request = translate.pod_request(PODS[pod])
    now = machine.clock.now()
    outcome = (
        decider.decide_on(view, PROFILE, request, node, now=now)
        if node
        else decider.decide(view, PROFILE, request, now=now)
    )
    assert isinstance(outcome, Decision)
    booking = translate.booking_of(
        outcome.reservation,
        PODS[pod],
        tenant=view.tenancy.tenant_of(request).tenant,
        commit="r9.00000001",
        decided_at=machine.clock.now(),
        placer_id="r9",
    )
    assert machine.kv.create(
        subjects.KV_LEDGER,
        subjects.booking_key(booking.node, booking.pod_uid),
        codec.encode(booking),
    )


def test_a_roll_forward_that_finds_its_pod_deleted_fences_the_record_first() -> None:
    """The search's example, driven by hand: replica 1 rolls a booked commit of ``p1`` forward
    (its claim) and the binder binds it, while replica 0's reconciliation, on a view that had
    seen only the booking, rolls the same commit forward; replica 2 deletes ``p1`` meanwhile.
    The roll-forward then found the claim deleted and took the booking off the ledger, while the
    record it had not fenced stayed live: a live record without its booking until the deletion's
    own fence landed. Every release fences first."""
    machine = ProtocolMachine()
    _booked_without_claim(machine, "p1")
    for replica in (0, 1):
        machine.watch_catches_up(replica=replica)
        machine.reconcile(replica=replica)  # both roll p1's commit forward: its claim waits
    _let_next(machine, 1, "send tessera-ledger/claim.p1")  # unanswered
    machine.watch_catches_up(replica=1)  # its claim, landed
    machine.binder_watch()
    machine.binder_binds(pod="p1")
    machine.delete(pod="p1", really=0, replica=2)
    _let_next(machine, 2, "get tessera-ledger/claim.p1")
    _let_next(machine, 2, "update tessera-ledger/claim.p1")  # the tombstone; its fence waits
    _let_next(machine, 0, "send tessera-ledger/claim.p1")  # exists: refused, unanswered
    machine.time_passes(seconds=ECHO_SEEN_S)  # its watch showed nothing: read back, says deleted
    _let_next(machine, 0, "get tessera-ledger/claim.p1")
    while any(op.replica == 0 for op in machine.gates.pending):  # the release, ahead of r2's
        _let_next(machine, 0)
    machine.teardown()


def test_a_booking_and_its_claim_land_together_or_not_at_all() -> None:
    """A commit books and claims in one batch: while it waits, the ledger holds neither; a
    batch whose answer is lost landed whole (the commit finds both and goes on); one lost on
    its way left nothing (the pod is decided again)."""
    for fate, booked in (("land-lost", True), ("lost", False)):
        machine = ProtocolMachine()
        machine.decide(pod="p0", replica=0)
        assert not machine._state().bookings() and not machine._state().claims
        pick = next(
            i
            for i, op in enumerate(machine.gates.pending)
            if op.what.startswith("batch tessera-ledger/book.a.p0,claim.p0")
        )
        machine.let_some_through(steps=[(pick, fate)])
        state = machine._state()
        assert [b.pod_uid for b in state.bookings()] == (["p0"] if booked else [])
        assert sorted(state.claims) == (["p0"] if booked else [])
        machine.teardown()


def test_a_claim_seen_twice_is_bound_once() -> None:
    """The binder binds from its mirror whenever it looks: a claim it binds twice (a watch that
    delivered it again, a binder restarted) writes one record, and the second bind writes
    nothing."""
    machine = ProtocolMachine()
    machine.decide(pod="p0", replica=0)
    _let_next(machine, 0, "batch tessera-ledger")
    machine.binder_watch()
    machine.binder_binds(pod="p0")
    first = machine.kv.revision
    machine.binder_watch()
    machine.binder_binds(pod="p0")
    machine.binder_binds(pod="p0")
    assert machine.kv.revision == first
    (record,) = machine._state().records.values()
    assert (record.state, record.commit) == ("bound", "r0.00000001")
    machine.teardown()


@pytest.mark.parametrize("machine_class", [ProtocolMachine, SerialProtocolMachine])
def test_a_fence_written_over_another_commit_s_fence_keeps_both(
    machine_class: type[ProtocolMachine],
) -> None:
    """The explore run's example (``scripts/fuzz``), driven by hand: a pod message taken twice
    makes two commits of ``p0``; the first is placed and bound, the binder withdraws its
    record (the pod ended before its GPUs were allocated), and the second, which lost the claim,
    fences its own commit at the same key. That fence replaced the first commit's released
    record, so a bind of the first commit (its claim still ``placed``) wrote its record again
    after all, with its booking about to be given back: room counted twice. The second fence
    now joins the first (``AssignmentRecord.fenced``)."""
    machine = machine_class()
    machine.decide(pod="p0", replica=0)
    machine.decide(pod="p0", replica=0)
    for _ in range(2):
        machine.let_some_through(steps=[(0, "land")])
        machine.watch_catches_up(replica=0)  # what became of a write sent unanswered
    machine.binder_watch()
    machine.binder_binds(pod="p0")
    machine.binder_withdraws(pod="p0")
    while machine.gates.pending:
        machine.let_some_through(steps=[(0, "land")])
        machine.watch_catches_up(replica=0)
    machine.binder_watch()
    machine.binder_binds(pod="p0")
    records = list(machine._state().records.values())
    assert [(r.state, r.commit) for r in records] == [("released", "r0.00000001")]
    machine.teardown()
    (record,) = machine._state().records.values()
    assert record.state == "released" or record.commit not in ("r0.00000001", "r0.00000002")
