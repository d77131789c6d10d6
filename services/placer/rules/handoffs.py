"""Pods between decision and Allocate, node by node, and whether the binder's gate would hold a
pod back behind them (pure).

A pod is *handing off* on a node while it is booked there (or booked tentatively by this
replica) and no record of its booking's commit is ``allocated`` or ``released``. The binder's
gate lets one pod per device count through to a node at a time (``services/binder/rules/plan.py``),
so
the decider spreads a burst away from nodes whose queue is long (:meth:`HandOffs.queued_nodes`)
and avoids choices the gate would hold back (:func:`waits_at_gate`). The assignment records the
view takes in are kept by :class:`HandOffs`, as a record's state is what ends a pod's hand-off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from services.placer.core.facts import ShareAsk
from services.placer.core.model import GpuSlice, PodRequest, Reservation
from services.placer.rules import translate
from services.placer.rules.nodes import NodeEntry
from services.placer.rules.repairs import RecordFacts, record_facts
from shared.messages.assignments import AssignmentRecord
from shared.messages.ledger import BookedSlice, Booking
from shared.subjects import assignment_key


def _slices(gpus: Iterable[GpuSlice | BookedSlice]) -> tuple[tuple[str, int, int], ...]:
    """What a device plugin's Allocate tells a container's shares by: GPU, memory, SMs."""
    return tuple((g.uuid, g.memory_mib, g.core_milli) for g in gpus)


def _queued(entry: NodeEntry, pod_uid: str) -> list[Booking]:
    """The bookings of pods between decision and Allocate on ``entry``'s node, but
    ``pod_uid``'s: the binder's gate holds a pod back beside them."""
    queued = [b for b in entry.tentative.values() if b.pod_uid != pod_uid]
    if entry.handing_off and entry.ledger is not None:
        queued += [
            b
            for b in entry.ledger.bookings
            if b.pod_uid in entry.handing_off
            and b.pod_uid not in entry.tentative
            and b.pod_uid != pod_uid
        ]
    return queued


def handing_off(booking: Booking | None, record: RecordFacts | None) -> bool:
    """Whether a pod booked with ``booking`` (None: not booked) is between decision and
    Allocate, its record being ``record``."""
    if booking is None:
        return False
    done = (
        record is not None
        and record.commit == booking.commit
        and record.state in ("allocated", "released")
    )
    return not done


def waits_at_gate(
    entry: NodeEntry | None, reservation: Reservation, pod: PodRequest, *, units: bool
) -> bool:
    """Whether the binder's gate would hold ``reservation`` of ``pod`` back on its node
    (``entry``; ``units``: a memory-units node): a pod there between decision and Allocate has
    a GPU container of as many devices on other slices (the binder's ``plan.ambiguous``). Pods
    of identical slices pass the gate together: a device plugin serves either from the other's
    record alike.

    A container's devices are what its kubelet asks the device plugin for: its shares on a
    logical node, its ``tessera.dev/gpu-memory`` on a memory-units node (a pod of 4 GiB and
    one of 8 GiB, one share each, never wait for each other there)."""
    if entry is None or not (entry.handing_off or entry.tentative):
        return False
    memory = {c.name: c.share_memory_mib or 0 for c in pod.containers}
    mine = [
        (memory.get(c.container, 0) if units else len(c.gpus), _slices(c.gpus))
        for c in reservation.containers
        if c.gpus
    ]
    if not mine:
        return False
    for booking in _queued(entry, reservation.pod_uid):
        for container in booking.containers:
            if not container.gpus:
                continue
            devices = (
                container.resources.get(translate.GPU_MEMORY_RESOURCE, 0)
                if units
                else len(container.gpus)
            )
            theirs = _slices(container.gpus)
            if any(count == devices and ours != theirs for count, ours in mine):
                return True
    return False


def certainly_waits_at_gate(
    entry: NodeEntry | None, pod_uid: str, asks: Sequence[ShareAsk], *, units: bool
) -> bool:
    """Whether :func:`waits_at_gate` holds for every choice of GPUs for ``asks`` on ``entry``'s
    node: a pod queued there has a GPU container of as many shares as one of ``asks`` whose
    slices differ from that ask's in size (a slice takes its ask's cores, and its MiB when the
    ask names them), so on other slices whichever GPUs are chosen. False where it takes the
    GPUs chosen to tell, and on memory-units nodes (``units``: their devices are MiB)."""
    if entry is None or not (entry.handing_off or entry.tentative) or units:
        return False
    for booking in _queued(entry, pod_uid):
        for container in booking.containers:
            gpus = container.gpus
            for ask in asks:
                if ask.shares != len(gpus):
                    continue
                if any(g.core_milli != ask.core_milli for g in gpus):
                    return True
                sized = ask.memory_mib is not None and not ask.whole
                if sized and any(g.memory_mib != ask.memory_mib for g in gpus):
                    return True
    return False


class HandOffs:
    """The assignment records the view holds, which pods they leave between decision and
    Allocate on each node (:meth:`hand_off`), how many each node has, and the nodes with at
    least so many (:meth:`queued_nodes`)."""

    def __init__(self, *, entry: Callable[[str], NodeEntry]) -> None:
        self._entry = entry
        """The view's entry of a node (made when the node has none yet)."""
        self.records: dict[str, RecordFacts] = {}
        """Assignment record key -> what is kept of the record (its latest version seen)."""
        self._counts: dict[str, int] = {}
        """Node -> its pods between decision and Allocate (only nodes with any): records not
        allocated yet and this replica's tentative bookings."""
        self._queued: dict[int, frozenset[str]] = {}
        """``queued_nodes`` by threshold, until a queue changes: every decision asks, and under a
        burst thousands of nodes may have a queue."""

    def queued_nodes(self, at_least: int) -> frozenset[str]:
        """Nodes with at least ``at_least`` pods between decision and Allocate."""
        queued = self._queued.get(at_least)
        if queued is None:
            queued = frozenset(n for n, count in self._counts.items() if count >= at_least)
            self._queued[at_least] = queued
        return queued

    def count(self, node: str, entry: NodeEntry) -> None:
        """Count ``node``'s pods between decision and Allocate again."""
        count = len(entry.handing_off.union(entry.tentative))
        before = self._counts.get(node, 0)
        if before == count:
            return
        # Only a node crossing a level changes that level's set: the set (and what a reader
        # derived from it, ``ClusterIndex.ranks_of``) is kept while queues only grow or shrink.
        # A crossing changes the set by that one node (a copy in C, not a pass over every
        # node's queue: under a burst a node crosses a level at about every other decision).
        for at_least, queued in self._queued.items():
            if (before >= at_least) != (count >= at_least):
                self._queued[at_least] = queued | {node} if count >= at_least else queued - {node}
        if count:
            self._counts[node] = count
        else:
            self._counts.pop(node, None)

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
        self.hand_off(node, entry, pod_uid)

    def hand_off(self, node: str, entry: NodeEntry, pod_uid: str) -> None:
        """Count ``pod_uid`` among the node's pods between decision and Allocate while it is
        booked there and no record of its booking's commit is ``allocated`` (or released)."""
        record = self.records.get(assignment_key(node, pod_uid))
        if handing_off(entry.booking(pod_uid), record):
            entry.handing_off.add(pod_uid)
        else:
            entry.handing_off.discard(pod_uid)
        self.count(node, entry)

    def forget_record(self, key: str) -> None:
        known = self.records.pop(key, None)
        if known is not None:
            self._recount(known.node, known.pod_uid, None)
