"""``tessera.placements.rejected``: the placer's answer for a pod that fits nowhere now;
``tessera.placements.invalid``: the binder's, for a pod that cannot be placed as written. (A pod
that fits is answered by its booking and claim in ``tessera-ledger``, ``shared.messages.ledger``.)
"""

from __future__ import annotations

from shared.messages.base import Message


class RejectionReason(Message, frozen=True, kw_only=True):
    """One reason a pod did not fit, with how many nodes gave it."""

    reason: str
    nodes: int


class PlacementRejected(Message, frozen=True, kw_only=True):
    """A pod that fits nowhere now, with counted reasons ("3 nodes: insufficient GPU memory")."""

    pod_uid: str
    namespace: str
    name: str
    reasons: tuple[RejectionReason, ...]
    message: str = ""
    unresolvable: bool = False
    """True when no change in the cluster can make it fit (for example an invalid request)."""
    decided_at: float
    placer_id: str


class PodInvalid(Message, frozen=True, kw_only=True):
    """A Tessera pod whose request cannot be placed as written (``tessera.placements.invalid``).

    The binder never publishes it as pending; it explains it on the pod (``message`` is that
    line) and says so here, so that the dashboard counts it among the Pending pods."""

    pod_uid: str
    namespace: str
    name: str
    message: str
    fields: tuple[str, ...] = ()
    """The fields at fault, as ``kubectl explain`` names them."""
    at: float
