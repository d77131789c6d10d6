"""The placer's picture of the cluster, kept current from KV (pure: no I/O, time passed in).

:class:`ClusterView` holds the latest value of every KV entry the placer reads (inventory, node
facts, bookings, pod claims, assignment records, tenants' charges), each with its KV revision,
and from them one :class:`~.core.index.ClusterIndex` of node states that decisions run on. Updates
come from the shell's KV watches and from the shell's own writes (a write's revision is applied at
once; the watch event for it arrives later and is ignored, as is anything older than what is held).

Besides the committed ledger, a node's state counts this replica's *tentative* bookings: decisions
taken and not yet committed (the shell commits several at once), so the next decision does not
count on capacity a commit in flight is about to take. :meth:`committed_state` is the node as the
ledger alone holds it, which is what a compare-and-set is checked against.

Also kept here, because they follow the same inputs:

- tenant usage for quotas (every booking, committed or tentative, counted once per pod, and the
  charges of the shared usage entries in ``tessera-tenants`` for pods not seen booked yet;
  ``nodes.BookedUsage``);
- each node's pods between decision and Allocate, for the binder's gate (``handoffs.py``);
- the task mix (:class:`~.mix.TaskMix`) from the claims;
- why each unschedulable node is (``unplaceable``), for rejection messages;
- two change counters the backoff queue waits on: ``freed`` moves when something that could let
  a waiting pod fit changed (capacity given back, a node added, made schedulable, a GPU healthy
  again, a tenant's charges given back, the tenancy config), ``grown`` when the largest node
  shapes changed (a node or GPU added), which is all a pod too large for every node waits for;
- the capacity signatures of all nodes (totals, GPU models and memories), for "too large for any
  node" (:meth:`too_large`).

**Node pools** (``pools`` above 1, ``pools.py``): the index decisions run on first holds
only the nodes of the pools this replica holds (``owned``). Every other node's inputs are still
taken (tenant usage and the protocol's checks read them), but its state is derived only when
:meth:`everywhere` is asked for the index of every node: for a pod that fits in none of the
replica's own nodes, for an answer about any node, and whenever waiting pods are looked at (so
that ``freed`` and ``grown`` also move for room given back on other pools' nodes). So a replica does
not pay, decision after decision, for the state of nodes another replica places on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

from services.placer.core.facts import PodFacts, ShareAsk
from services.placer.core.groups import TenancyConfig
from services.placer.core.index import ClusterIndex
from services.placer.core.model import NodeState, PodRequest, Reservation
from services.placer.core.tenancy import Tenancy
from services.placer.rules import handoffs, keptout, translate
from services.placer.rules.capacity import Capacities, gives_room, signature_of
from services.placer.rules.charges import TenantEntries
from services.placer.rules.mix import TaskMix, task_spec
from services.placer.rules.nodes import BookedUsage, NodeEntry, add_node, drop_node, shown
from services.placer.rules.poolplan import pool_of
from services.placer.rules.repairs import RecordFacts, record_facts
from shared import validation
from shared.messages.assignments import AssignmentRecord
from shared.messages.inventory import NodeInventory
from shared.messages.ledger import Booking, NodeLedger, PodClaim, TenantLedger
from shared.messages.nodes import NodeFacts
from shared.subjects import (
    assignment_key,
    booking_key,
    booking_of_key,
    node_from_token,
    node_token,
)

UNREADABLE = "ledger entry unreadable"


class ClusterView:
    """See the module docstring."""

    def __init__(
        self,
        *,
        inventory_stale_s: float,
        task_mix_window: int,
        tenancy: TenancyConfig | None = None,
        pools: int = 1,
    ) -> None:
        self.inventory_stale_s = inventory_stale_s
        self.pools = pools
        self.owned: frozenset[int] = frozenset(range(pools)) if pools == 1 else frozenset()
        """The pools this replica holds: their nodes are the ones in ``index``."""
        self._pool_of: dict[str, int] = {}
        self._everywhere = ClusterIndex(())
        """With pools: every node's state, brought up to date from ``_dirty`` when asked."""
        self._dirty: set[str] = set()
        self.tenancy = Tenancy(tenancy)
        self.mix = TaskMix(window=task_mix_window)
        self.index = ClusterIndex(())
        self.memory_unit_nodes: set[str] = set()
        """Nodes whose device plugin runs in memory-units mode (``translate.memory_units_only``)."""
        self.dra_nodes: set[str] = set()
        """Nodes offering their GPUs through DRA (``keptout.offers_dra``)."""
        self.loaded = False
        self.freed = 0
        self.grown = 0
        self.claims: dict[str, PodClaim] = {}
        self.claim_revisions: dict[str, int] = {}
        self.records: dict[str, RecordFacts] = {}
        self.tenants = TenantEntries(self.tenancy)
        """Each tenant's usage entry (``tessera-tenants``) and the entry's revision."""
        self._nodes: dict[str, NodeEntry] = {}
        self._usage = BookedUsage(self.tenancy)
        self._committed: dict[str, tuple[str, ...]] = {}
        """Pod UID -> nodes whose committed ledger books it."""
        self._signatures = Capacities()
        self._now = 0.0
        self._handoffs = handoffs.HandOffs()

    # --- reading -------------------------------------------------------------------------------

    def nodes(self) -> Iterator[str]:
        return iter(self._nodes)

    def node_count(self) -> int:
        """Known nodes, every pool's (counted without deriving any node's state)."""
        if self.pools == 1:
            return len(self.index)
        return sum(1 for entry in self._nodes.values() if entry.known)

    def owns(self, node: str) -> bool:
        """Whether ``node`` is in a pool this replica holds (always, without pools)."""
        if self.pools == 1:
            return True
        pool = self._pool_of.get(node)
        if pool is None:
            pool = self._pool_of[node] = pool_of(node, self.pools)
        return pool in self.owned

    def everywhere(self) -> ClusterIndex:
        """The index of every node (``index`` itself without pools): what a pod that fits on
        none of this replica's own nodes is decided on, and what answers about any node."""
        if self.pools == 1:
            return self.index
        dirty, self._dirty = self._dirty, set()
        for name in sorted(dirty):
            entry = self._nodes.get(name)
            if entry is None or not entry.known:
                continue  # ``_rebuild`` took it out of both indexes
            if name in self.index:
                state = self.index.node(name)
            else:
                bookings = entry.bookings()
                entry.shown = shown(bookings)
                state = self._state(name, entry, bookings)
            self._put(self._everywhere, name, entry, state)
        return self._everywhere

    def indexes(self) -> tuple[ClusterIndex, ...]:
        """Every index the view keeps (each with its judgement memos)."""
        return (self.index,) if self.pools == 1 else (self.index, self._everywhere)

    def set_owned(self, owned: frozenset[int]) -> None:
        """Hold the pools ``owned`` from now on: their nodes enter the index, others leave it."""
        if self.pools == 1 or owned == self.owned:
            return
        self.owned = owned
        for name in sorted(self._nodes):
            if (name in self.index) != self.owns(name):
                self._rebuild(name)

    def inventory(self, node: str) -> NodeInventory | None:
        entry = self._nodes.get(node)
        return entry.inventory if entry else None

    def facts(self, node: str) -> NodeFacts | None:
        entry = self._nodes.get(node)
        return entry.facts if entry else None

    def ledger(self, node: str) -> tuple[NodeLedger | None, int]:
        """The committed bookings of ``node`` and their revision: the latest among its booking
        keys (0: none seen)."""
        entry = self._nodes.get(node)
        if entry is None:
            return None, 0
        return entry.ledger, entry.ledger_revision

    def booking_revision(self, node: str, pod_uid: str) -> int:
        """The revision of ``pod_uid``'s booking key on ``node`` as held (0: never seen)."""
        entry = self._nodes.get(node)
        return entry.booking_revisions.get(pod_uid, 0) if entry is not None else 0

    def ledgers(self) -> dict[str, tuple[Booking, ...]]:
        return {name: entry.ledger.bookings for name, entry in self._nodes.items() if entry.ledger}

    def bookings_of(self, pod_uid: str) -> list[Booking]:
        """``pod_uid``'s committed bookings (normally at most one)."""
        found: list[Booking] = []
        for name in sorted(self._committed.get(pod_uid, ())):
            ledger = self._nodes[name].ledger
            found.extend(b for b in (ledger.bookings if ledger else ()) if b.pod_uid == pod_uid)
        return found

    def tentative(self, node: str, pod_uid: str) -> Booking | None:
        entry = self._nodes.get(node)
        return entry.tentative.get(pod_uid) if entry else None

    def committed_state(self, node: str) -> NodeState | None:
        """``node`` as its committed ledger alone has it (what a compare-and-set is checked on)."""
        entry = self._nodes.get(node)
        if entry is None or not entry.known:
            return None
        return self._state(node, entry, entry.ledger.bookings if entry.ledger else ())

    def unplaceable(self) -> dict[str, int]:
        """How many known nodes cannot be placed on now, per reason."""
        return dict(Counter(e.reason for e in self._nodes.values() if e.known and e.reason))

    def reason(self, node: str) -> str:
        entry = self._nodes.get(node)
        return entry.reason if entry else "unknown node"

    def gpu_memory(self, node: str, index: int) -> int | None:
        entry = self._nodes.get(node)
        if entry is None or entry.inventory is None:
            return None
        return next((g.memory_total_mib for g in entry.inventory.gpus if g.index == index), None)

    def claim(self, pod_uid: str) -> PodClaim | None:
        return self.claims.get(pod_uid)

    def queued_nodes(self, at_least: int) -> frozenset[str]:
        """Nodes with at least ``at_least`` pods between decision and Allocate. The binder's
        gate lets one such pod per device count through to a node at a time, so pods decided
        onto a node whose queue is long wait there in line (``decider.decide`` spreads a burst
        over other nodes rather than lengthen it)."""
        return self._handoffs.queued_nodes(at_least)

    def waits_at_gate(self, reservation: Reservation, pod: PodRequest) -> bool:
        """Whether the binder's gate would hold ``reservation`` of ``pod`` back on its node
        (``handoffs.waits_at_gate``)."""
        node = reservation.node
        units = node in self.memory_unit_nodes
        return handoffs.waits_at_gate(self._nodes.get(node), reservation, pod, units=units)

    def certainly_waits_at_gate(self, node: str, pod_uid: str, asks: Sequence[ShareAsk]) -> bool:
        """Whether the gate would hold back every choice of GPUs for ``asks`` on ``node``
        (``handoffs.certainly_waits_at_gate``)."""
        units = node in self.memory_unit_nodes
        return handoffs.certainly_waits_at_gate(self._nodes.get(node), pod_uid, asks, units=units)

    # --- node inputs ---------------------------------------------------------------------------

    def _entry(self, node: str) -> NodeEntry:
        entry = self._nodes.get(node)
        if entry is None:
            entry = self._nodes[node] = NodeEntry()
        return entry

    def set_inventory(self, inventory: NodeInventory, *, now: float) -> str:
        """Take ``inventory`` for its node when the one inventory rule says so
        (``shared.validation.take_inventory`` at wall time ``now``: an older snapshot is
        ignored); why it cannot be believed (the node keeps what it had), else empty."""
        verdict = validation.take_inventory(
            inventory, self.inventory(inventory.node), node=inventory.node, now=now
        )
        if verdict.take is None:
            return verdict.problem
        self._entry(inventory.node).inventory = verdict.take
        self._rebuild(inventory.node)
        return ""

    def drop_inventory(self, node: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None and entry.inventory is not None:
            entry.inventory = None
            self._rebuild(node)

    def set_facts(self, facts: NodeFacts) -> None:
        entry = self._entry(facts.node)
        entry.deleted = facts.deleted
        entry.facts = None if facts.deleted else facts
        self._note_mode(facts.node, entry.facts)
        self._rebuild(facts.node)

    def drop_facts(self, node: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None and entry.facts is not None:
            entry.facts = None
            self._note_mode(node, None)
            self._rebuild(node)

    def _note_mode(self, node: str, facts: NodeFacts | None) -> None:
        for nodes, kept in (
            (self.memory_unit_nodes, translate.memory_units_only(facts)),
            (self.dra_nodes, keptout.offers_dra(facts)),
        ):
            (nodes.add if kept else nodes.discard)(node)

    def set_booking(self, node: str, pod_uid: str, booking: Booking | None, revision: int) -> bool:
        """Take pod ``pod_uid``'s booking key on ``node`` at ``revision`` (None: deleted);
        False when a newer revision of the key is already held."""
        entry = self._entry(node)
        if revision <= entry.booking_revisions.get(pod_uid, 0):
            return False
        entry.booking_revisions[pod_uid] = revision
        self._take_ledger(node, entry, pod_uid, booking, max(entry.ledger_revision, revision))
        if pod_uid in entry.unreadable:
            entry.unreadable.discard(pod_uid)
            self._rebuild(node)
        return True

    def _take_ledger(
        self, node: str, entry: NodeEntry, pod_uid: str, booking: Booking | None, revision: int
    ) -> None:
        """Hold ``booking`` as ``pod_uid``'s on ``node`` (None: it has none), the node's bookings
        at ``revision``."""
        bookings = {b.pod_uid: b for b in entry.ledger.bookings} if entry.ledger else {}
        before = set(bookings)
        if booking is None:
            bookings.pop(pod_uid, None)
        else:
            bookings[pod_uid] = booking
        entry.ledger = (
            NodeLedger(node=node, bookings=tuple(bookings.values())) if bookings else None
        )
        entry.ledger_revision = revision
        after = set(bookings)
        for uid in before - after:
            drop_node(self._committed, uid, node)
        for uid in after - before:
            add_node(self._committed, uid, node)
        for uid in after:
            entry.tentative.pop(uid, None)  # committed now (by us or by another replica)
        self._hand_off(node, entry, pod_uid)
        if entry.shown != shown(entry.bookings()):
            self._rebuild(node)

    def set_booking_unreadable(self, node: str, pod_uid: str, revision: int) -> None:
        """Pod ``pod_uid``'s booking key on ``node`` at ``revision`` does not decode: stop
        placing on the node (the booking it held, if any, still counts)."""
        entry = self._entry(node)
        if revision > entry.booking_revisions.get(pod_uid, 0):
            entry.booking_revisions[pod_uid] = revision
            entry.ledger_revision = max(entry.ledger_revision, revision)
            entry.unreadable.add(pod_uid)
            self._rebuild(node)

    def add_tentative(self, booking: Booking) -> None:
        entry = self._entry(booking.node)
        entry.tentative[booking.pod_uid] = booking
        self._handoffs.count(booking.node, entry)
        self._rebuild(booking.node)

    def drop_tentative(self, node: str, pod_uid: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None and entry.tentative.pop(pod_uid, None) is not None:
            self._handoffs.count(node, entry)
            self._rebuild(node)

    # --- records and claims --------------------------------------------------------------------

    def set_record(
        self, key: str, record: AssignmentRecord | None, revision: int, *, seen_at: float = 0.0
    ) -> bool:
        """Take in a record version; ``seen_at``: now, by this placer's clock (a key keeps the
        time it was first seen live, however often it is rewritten)."""
        known = self.records.get(key)
        if known is not None and revision <= known.revision:
            return False
        if record is None:
            if known is not None:
                del self.records[key]
                self._recount(known.node, known.pod_uid, None)
            return True
        if known is not None and known.live:
            seen_at = known.seen_at
        facts = record_facts(key, record, revision, seen_at=seen_at)
        self.records[key] = facts
        self._recount(record.node, record.pod_uid, facts)
        return True

    def _recount(self, node: str, pod_uid: str, facts: RecordFacts | None) -> None:
        entry = self._entry(node)
        if facts is None:
            entry.records.discard(pod_uid)
        else:
            entry.records.add(pod_uid)
        self._hand_off(node, entry, pod_uid)

    def _hand_off(self, node: str, entry: NodeEntry, pod_uid: str) -> None:
        """Count ``pod_uid`` among the node's pods between decision and Allocate while it is
        booked there and no record of its booking's commit is ``allocated`` (or released)."""
        record = self.records.get(assignment_key(node, pod_uid))
        if handoffs.handing_off(entry.booking(pod_uid), record):
            entry.handing_off.add(pod_uid)
        else:
            entry.handing_off.discard(pod_uid)
        self._handoffs.count(node, entry)

    def set_claim(self, pod_uid: str, claim: PodClaim | None, revision: int) -> bool:
        if revision <= self.claim_revisions.get(pod_uid, 0):
            return False
        if claim is None:  # purged: forget the pod altogether (its revision too)
            self.claims.pop(pod_uid, None)
            self.claim_revisions.pop(pod_uid, None)
            self.mix.forget(pod_uid)
            return True
        self.claim_revisions[pod_uid] = revision
        self.claims[pod_uid] = claim
        self._observe(pod_uid, claim)
        return True

    def _observe(self, pod_uid: str, claim: PodClaim) -> None:
        """Count a placed pod in the task mix."""
        if claim.booking is not None:
            placed = translate.reservation_of(claim.booking)
            self.mix.observe(pod_uid, task_spec(placed, self.gpu_memory), claim.booking.decided_at)

    # --- tenants' charges ----------------------------------------------------------------------

    def set_tenant_ledger(self, ledger: TenantLedger, revision: int) -> bool:
        """Take a tenant's usage entry at ``revision``; False when a newer one is held. A charge
        given back counts as freed room (pods over the tenant's quota may fit now)."""
        taken, gave_back = self.tenants.take(ledger, revision)
        if gave_back:
            self.freed += 1
        return taken

    # --- keys deleted while no watch ran -------------------------------------------------------

    def inventory_keys(self) -> set[str]:
        return {node_token(n) for n, e in self._nodes.items() if e.inventory is not None}

    def facts_keys(self) -> set[str]:
        return {node_token(n) for n, e in self._nodes.items() if e.facts is not None}

    def forget_inventory(self, key: str) -> None:
        self.drop_inventory(node_from_token(key))

    def forget_facts(self, key: str) -> None:
        self.drop_facts(node_from_token(key))

    def hold_unreadable(self, node: str, key: str) -> None:
        """A key of ``node`` that is not a booking does not decode (an earlier version's
        whole-node entry): stop placing on the node for as long as this view lives."""
        entry = self._entry(node)
        entry.unreadable.add(key)
        self._rebuild(node)

    def booking_keys(self) -> set[str]:
        return {booking_key(n, uid) for n, e in self._nodes.items() for uid in e.booking_revisions}

    def forget_booking(self, key: str) -> None:
        """A booking key the store no longer has (NATS lost its store): the booking holds no
        room now (a restored one comes back through the new store)."""
        node, pod_uid = booking_of_key(key)
        entry = self._nodes.get(node)
        if entry is None or entry.booking_revisions.pop(pod_uid, None) is None:
            return
        entry.unreadable.discard(pod_uid)
        revision = max(entry.booking_revisions.values(), default=0)
        self._take_ledger(node, entry, pod_uid, None, revision)

    def forget_tenant(self, key: str) -> None:
        """A tenant's usage entry the store no longer has (see :meth:`forget_booking`)."""
        if self.tenants.forget(key):
            self.freed += 1

    def forget_claim(self, pod_uid: str) -> None:
        self.claims.pop(pod_uid, None)
        self.claim_revisions.pop(pod_uid, None)
        self.mix.forget(pod_uid)

    def forget_record(self, key: str) -> None:
        known = self.records.pop(key, None)
        if known is not None:
            self._recount(known.node, known.pod_uid, None)

    # --- tenancy -------------------------------------------------------------------------------

    def configure_tenancy(self, config: TenancyConfig) -> None:
        """Make ``config`` current: group membership is resolved again for every node."""
        labels = {
            name: dict(e.facts.labels) for name, e in self._nodes.items() if e.facts is not None
        }
        self.tenancy.configure(config, self.index, node_labels=labels)
        if self.pools > 1:  # the other pools' nodes are marked again when next derived
            self._dirty.update(name for name, e in self._nodes.items() if e.known)
        self.freed += 1
        self.grown += 1

    # --- time ----------------------------------------------------------------------------------

    def refresh(self, now: float) -> None:
        """Re-judge every node's inventory freshness at ``now``."""
        self._now = now
        if not self.loaded:
            return
        for name, entry in self._nodes.items():
            if not entry.known:
                continue
            if self._reason(entry) != entry.reason:
                self._rebuild(name)

    def finish_load(self, now: float) -> None:
        """Build the index from everything loaded (called once, when every watch caught up)."""
        self._now = now
        self.loaded = True
        for name in sorted(self._nodes):
            self._rebuild(name)
        for uid, claim in self.claims.items():  # now that every GPU's size is known
            self._observe(uid, claim)

    # --- deriving node states ------------------------------------------------------------------

    def _reason(self, entry: NodeEntry) -> str:
        if entry.unreadable:
            return UNREADABLE
        return translate.placement_reason(
            entry.inventory, entry.facts, now=self._now, stale_s=self.inventory_stale_s
        )

    def _state(
        self, name: str, entry: NodeEntry, bookings: tuple[Booking, ...] | list[Booking]
    ) -> NodeState:
        state = translate.node_state(
            name,
            entry.inventory,
            entry.facts,
            bookings,
            placeable=not entry.reason,
        )
        labels = entry.facts.labels if entry.facts is not None else {}
        return self.tenancy.annotate(state, labels=labels)

    def _rebuild(self, name: str) -> None:
        """Derive node ``name``'s state again and store it in the index (after the load); a
        node of another replica's pool only leaves the index, and waits for :meth:`everywhere`."""
        entry = self._nodes[name]
        bookings = entry.bookings()
        entry.charged = self._usage.count(name, entry.charged, bookings)
        if not self.loaded:
            return
        pooled = self.pools > 1
        if pooled:
            self._dirty.add(name)
        if not entry.known:
            if name in self.index:
                self.index.remove(name)
            if pooled and name in self._everywhere:
                self._everywhere.remove(name)
            self._forget_signature(entry)
            if not (entry.deleted or entry.ledger or entry.tentative or entry.records):
                del self._nodes[name]
            return
        if not self.owns(name):
            if name in self.index:
                self.index.remove(name)
            entry.reason = self._reason(entry)
            return
        entry.reason = self._reason(entry)
        entry.shown = shown(bookings)
        state = self._state(name, entry, bookings)
        if pooled:  # capacity signatures are kept in ``everywhere``, when it is derived
            old = self.index.node(name) if name in self.index else None
            if old is None:
                self.index.add(state)
            elif state != old:
                self.index.put(state)
            if gives_room(old, state):  # own pods waiting wake now, not at the next derive
                self.freed += 1
            return
        self._put(self.index, name, entry, state)

    def _put(self, index: ClusterIndex, name: str, entry: NodeEntry, state: NodeState) -> None:
        """Store ``state`` in ``index`` (the one holding every node), keeping the capacity
        signatures and the change counters."""
        old = index.node(name) if name in index else None
        if old is None:
            index.add(state)
        elif state != old:
            index.put(state)
        else:
            return
        signature = signature_of(state)
        if signature != entry.signature:
            self._forget_signature(entry)
            entry.signature = signature
            self._signatures.add(signature)
            self.grown += 1
        if gives_room(old, state):
            self.freed += 1

    def _forget_signature(self, entry: NodeEntry) -> None:
        if entry.signature is not None:
            self._signatures.remove(entry.signature)
            entry.signature = None

    # --- capacity ------------------------------------------------------------------------------

    def too_large(self, pod: PodFacts) -> str:
        """Why no known node could hold ``pod`` even with nothing on it; empty when one could."""
        return self._signatures.too_large(pod)
