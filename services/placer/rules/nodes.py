"""What the placer's view holds of one node, and tenant usage kept equal to the bookings (pure).

:class:`NodeEntry` is everything :class:`~.state.ClusterView` knows about one node: its inventory,
facts, committed bookings with their revisions, this replica's tentative bookings, the pods
whose hand-off is not done, and what the node's state in the index was derived from.
:class:`BookedUsage` counts each booked pod once in its tenant's usage, wherever it is booked.
"""

from __future__ import annotations

from services.placer.core.tenancy import Tenancy
from services.placer.rules import translate
from services.placer.rules.capacity import Signature
from shared.messages.inventory import NodeInventory
from shared.messages.ledger import Booking, NodeLedger
from shared.messages.nodes import NodeFacts


class NodeEntry:
    """Everything known about one node."""

    __slots__ = (
        "booking_revisions",
        "charged",
        "deleted",
        "facts",
        "handing_off",
        "inventory",
        "ledger",
        "ledger_revision",
        "reason",
        "records",
        "shown",
        "signature",
        "tentative",
        "unreadable",
    )

    def __init__(self) -> None:
        self.inventory: NodeInventory | None = None
        self.facts: NodeFacts | None = None
        self.ledger: NodeLedger | None = None
        """Every booking on the node (``tessera-ledger``'s booking keys of the node, in the
        order they were written); None: none."""
        self.ledger_revision = 0
        """The latest revision among the node's booking keys, delete markers included: what a
        booking's write is guarded at (``subjects.node_bookings``)."""
        self.booking_revisions: dict[str, int] = {}
        """Pod UID -> the revision of its booking key as last seen here (its delete marker's
        once deleted)."""
        self.tentative: dict[str, Booking] = {}
        self.records: set[str] = set()
        """Pod UIDs with a record on this node."""
        self.handing_off: set[str] = set()
        """Pod UIDs booked here whose hand-off is not done: no record of the booking's commit
        ``allocated`` (or ``released``) yet, so the binder's gate still counts them."""
        self.reason = ""
        self.signature: Signature | None = None
        self.charged: set[str] = set()
        """Pod UIDs whose booking here is counted in tenant usage."""
        self.deleted = False
        """The binder said the node left the cluster (its inventory may linger in KV)."""
        self.shown: frozenset[tuple[str, str]] | None = None
        """(pod UID, commit) of the bookings the index's state of this node was derived from:
        a tentative booking that becomes committed changes nothing, so it is not derived again."""
        self.unreadable: set[str] = set()
        """Pod UIDs whose booking key here does not decode (or the key of an earlier version's
        entry that does not: ``ClusterView.hold_unreadable``): the node's bookings are unknown,
        so nothing more is placed on it until each is written readable again or deleted."""

    @property
    def known(self) -> bool:
        return not self.deleted and (self.inventory is not None or self.facts is not None)

    def bookings(self) -> list[Booking]:
        committed = list(self.ledger.bookings) if self.ledger else []
        held = {b.pod_uid for b in committed}
        return committed + [b for uid, b in self.tentative.items() if uid not in held]

    def booking(self, pod_uid: str) -> Booking | None:
        """``pod_uid``'s committed booking here."""
        bookings = self.ledger.bookings if self.ledger else ()
        return next((b for b in bookings if b.pod_uid == pod_uid), None)


def shown(bookings: list[Booking]) -> frozenset[tuple[str, str]]:
    return frozenset((b.pod_uid, b.commit) for b in bookings)


def add_node(nodes_of: dict[str, tuple[str, ...]], uid: str, node: str) -> None:
    nodes = nodes_of.get(uid, ())
    if node not in nodes:
        nodes_of[uid] = (*nodes, node)


def drop_node(nodes_of: dict[str, tuple[str, ...]], uid: str, node: str) -> bool:
    """Take ``node`` off ``uid``'s nodes; whether any are left (none: ``uid`` is forgotten)."""
    nodes = tuple(n for n in nodes_of.get(uid, ()) if n != node)
    if nodes:
        nodes_of[uid] = nodes
    else:
        nodes_of.pop(uid, None)
    return bool(nodes)


class BookedUsage:
    """Keeps tenant usage equal to the bookings: each pod counted once, wherever it is booked
    (committed or tentative)."""

    def __init__(self, tenancy: Tenancy) -> None:
        self._tenancy = tenancy
        self._pod_nodes: dict[str, tuple[str, ...]] = {}
        """Pod UID -> nodes holding a booking of it (tuples: one per pod, and a tuple of
        strings is not scanned by the garbage collector, a set is)."""

    def count(self, node: str, charged: set[str], bookings: list[Booking]) -> set[str]:
        """Count ``node``'s ``bookings`` (``charged``: its pods counted so far); the pods counted
        now."""
        here = {b.pod_uid: b for b in bookings}
        for uid in charged - here.keys():
            if uid in self._pod_nodes and not drop_node(self._pod_nodes, uid, node):
                self._tenancy.usage.refund(uid)
        for uid in here.keys() - charged:
            if uid not in self._pod_nodes:
                self._tenancy.adopt(here[uid].tenant, translate.reservation_of(here[uid]))
            add_node(self._pod_nodes, uid, node)
        return set(here)
