"""The node states decisions run on, derived from the view's node entries (pure: no I/O, time
passed in).

:class:`NodeIndexes` is what :class:`~.state.ClusterView` derives from its table of
:class:`~.nodes.NodeEntry` whenever one entry changes (:meth:`NodeIndexes.rebuild`): the node's
tenant usage (``nodes.BookedUsage``), why it cannot be placed on (its ``reason``), its
:class:`~.core.model.NodeState` in the :class:`~.core.index.ClusterIndex` decisions run on, the
capacity signatures of all nodes (totals, GPU models and memories) for "too large for any node"
(:meth:`NodeIndexes.too_large`), and two change counters the backoff queue waits on: ``freed``
moves when something that could let a waiting pod fit changed (capacity given back, a node added,
made schedulable, a GPU healthy again; the view also moves it for a tenant's charges given back
and the tenancy config), ``grown`` when the largest node shapes changed (a node or GPU added),
which is all a pod too large for every node waits for.

**Node pools** (``pools`` above 1, ``pools.py``): the index decisions run on first holds
only the nodes of the pools this replica holds (``owned``). Every other node's inputs are still
taken (tenant usage and the protocol's checks read them), but its state is derived only when
:meth:`NodeIndexes.everywhere` is asked for the index of every node: for a pod that fits in none
of the replica's own nodes, for an answer about any node, and whenever waiting pods are looked at
(so that ``freed`` and ``grown`` also move for room given back on other pools' nodes). So a replica
does not pay, decision after decision, for the state of nodes another replica places on.
"""

from __future__ import annotations

from services.placer.core.facts import PodFacts
from services.placer.core.fragmentation import HostKind
from services.placer.core.index import ClusterIndex
from services.placer.core.model import NodeState
from services.placer.core.tenancy import Tenancy
from services.placer.rules import translate
from services.placer.rules.capacity import Capacities, gives_room, signature_of
from services.placer.rules.gpustates import GpuMemo
from services.placer.rules.nodes import BookedUsage, NodeEntry, shown
from services.placer.rules.poolplan import pool_of
from shared.messages.ledger import Booking

UNREADABLE = "ledger entry unreadable"


class NodeIndexes:
    """See the module docstring. ``nodes`` is the view's table of node entries (shared, not
    copied): the view takes inputs into it, this derives from it."""

    def __init__(
        self,
        nodes: dict[str, NodeEntry],
        *,
        tenancy: Tenancy,
        usage: BookedUsage,
        inventory_stale_s: float,
        pools: int,
    ) -> None:
        self._nodes = nodes
        self._tenancy = tenancy
        self._usage = usage
        self.inventory_stale_s = inventory_stale_s
        self.pools = pools
        self.owned: frozenset[int] = frozenset(range(pools)) if pools == 1 else frozenset()
        """The pools this replica holds: their nodes are the ones in ``index``."""
        self._pool_of: dict[str, int] = {}
        self._everywhere = ClusterIndex(())
        """With pools: every node's state, brought up to date from ``_dirty`` when asked."""
        self._dirty: set[str] = set()
        self.index = ClusterIndex(())
        self.loaded = False
        self.freed = 0
        self.grown = 0
        self._signatures = Capacities()
        self._now = 0.0
        self._gpu_memos: dict[str, GpuMemo] = {}
        """Per node: what deriving its state last kept of its GPUs (``gpustates.GpuMemo``)."""

    # --- reading -------------------------------------------------------------------------------

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
                continue  # ``rebuild`` took it out of both indexes
            if name in self.index:
                state = self.index.node(name)
            else:
                bookings = entry.bookings()
                entry.shown = shown(bookings)
                state = self.state(name, entry, bookings)
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
                self.rebuild(name)

    def too_large(self, pod: PodFacts) -> str:
        """Why no known node could hold ``pod`` even with nothing on it; empty when one could."""
        return self._signatures.too_large(pod)

    def host_kinds(self) -> tuple[HostKind, ...]:
        """Every pool's known GPU nodes by capacity (``Capacities.host_kinds``)."""
        self.everywhere()  # with pools, the signatures follow ``everywhere``
        return self._signatures.host_kinds()

    # --- changes -------------------------------------------------------------------------------

    def retenanted(self) -> None:
        """The tenancy config changed: every node's groups are marked again (the other pools'
        nodes when next derived)."""
        if self.pools > 1:
            self._dirty.update(name for name, e in self._nodes.items() if e.known)
        self.freed += 1
        self.grown += 1

    def refresh(self, now: float) -> None:
        """Re-judge every node's inventory freshness at ``now``."""
        self._now = now
        if not self.loaded:
            return
        for name, entry in self._nodes.items():
            if not entry.known:
                continue
            if self._reason(entry) != entry.reason:
                self.rebuild(name)

    def finish_load(self, now: float) -> None:
        """Build the index from everything loaded (called once, when every watch caught up)."""
        self._now = now
        self.loaded = True
        for name in sorted(self._nodes):
            self.rebuild(name)

    # --- deriving node states ------------------------------------------------------------------

    def _reason(self, entry: NodeEntry) -> str:
        if entry.unreadable:
            return UNREADABLE
        return translate.placement_reason(
            entry.inventory, entry.facts, now=self._now, stale_s=self.inventory_stale_s
        )

    def state(
        self, name: str, entry: NodeEntry, bookings: tuple[Booking, ...] | list[Booking]
    ) -> NodeState:
        """Node ``name``'s state from ``entry`` with ``bookings`` on it."""
        memo = self._gpu_memos.get(name)
        if memo is None:
            memo = self._gpu_memos[name] = GpuMemo()
        state = translate.node_state(
            name,
            entry.inventory,
            entry.facts,
            bookings,
            placeable=not entry.reason,
            memo=memo,
        )
        labels = entry.facts.labels if entry.facts is not None else {}
        return self._tenancy.annotate(state, labels=labels)

    def rebuild(self, name: str) -> None:
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
            self._gpu_memos.pop(name, None)
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
        state = self.state(name, entry, bookings)
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
