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

Each node's inputs are kept in its :class:`~.nodes.NodeEntry`; what is derived from an entry
whenever it changes (the node's state in the index, its bookings in tenant usage, the capacity
signatures, the change counters ``freed`` and ``grown`` the backoff queue waits on, and with node
pools which nodes the index holds) is :class:`~.indexes.NodeIndexes`'s, which the view delegates
to. Also kept here, because they follow the same inputs:

- tenant usage for quotas (every booking, committed or tentative, counted once per pod, and the
  charges of the shared usage entries in ``tessera-tenants`` for pods not seen booked yet;
  ``nodes.BookedUsage``);
- each node's pods between decision and Allocate, for the binder's gate (``handoffs.py``);
- the task mix (:class:`~.mix.TaskMix`) from the claims;
- why each unschedulable node is (``unplaceable``), for rejection messages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

from services.placer.core.facts import PodFacts, ShareAsk
from services.placer.core.fragmentation import HostKind
from services.placer.core.groups import TenancyConfig
from services.placer.core.index import ClusterIndex
from services.placer.core.model import NodeState, PodRequest, Reservation
from services.placer.core.tenancy import Tenancy
from services.placer.rules import handoffs, translate
from services.placer.rules.charges import TenantEntries
from services.placer.rules.indexes import NodeIndexes
from services.placer.rules.mix import TaskMix, task_spec
from services.placer.rules.nodes import BookedUsage, NodeEntry, add_node, drop_node, shown
from shared import validation
from shared.messages.assignments import AssignmentRecord
from shared.messages.inventory import NodeInventory
from shared.messages.ledger import Booking, NodeLedger, PodClaim, TenantLedger
from shared.messages.nodes import NodeFacts
from shared.subjects import (
    booking_key,
    booking_of_key,
    node_from_token,
    node_token,
)


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
        self.pools = pools
        self.tenancy = Tenancy(tenancy)
        self.mix = TaskMix(window=task_mix_window)
        self.memory_unit_nodes: set[str] = set()
        """Nodes whose device plugin runs in memory-units mode (``translate.memory_units_only``)."""
        self.claims: dict[str, PodClaim] = {}
        self.claim_revisions: dict[str, int] = {}
        self.tenants = TenantEntries(self.tenancy)
        """Each tenant's usage entry (``tessera-tenants``) and the entry's revision."""
        self._nodes: dict[str, NodeEntry] = {}
        self._committed: dict[str, tuple[str, ...]] = {}
        """Pod UID -> nodes whose committed ledger books it."""
        self._handoffs = handoffs.HandOffs(entry=self._entry)
        self.records = self._handoffs.records
        """Assignment record key -> what the view keeps of it (``HandOffs.records``)."""
        self._derived = NodeIndexes(
            self._nodes,
            tenancy=self.tenancy,
            usage=BookedUsage(self.tenancy),
            inventory_stale_s=inventory_stale_s,
            pools=pools,
        )
        self.index = self._derived.index
        """The index decisions run on (``NodeIndexes.index``: this replica's pools' nodes)."""

    # --- derived (``indexes.py``) --------------------------------------------------------------

    @property
    def owned(self) -> frozenset[int]:
        """The pools this replica holds: their nodes are the ones in ``index``."""
        return self._derived.owned

    @property
    def loaded(self) -> bool:
        return self._derived.loaded

    @property
    def freed(self) -> int:
        """Moves when something that could let a waiting pod fit changed."""
        return self._derived.freed

    @property
    def grown(self) -> int:
        """Moves when the largest node shapes changed."""
        return self._derived.grown

    # --- reading -------------------------------------------------------------------------------

    def nodes(self) -> Iterator[str]:
        return iter(self._nodes)

    def node_count(self) -> int:
        return self._derived.node_count()

    def owns(self, node: str) -> bool:
        return self._derived.owns(node)

    def everywhere(self) -> ClusterIndex:
        return self._derived.everywhere()

    def indexes(self) -> tuple[ClusterIndex, ...]:
        return self._derived.indexes()

    def set_owned(self, owned: frozenset[int]) -> None:
        self._derived.set_owned(owned)

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

    def tentative_commits(self, node: str) -> frozenset[str]:
        """The commits of this replica's bookings on ``node`` decided and not yet written."""
        entry = self._nodes.get(node)
        return frozenset(b.commit for b in entry.tentative.values()) if entry else frozenset()

    def tentative(self, node: str, pod_uid: str) -> Booking | None:
        entry = self._nodes.get(node)
        return entry.tentative.get(pod_uid) if entry else None

    def committed_state(self, node: str) -> NodeState | None:
        """``node`` as its committed ledger alone has it (what a compare-and-set is checked on)."""
        entry = self._nodes.get(node)
        if entry is None or not entry.known:
            return None
        return self._derived.state(node, entry, entry.ledger.bookings if entry.ledger else ())

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
        self._derived.rebuild(inventory.node)
        return ""

    def drop_inventory(self, node: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None and entry.inventory is not None:
            entry.inventory = None
            self._derived.rebuild(node)

    def set_facts(self, facts: NodeFacts) -> None:
        entry = self._entry(facts.node)
        entry.deleted = facts.deleted
        entry.facts = None if facts.deleted else facts
        self._note_mode(facts.node, entry.facts)
        self._derived.rebuild(facts.node)

    def drop_facts(self, node: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None and entry.facts is not None:
            entry.facts = None
            self._note_mode(node, None)
            self._derived.rebuild(node)

    def _note_mode(self, node: str, facts: NodeFacts | None) -> None:
        if translate.memory_units_only(facts):
            self.memory_unit_nodes.add(node)
        else:
            self.memory_unit_nodes.discard(node)

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
            self._derived.rebuild(node)
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
        self._handoffs.hand_off(node, entry, pod_uid)
        if entry.shown != shown(entry.bookings()):
            self._derived.rebuild(node)

    def set_booking_unreadable(self, node: str, pod_uid: str, revision: int) -> None:
        """Pod ``pod_uid``'s booking key on ``node`` at ``revision`` does not decode: stop
        placing on the node (the booking it held, if any, still counts)."""
        entry = self._entry(node)
        if revision > entry.booking_revisions.get(pod_uid, 0):
            entry.booking_revisions[pod_uid] = revision
            entry.ledger_revision = max(entry.ledger_revision, revision)
            entry.unreadable.add(pod_uid)
            self._derived.rebuild(node)

    def add_tentative(self, booking: Booking) -> None:
        entry = self._entry(booking.node)
        entry.tentative[booking.pod_uid] = booking
        self._handoffs.count(booking.node, entry)
        self._derived.rebuild(booking.node)

    def drop_tentative(self, node: str, pod_uid: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None and entry.tentative.pop(pod_uid, None) is not None:
            self._handoffs.count(node, entry)
            self._derived.rebuild(node)

    # --- records and claims --------------------------------------------------------------------

    def set_record(
        self, key: str, record: AssignmentRecord | None, revision: int, *, seen_at: float = 0.0
    ) -> bool:
        return self._handoffs.set_record(key, record, revision, seen_at=seen_at)

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
            self._derived.freed += 1
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
        self._derived.rebuild(node)

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
            self._derived.freed += 1

    def forget_claim(self, pod_uid: str) -> None:
        self.claims.pop(pod_uid, None)
        self.claim_revisions.pop(pod_uid, None)
        self.mix.forget(pod_uid)

    def forget_record(self, key: str) -> None:
        self._handoffs.forget_record(key)

    # --- tenancy -------------------------------------------------------------------------------

    def configure_tenancy(self, config: TenancyConfig) -> None:
        """Make ``config`` current: group membership is resolved again for every node."""
        labels = {
            name: dict(e.facts.labels) for name, e in self._nodes.items() if e.facts is not None
        }
        self.tenancy.configure(config, self.index, node_labels=labels)
        self._derived.retenanted()

    # --- time ----------------------------------------------------------------------------------

    def refresh(self, now: float) -> None:
        self._derived.refresh(now)

    def finish_load(self, now: float) -> None:
        """Build the index from everything loaded (called once, when every watch caught up)."""
        self._derived.finish_load(now)
        for uid, claim in self.claims.items():  # now that every GPU's size is known
            self._observe(uid, claim)

    # --- capacity ------------------------------------------------------------------------------

    def too_large(self, pod: PodFacts) -> str:
        return self._derived.too_large(pod)

    def host_kinds(self) -> tuple[HostKind, ...]:
        return self._derived.host_kinds()
