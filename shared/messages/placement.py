"""``tessera.assignments.<node>`` and ``tessera.placements.rejected``: the placer's answers;
``tessera.placements.invalid``: the binder's, for a pod that cannot be placed as written."""

from __future__ import annotations

from shared.messages.base import ContainerSlices, Message


class PlacementDecision(Message, frozen=True, kw_only=True):
    """Where a pod goes: the node and every container's GPU slices, with why."""

    pod_uid: str
    namespace: str
    name: str
    node: str
    containers: tuple[ContainerSlices, ...]
    score: float = 0.0
    scores: dict[str, float] = {}
    """Per-plugin weighted score of the chosen node."""
    explanation: str = ""
    decided_at: float
    placer_id: str
    commit: str = ""
    """The commit the decision announces: the binder binds only that commit's record (the
    record may reach it after the decision). Empty from a placer older than the field: then
    any record of the pod on the node that matches the slices."""


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
