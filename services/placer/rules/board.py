"""The waiting board: seed 002's order kept across placer replicas (pure: no I/O, time passed in).

**The problem.** A pod that does not fit is held waiting by the replica that received it (its
JetStream message kept in progress) and tried again when room is freed. Within one replica the
queue decides in seed 002's order (priority, the ``tessera.dev/priority`` label, size, arrival);
but two replicas holding a high- and a low-priority pod that want the same freed room each try
their own pod, and whichever tries first wins: often the low one.

**The design.** Every replica posts the pods it holds waiting to KV ``tessera-waiting`` (the pod
and its holder: ``shared/messages/waiting.py``) and follows that bucket into a
:class:`WaitingBoard`, kept in the queue's order as every replica computes it
(:func:`~.core.queue.shared_key`). Before a replica commits a pod P, it looks at the board's
entries ordered before P (:func:`first_fitting`) and, when one of them fits now, it *places that
pod first*, itself, through the ordinary commit, and decides P again on the view that now holds
it. P commits only when no waiting pod ordered before it fits any more. Of two pods contending for
freed room, the higher one therefore gets it whichever replica moves first: its own holder places
it directly, and the other replica places it before its own lower pod.

**Why place it rather than yield to its holder** (the other design considered: P's replica backs
off, wakes the higher pod's holder and lets it commit):

- nothing waits on another process. A holder that died, is paused or partitioned, or whose
  backoff has not run out yet, cannot leave the room idle or let P take it after a timeout;
- no second protocol. The commit is the one every pod goes through: when the holder tries the same
  pod at the same moment, the pod's claim (create-only) lets exactly one commit place it and the
  other gives its booking back, as with any pod two replicas decide at once; the holder sees the
  claim through the watch it already has, publishes the decision again (de-duplicated) and acks
  its message. Nothing is lost, nothing placed twice, and a tenant's quota is charged once;
- no wake-up messages and no waiting state to time out: P is decided again at once.

**Starvation.** Only entries that fit *now* go first: a higher pod that does not fit never holds
lower ones back. **Deadlock.** No replica ever waits for another. An entry whose holder died is
still a pending pod (its message comes back to a live replica after the ack wait, which posts it
again): placing it is right. An entry of a pod that was placed or deleted meanwhile is recognised
by the pod's claim and skipped, and swept from KV. **Stale views.** A replica may find a higher
pod fitting on a view the commit then proves stale: the commit loses its compare-and-set as any
commit does, and P is decided again on the refreshed view.

**Cost and bounds.** Nothing when the board is empty or P is ahead of every entry: the board is a
sorted list, P's place in it a bisection. Otherwise at most ``scan`` entries ahead of P are looked
at and at most ``evaluations`` of them decided afresh; the caller memoises "does not fit" per pod
shape until something is freed (in between, room only shrinks, so a shape that did not fit still
does not), so a full cluster with a long backlog costs one decision per distinct waiting shape per
freeing event, not one per commit. The price of the bound: a fitting pod more than ``scan``
entries ahead of P can be passed over (the shell scans 64; a freeing event that lets more than
that many differently-ordered pods fit at once is rare, and those pods are then still placed in
order among themselves by their holders).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from services.placer.core.model import PodRequest, Rejection
from services.placer.core.queue import ReferenceNode, SharedKey, admit, shared_key
from services.placer.rules import translate
from shared.messages.waiting import WaitingPod


@dataclass(frozen=True)
class Posted:
    """One board entry: the waiting pod, its KV revision, its request and its place."""

    waiting: WaitingPod
    revision: int
    request: PodRequest
    key: SharedKey | None
    """None for a request the queue would refuse (never placed first)."""

    @property
    def uid(self) -> str:
        return self.waiting.pod.uid


class WaitingBoard:
    """The board's entries by pod UID, in the shared queue order."""

    def __init__(self, reference: ReferenceNode | None = None) -> None:
        self.reference = reference or ReferenceNode()
        self._posted: dict[str, Posted] = {}
        self._order: list[SharedKey] = []

    def __len__(self) -> int:
        return len(self._posted)

    def get(self, uid: str) -> Posted | None:
        return self._posted.get(uid)

    def uids(self) -> set[str]:
        return set(self._posted)

    def key_of(
        self, request: PodRequest, *, priority_label: int | None, created_at: float
    ) -> SharedKey | None:
        """``request``'s place in the shared order (None: the queue refuses it)."""
        queued = admit(
            request,
            reference=self.reference,
            priority_label=priority_label,
            created_at=created_at,
        )
        return None if isinstance(queued, Rejection) else shared_key(queued)

    def _key(self, waiting: WaitingPod, request: PodRequest) -> SharedKey | None:
        return self.key_of(
            request,
            priority_label=waiting.pod.hints.priority_label,
            created_at=waiting.pod.created_at,
        )

    def put(self, waiting: WaitingPod, revision: int) -> bool:
        """Take ``waiting`` at ``revision``; False when a newer revision of it is held."""
        uid = waiting.pod.uid
        held = self._posted.get(uid)
        if held is not None:
            if revision <= held.revision:
                return False
            self._unorder(held)
        request = translate.pod_request(waiting.pod)
        posted = Posted(
            waiting=waiting, revision=revision, request=request, key=self._key(waiting, request)
        )
        self._posted[uid] = posted
        if posted.key is not None:
            bisect.insort(self._order, posted.key)
        return True

    def remove(self, uid: str, *, before: int | None = None) -> bool:
        """Take ``uid`` off (only a revision older than ``before``, when given)."""
        held = self._posted.get(uid)
        if held is None or (before is not None and held.revision >= before):
            return False
        del self._posted[uid]
        self._unorder(held)
        return True

    def _unorder(self, posted: Posted) -> None:
        if posted.key is None:
            return
        at = bisect.bisect_left(self._order, posted.key)
        if at < len(self._order) and self._order[at] == posted.key:
            del self._order[at]

    def rekey(self, reference: ReferenceNode) -> None:
        """Measure sizes against ``reference`` from now on (every entry placed again)."""
        if reference == self.reference:
            return
        self.reference = reference
        posted = list(self._posted.values())
        self._posted, self._order = {}, []
        for entry in posted:
            self.put(entry.waiting, entry.revision)

    def ahead_of(self, key: SharedKey) -> Iterator[Posted]:
        """The entries ordered strictly before ``key``, first first."""
        end = bisect.bisect_left(self._order, key)
        for at in range(end):
            yield self._posted[self._order[at][-1]]

    def posted(self) -> Iterator[Posted]:
        return iter(list(self._posted.values()))


def first_fitting(
    board: WaitingBoard,
    key: SharedKey,
    *,
    skip: Callable[[str], bool],
    fits: Callable[[PodRequest], bool],
    scan: int,
    evaluations: int,
) -> Posted | None:
    """The first entry ordered before ``key`` that ``fits`` now, or None (see the module doc).

    ``skip(uid)``: entries not to consider (the pod itself, pods already placed or being
    committed). Looks at no more than ``scan`` entries and calls ``fits`` no more than
    ``evaluations`` times, once per pod shape (``PodRequest.placement_key``).
    """
    tried: set[PodRequest] = set()
    called = 0
    for looked, posted in enumerate(board.ahead_of(key)):
        if looked >= scan or called >= evaluations:
            return None
        if skip(posted.uid):
            continue
        shape = posted.request.placement_key()
        if shape in tried:
            continue
        tried.add(shape)
        called += 1
        if fits(posted.request):
            return posted
    return None
