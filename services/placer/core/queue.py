"""Seed 002's queue order: which pending pod the placer tries next.

Every pod is first validated and marked GPU or non-GPU (``admit``); an invalid pod never enters the
queue, it comes back as an unresolvable :class:`~.model.Rejection`. Admitted pods are ordered by

1. business priority, higher first: ``PodRequest.priority`` (the PriorityClass value), then the
   ``tessera.dev/priority`` label, which only refines the order among pods of equal priority (a pod
   without the label counts as label 0);
2. total requested resources, larger first (see :func:`demand_ppm`);
3. arrival, earlier first (FIFO): the pod's creation time, then the order in which it was pushed;
4. the pod UID, so that the order is total even for two entries that agree on everything else.

Between placer replicas the push order means nothing; :func:`shared_key` is the same order without
it (the UID breaks ties directly), comparable between replicas.

Why larger first. Small pods fit into the holes big pods leave behind; served first, a stream of
small pods keeps every node a little busy and a pod that needs a whole node (or eight GPUs) waits
for ever. Trying big pods first at equal priority lets them take the room while it exists, and the
small ones still fill what is left. Priority always wins over size: a big pod never overtakes a
more important small one.

Normalisation. CPU, memory and GPUs are in different units, so each is expressed as a fraction of
one *reference node* (by default the largest node in view, :func:`reference_node`) and the three
fractions are added: ``gpu_milli / (1000 * ref_gpus) + cpu / ref_cpu + memory / ref_memory``. A pod
that fills the reference node scores 3, half of it 1.5. The sum is kept in integer parts per
million so that equal demands compare equal exactly. GPU demand uses the pod's GPU milli (a whole
GPU is 1000; a share is the larger of its compute and memory fractions), as the FGD paper does.

The queue itself (:class:`PlacementQueue`) is a binary heap with lazy deletion: ``push``, ``pop``
and ``remove(uid)`` in O(log n), ``peek`` and ``len`` in O(1). It is pure (no I/O, no clock: the
creation time is passed in) and deterministic: the same pushes in the same order give the same
pops.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from enum import Enum

import msgspec

from services.placer.core.facts import invalid_rejection, pod_facts
from services.placer.core.model import (
    GPU_MILLI,
    ClusterSnapshot,
    PodRequest,
    Rejection,
)

PPM = 1_000_000
"""Parts per million: the unit of :func:`demand_ppm`."""


class PodMark(Enum):
    """Seed 002's mark: whether a pod needs GPU resources (it decides which score applies)."""

    GPU = "gpu"
    NON_GPU = "non-gpu"


class ReferenceNode(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The node size that CPU, memory and GPU demands are measured against (all positive)."""

    cpu_milli: int = 64_000
    memory_mib: int = 512 * 1024
    gpus: int = 8

    def __post_init__(self) -> None:
        if self.cpu_milli <= 0 or self.memory_mib <= 0 or self.gpus <= 0:
            raise ValueError("a reference node needs positive CPU, memory and GPU count")


def reference_node(snapshot: ClusterSnapshot) -> ReferenceNode:
    """The largest node in ``snapshot``, dimension by dimension (defaults where none has any)."""
    default = ReferenceNode()
    return ReferenceNode(
        cpu_milli=max((n.cpu_milli_total for n in snapshot.nodes), default=0) or default.cpu_milli,
        memory_mib=max((n.memory_mib_total for n in snapshot.nodes), default=0)
        or default.memory_mib,
        gpus=max((len(n.gpus) for n in snapshot.nodes), default=0) or default.gpus,
    )


def demand_ppm(request: PodRequest, reference: ReferenceNode) -> int:
    """Total requested resources of ``request`` in millionths of ``reference`` (see module doc)."""
    facts = pod_facts(request)
    gpu = facts.gpu_milli_total * PPM // (GPU_MILLI * reference.gpus)
    cpu = facts.cpu_milli * PPM // reference.cpu_milli
    memory = facts.memory_mib * PPM // reference.memory_mib
    return gpu + cpu + memory


class QueuedPod(msgspec.Struct, frozen=True, kw_only=True):
    """An admitted pod with everything its place in the queue depends on."""

    request: PodRequest
    mark: PodMark
    priority_label: int = 0
    """``tessera.dev/priority``; refines ``request.priority`` among equals."""
    demand_ppm: int = 0
    created_at: float = 0.0
    """Pod creation time, seconds since the epoch: the FIFO order among equals."""
    sequence: int = 0
    """Push order; breaks ties between pods created in the same second."""

    @property
    def uid(self) -> str:
        return self.request.uid


QueueKey = tuple[int, int, int, float, int, str]
SharedKey = tuple[int, int, int, float, str]


def queue_key(entry: QueuedPod) -> QueueKey:
    """The sort key: smaller comes out first. Negated fields are the "higher first" ones."""
    return (
        -entry.request.priority,
        -entry.priority_label,
        -entry.demand_ppm,
        entry.created_at,
        entry.sequence,
        entry.request.uid,
    )


def shared_key(entry: QueuedPod) -> SharedKey:
    """The queue's order without the push sequence, which only one queue knows: the UID breaks
    ties instead, so that every placer replica orders the same pods the same way."""
    return (
        -entry.request.priority,
        -entry.priority_label,
        -entry.demand_ppm,
        entry.created_at,
        entry.request.uid,
    )


def admit(
    request: PodRequest,
    *,
    reference: ReferenceNode,
    priority_label: int | None = None,
    created_at: float = 0.0,
    sequence: int = 0,
    now: float = 0.0,
) -> QueuedPod | Rejection:
    """Validate ``request`` and mark it GPU / non-GPU, or say why it can never be placed."""
    facts = pod_facts(request)
    if facts.invalid:
        return invalid_rejection(facts, nodes=0, now=now)
    return QueuedPod(
        request=request,
        mark=PodMark.GPU if facts.gpu_count else PodMark.NON_GPU,
        priority_label=priority_label or 0,
        demand_ppm=demand_ppm(request, reference),
        created_at=created_at,
        sequence=sequence,
    )


def in_queue_order(entries: Iterable[QueuedPod]) -> list[QueuedPod]:
    """``entries`` sorted as the queue would pop them."""
    return sorted(entries, key=queue_key)


class PlacementQueue:
    """Pending pods in seed 002 order; see the module docstring.

    Pushing a UID already queued replaces its entry (a pod whose spec or priority changed) but
    keeps its original push sequence, so an update never sends a pod to the back of its class.
    """

    def __init__(self, *, reference: ReferenceNode | None = None) -> None:
        self.reference = reference or ReferenceNode()
        self._heap: list[tuple[QueueKey, int, QueuedPod]] = []
        self._live: dict[str, QueuedPod] = {}
        self._pushed = 0
        self._heap_pushes = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, uid: object) -> bool:
        return uid in self._live

    def __iter__(self) -> Iterator[QueuedPod]:
        """The queued pods in pop order (a sorted copy; the queue is unchanged)."""
        return iter(in_queue_order(self._live.values()))

    def push(
        self,
        request: PodRequest,
        *,
        priority_label: int | None = None,
        created_at: float = 0.0,
        now: float = 0.0,
    ) -> QueuedPod | Rejection:
        """Admit and queue ``request``; an invalid request is returned as a Rejection instead."""
        previous = self._live.get(request.uid)
        if previous is not None:
            sequence = previous.sequence
        else:
            sequence = self._pushed
            self._pushed += 1
        admitted = admit(
            request,
            reference=self.reference,
            priority_label=priority_label,
            created_at=created_at,
            sequence=sequence,
            now=now,
        )
        if isinstance(admitted, Rejection):
            self._live.pop(request.uid, None)
            return admitted
        self._live[request.uid] = admitted
        # The push counter keeps heap items comparable when a replaced entry has the same key.
        self._heap_pushes += 1
        heapq.heappush(self._heap, (queue_key(admitted), self._heap_pushes, admitted))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._compact()
        return admitted

    def _compact(self) -> None:
        # Many updates or removals leave stale items behind; rebuild from the live entries.
        live = {id(e) for e in self._live.values()}
        self._heap = [item for item in self._heap if id(item[2]) in live]
        heapq.heapify(self._heap)

    def remove(self, uid: str) -> QueuedPod | None:
        """Take ``uid`` out of the queue (a deleted pod); unknown UIDs are a no-op."""
        return self._live.pop(uid, None)

    def _drop_stale(self) -> None:
        # Entries removed or replaced stay in the heap until they reach the top.
        while self._heap:
            entry = self._heap[0][2]
            if self._live.get(entry.uid) is entry:
                return
            heapq.heappop(self._heap)

    def peek(self) -> QueuedPod | None:
        self._drop_stale()
        return self._heap[0][2] if self._heap else None

    def pop(self) -> QueuedPod | None:
        """The next pod to place, removed from the queue; None when empty."""
        self._drop_stale()
        if not self._heap:
            return None
        entry = heapq.heappop(self._heap)[2]
        del self._live[entry.uid]
        return entry
