"""The waiting board, KV bucket ``tessera-waiting`` keyed by pod UID (``subjects.waiting_key``).

A placer replica that holds a pod waiting for room (its JetStream message kept in progress)
writes the pod here, so that every replica knows which pods wait and in which order (seed 002):
before a replica commits a pod, it places any pod ordered before it that fits now first, whoever
holds it (``services/placer/rules/board.py`` has the design). Entries are hints for the order, never
the truth about a pod: the pod's claim (in ``tessera-ledger``) says whether it is placed, and its
message in the ``TESSERA_PODS`` stream is what keeps it from being lost.
"""

from __future__ import annotations

from shared.messages.base import Message
from shared.messages.pods import PodPending


class WaitingPod(Message, frozen=True, kw_only=True):
    """A pod a replica holds waiting for room."""

    pod: PodPending
    """The pod as last seen pending: enough for any replica to decide it."""
    holder: str
    """The placer id of the replica holding the pod's message."""
    since: float
    """When it started waiting here (seconds since the epoch)."""
    updated_at: float
