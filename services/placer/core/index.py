"""The cluster as the framework reads it: nodes grouped by shape, with a tie-break rank each.

Nodes with equal :class:`~.shape.NodeShape` pass the same filters and get the same scores, so the
framework evaluates each *shape* once per request. A group keeps its nodes' tie-break ranks sorted;
the group's best rank is the first. Only the node a decision lands on changes shape, so keeping
the groups current costs one removal and one insertion per decision.

Shapes are interned to small integers (``shape_id``): the framework's per-request memo is keyed by
them. An id keeps its meaning until the index compacts: a long-running service sees new shapes all
the time (live telemetry), so once more than :attr:`ClusterIndex.shape_limit` shapes were interned
the table is rebuilt from the nodes' current shapes and every memo is dropped with it. The
tie-break order is the caller's: node names sorted by default (the service), or a seeded
permutation (the simulator, as in the FGD methodology). Nodes added later (``add``) take their
place in name order; with an explicit order they go last.

What is not in a shape is indexed by node for the node-aware rules (``nodeaware.py``): nodes by
label, the tainted nodes, the pods with pod-affinity terms, and, for each pod selector a rule
asked about, how many pods on each node it matches, kept current as nodes change (one node's
pods counted again when they change). What the rules derive from labels and taints is kept in
:attr:`ClusterIndex.node_cache` until a label or a taint changes.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

from services.placer.core.ledger import Ledger
from services.placer.core.model import NodeState, PodOnNode, Reservation
from services.placer.core.shape import NodeShape, node_shape
from shared.messages.constraints import LabelSelector, Taint
from shared.selectors import selector_matches

RANK_SETS_KEPT = 8
"""Name sets :meth:`ClusterIndex.ranks_of` keeps converted (one per spreading level, and a few
sets of nodes a replica lost a commit on)."""
COUNTS_KEPT = 64
"""Pod selectors :meth:`ClusterIndex.pod_counts` keeps counted (a few per workload with
affinity or spread constraints in flight)."""

PodSelector = tuple[tuple[frozenset[str] | None, LabelSelector | None], ...]
"""Pods that are, for every entry, in one of its namespaces (None: any) and matched by its
selector (None: matches no pod)."""


def selects(selector: PodSelector, pod: PodOnNode) -> bool:
    for namespaces, labels in selector:
        if namespaces is not None and pod.namespace not in namespaces:
            return False
        if not selector_matches(labels, pod.labels):
            return False
    return True


def _has_terms(pod: PodOnNode) -> bool:
    return pod.affinity is not None or pod.anti_affinity is not None


class ClusterIndex:
    """Mutable, pure (no I/O) index of node states by shape; see the module docstring."""

    def __init__(self, nodes: Iterable[NodeState], *, order: Sequence[str] | None = None) -> None:
        self._nodes: dict[str, NodeState] = {}
        for node in nodes:
            if node.name in self._nodes:
                raise ValueError(f"node {node.name!r} appears twice")
            self._nodes[node.name] = node
        names = list(order) if order is not None else sorted(self._nodes)
        if sorted(names) != sorted(self._nodes):
            raise ValueError("the tie-break order must name every node exactly once")
        self._names_by_rank: list[str] = names
        self._rank: dict[str, int] = {name: rank for rank, name in enumerate(names)}
        self.shapes: list[NodeShape] = []
        self._shape_ids: dict[NodeShape, int] = {}
        self._node_shape: dict[str, int] = {}
        self.groups: dict[int, list[int]] = {}
        """shape id -> sorted tie-break ranks of the nodes in that shape."""
        self.ledger = Ledger()
        self.memos: dict[object, dict[Any, dict[int, Any]]] = {}
        """Per profile: the framework's memo of (request, shape id) -> judgement
        (``Profile.judged``)."""
        self.memo_size = 0
        self.derived: dict[str, object] = {}
        """Data kept by shape id, as the memos are (e.g. ``batch.ShapeRows``): dropped with the
        ids when the index compacts."""
        self.changes = 0
        """Counts every node entering or leaving a shape and every compaction: a reader that saw
        the same count saw the same shapes (the extender's background judging polls it)."""
        self._sorted = order is None
        self.shape_limit = 4 * len(names) + 4096
        """Interned shapes kept before the table is rebuilt (see the module docstring)."""
        self._ranks_of: dict[frozenset[str], frozenset[int]] = {}
        """The last few name sets :meth:`ranks_of` converted, until ranks move."""
        self._by_label: dict[tuple[str, str], set[str]] = {}
        self.tainted: dict[str, tuple[Taint, ...]] = {}
        """Nodes with taints (of any effect)."""
        self.term_pods: dict[str, tuple[PodOnNode, ...]] = {}
        """Nodes holding pods with pod-affinity or anti-affinity terms: those pods."""
        self._counts: dict[PodSelector, dict[str, int]] = {}
        self.node_cache: dict[object, object] = {}
        """What node-aware rules derived from labels and taints (by name, never by rank),
        dropped when a label or a taint changes."""
        self.relabelled = 0
        """Counts changes of a held node's labels or taints (a pod waiting on a node selector
        or a toleration may fit now)."""
        self.repodded = 0
        """Counts changes of a held node's pods (a pod waiting on pod affinity or topology
        spread may fit now)."""
        for name in names:
            self._enter(name, self._nodes[name])
            self._note(name, None, self._nodes[name])

    # -- reading ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[NodeState]:
        return iter(self._nodes.values())

    def node(self, name: str) -> NodeState:
        return self._nodes[name]

    def name_at(self, rank: int) -> str:
        return self._names_by_rank[rank]

    @property
    def names_by_rank(self) -> Sequence[str]:
        """Node names in tie-break order (``names_by_rank[r]`` is ``name_at(r)``); the caller
        must not change it."""
        return self._names_by_rank

    def rank_of(self, name: str) -> int:
        return self._rank[name]

    def ranks_of(self, names: frozenset[str]) -> frozenset[int]:
        """The ranks of those of ``names`` the index holds. A burst avoids the same queued nodes
        decision after decision, so the last few sets are kept until a node enters or leaves."""
        ranks = self._ranks_of.get(names)
        if ranks is None:
            if len(self._ranks_of) >= RANK_SETS_KEPT:
                self._ranks_of.clear()
            # In C: a burst changes the set at about every other decision.
            looked: frozenset[int | None] = frozenset(map(self._rank.get, names))
            if None in looked:  # names this index does not hold (another pool's nodes)
                looked = looked - {None}
            ranks = self._ranks_of[names] = cast("frozenset[int]", looked)
        return ranks

    def shape_of(self, name: str) -> NodeShape:
        return self.shapes[self._node_shape[name]]

    def shape_id_of(self, name: str) -> int:
        return self._node_shape[name]

    def shape_id_or_none(self, name: str) -> int | None:
        """The node's shape id; None for a node the index does not hold."""
        return self._node_shape.get(name)

    def with_label(self, key: str, value: str) -> frozenset[str]:
        """The nodes labelled ``key=value``."""
        return frozenset(self._by_label.get((key, value), ()))

    def pod_counts(self, selector: PodSelector) -> dict[str, int]:
        """How many pods on each node ``selector`` selects (nodes with none left out). Kept
        current from then on, node by node, while the index holds it: the caller must not
        change it."""
        counts = self._counts.get(selector)
        if counts is None:
            if len(self._counts) >= COUNTS_KEPT:
                self._counts.clear()
            counts = self._counts[selector] = {}
            for name, node in self._nodes.items():
                count = sum(1 for pod in node.pods if selects(selector, pod))
                if count:
                    counts[name] = count
        return counts

    # -- node-aware indexes ----------------------------------------------------------------------

    def _note(self, name: str, old: NodeState | None, new: NodeState | None) -> None:
        """Keep the node-aware indexes current as node ``name`` goes from ``old`` to ``new``
        (None: absent)."""
        if (
            old is None
            or new is None
            or (old.labels is not new.labels and old.labels != new.labels)
            or old.taints != new.taints
        ):
            for pair in old.labels.items() if old is not None else ():
                holders = self._by_label[pair]
                holders.discard(name)
                if not holders:
                    del self._by_label[pair]
            for pair in new.labels.items() if new is not None else ():
                self._by_label.setdefault(pair, set()).add(name)
            if new is not None and new.taints:
                self.tainted[name] = new.taints
            else:
                self.tainted.pop(name, None)
            self.node_cache.clear()
            if old is not None and new is not None:
                self.relabelled += 1
        if old is not None and new is not None and (old.pods is new.pods or old.pods == new.pods):
            return
        self.repodded += 1
        pods = new.pods if new is not None else ()
        with_terms = tuple(pod for pod in pods if _has_terms(pod))
        if with_terms:
            self.term_pods[name] = with_terms
        else:
            self.term_pods.pop(name, None)
        for selector, counts in self._counts.items():
            count = sum(1 for pod in pods if selects(selector, pod))
            if count:
                counts[name] = count
            else:
                counts.pop(name, None)

    # -- changing --------------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def _intern(self, shape: NodeShape) -> int:
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = len(self.shapes)
            self.shapes.append(shape)
        return sid

    def _compact(self) -> None:
        """Intern the current shapes afresh; shape ids change, so every memo goes too."""
        current = {name: self.shapes[sid] for name, sid in self._node_shape.items()}
        self.shapes = []
        self._shape_ids = {}
        self._node_shape = {}
        self.groups = {}
        self.memos.clear()
        self.memo_size = 0
        self.derived.clear()
        self.changes += 1
        for name in self._names_by_rank:
            sid = self._intern(current[name])
            self._node_shape[name] = sid
            self.groups.setdefault(sid, []).append(self._rank[name])
        self.shape_limit = 4 * len(self._nodes) + 4096

    def _enter(self, name: str, node: NodeState) -> None:
        self.changes += 1
        sid = self._intern(node_shape(node))
        self._node_shape[name] = sid
        ranks = self.groups.get(sid)
        if ranks is None:
            self.groups[sid] = [self._rank[name]]
        else:
            bisect.insort(ranks, self._rank[name])

    def _leave(self, name: str) -> None:
        self.changes += 1
        sid = self._node_shape.pop(name)
        ranks = self.groups[sid]
        del ranks[bisect.bisect_left(ranks, self._rank[name])]
        if not ranks:
            del self.groups[sid]

    def put(self, node: NodeState) -> None:
        """Replace a known node's state (new telemetry, health, cordon, group membership)."""
        if node.name not in self._nodes:
            raise KeyError(f"unknown node {node.name!r}")
        old = self._nodes[node.name]
        self._leave(node.name)
        self._nodes[node.name] = node
        self._enter(node.name, node)
        self._note(node.name, old, node)
        if len(self.shapes) > self.shape_limit:
            self._compact()

    def _renumber(self, start: int, delta: int) -> None:
        """Shift every rank at or after ``start`` by ``delta`` (order is kept)."""
        self._ranks_of.clear()
        for name in self._names_by_rank[start:]:
            self._rank[name] += delta
        for ranks in self.groups.values():
            for i in range(bisect.bisect_left(ranks, start), len(ranks)):
                ranks[i] += delta

    def add(self, node: NodeState) -> None:
        """Add a new node: in name order when the index sorts by name, else last."""
        if node.name in self._nodes:
            raise ValueError(f"node {node.name!r} appears twice")
        if self._sorted:
            position = bisect.bisect_left(self._names_by_rank, node.name)
        else:
            position = len(self._names_by_rank)
        self._renumber(position, +1)
        self._names_by_rank.insert(position, node.name)
        self._rank[node.name] = position
        self._nodes[node.name] = node
        self._enter(node.name, node)
        self._note(node.name, None, node)

    def remove(self, name: str) -> NodeState:
        """Forget node ``name`` (it left the cluster); its ledger reservations stay recorded."""
        node = self._nodes[name]
        self._leave(name)
        self._note(name, node, None)
        position = self._rank.pop(name)
        del self._nodes[name]
        del self._names_by_rank[position]
        self._renumber(position, -1)
        return node

    def reserve(self, reservation: Reservation) -> str | None:
        """Book ``reservation`` through the ledger; None when booked (or already booked)."""
        current = self._nodes.get(reservation.node)
        if current is None:
            return f"unknown node {reservation.node!r}"
        booked = self.ledger.reserve(current, reservation)
        if isinstance(booked, str):
            return booked
        if booked is not current:
            self.put(booked)
        return None

    def release(self, pod_uid: str) -> bool:
        """Give back ``pod_uid``'s reservation; False when it held none (idempotent)."""
        reservation = self.ledger.get(pod_uid)
        if reservation is None or reservation.node not in self._nodes:
            return False
        self.put(self.ledger.release(pod_uid, self._nodes[reservation.node]))
        return True
