"""The placer's commit state in KV: ``tessera-ledger`` (per pod: its booking and its claim).

Every placer replica reads these; only placers write them, and every write is a compare-and-set
(or a create-only write) on a KV revision, so replicas that decide at the same moment cannot both
win.

``tessera-ledger``, key ``subjects.booking_key(node, uid)``: one :class:`Booking`, what the pod
holds on the node. A decision is committed by writing its booking only if the latest revision
among the node's bookings (``subjects.node_bookings``) is still the one the decision was made
on; a booking is what makes capacity taken, so no GPU is ever over-committed whatever the
replicas do, and each write carries one booking however full the node is. :class:`NodeLedger`
is a node's bookings together, as the placer's view holds them (and as earlier versions stored
them, one entry per node, which a placer turns into booking keys before it is ready).

``tessera-ledger`` again, key ``subjects.claim_key(uid)`` (the pods' claims, ``subjects.
KV_CLAIMS``: the same bucket, so that a booking and its claim can be written by one atomic batch):
a :class:`PodClaim` naming the one booking (by its ``commit`` id) that places the pod. It is
created create-only, so two replicas that booked the same pod on two different nodes cannot both
place it: the loser's batch lands neither its booking nor its claim (or, where the claim is
written after the booking, the loser gives its booking back). A placed claim is the binder's
work: it binds the booking the claim names by writing its assignment record. States:
``placed`` (the booking is the pod's placement), ``requeued`` (the placement was given back after
a failed binding or a reserve timeout; the pod may be placed again by a compare-and-set from this
state), ``deleted`` (the pod is gone; terminal, purged after the retention period).

``tessera-tenants``, key ``subjects.tenant_key(tenant)``: a :class:`TenantLedger` listing every
:class:`TenantCharge` against the quota of a tenant that has one. A commit of such a tenant's pod
adds its charge by compare-and-set, checked against the quota on the entry as read, *before* it
books; a release takes the charge off after the booking. So however many replicas decide at once,
the charges never add up to more than the quota, and every live placement is charged.
"""

from __future__ import annotations

from typing import Literal

from shared.messages.base import Message
from shared.messages.constraints import PodAffinity
from shared.messages.pods import PodPending


class BookedSlice(Message, frozen=True, kw_only=True):
    """One share booked on one GPU, in the placement core's units."""

    index: int
    uuid: str
    memory_mib: int
    core_milli: int
    """Thousandths of the GPU's SMs (``tessera.dev/gpu-cores: 30`` is 300)."""
    exclusive: bool = False
    """A whole GPU, held by this share alone."""


class BookedContainer(Message, frozen=True, kw_only=True):
    """The shares one container holds, and its Tessera resource limits (for the record)."""

    container: str
    gpus: tuple[BookedSlice, ...]
    resources: dict[str, int] = {}


class Booking(Message, frozen=True, kw_only=True):
    """Everything one placed pod holds on its node; enough to write its assignment record."""

    pod_uid: str
    namespace: str
    name: str
    node: str
    commit: str
    """Unique id of the commit that made this booking (claim and record carry the same id)."""
    tenant: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    kind: str = ""
    """GPU task kind ("share", "<k>-gpu", "" for none), as the placement core counts it."""
    containers: tuple[BookedContainer, ...] = ()
    decided_at: float
    placer_id: str
    labels: dict[str, str] = {}
    """The pod's labels, and below its own pod (anti-)affinity: what later pods' constraints
    read of it while it is booked here."""
    affinity: PodAffinity | None = None
    anti_affinity: PodAffinity | None = None


class NodeLedger(Message, frozen=True, kw_only=True):
    """Every booking on one node (``tessera-ledger``)."""

    node: str
    bookings: tuple[Booking, ...] = ()
    updated_at: float = 0.0


ClaimState = Literal["placed", "requeued", "deleted"]


class PodClaim(Message, frozen=True, kw_only=True):
    """Which booking places a pod (its claim); see the module docstring for states."""

    pod_uid: str
    state: ClaimState
    booking: Booking | None = None
    """The placement (``placed``) or the one given back (``requeued``, ``deleted``)."""
    request: PodPending | None = None
    """The pod as last seen pending, to place it again after a requeue."""
    updated_at: float
    reason: str = ""
    """Why the claim is in its state (for ``requeued`` and ``deleted``)."""
    requeue_published: bool = False
    """``requeued`` only: the pod was put back on ``tessera.pods.pending``."""


class TenantCharge(Message, frozen=True, kw_only=True):
    """What one commit of one pod counts against its tenant's quota (``tessera-tenants``).

    Names the commit's pod and node so that reconciliation can fence the commit's record (leave
    it ``released``) before it gives back a charge whose commit never booked.
    """

    pod_uid: str
    namespace: str
    name: str
    node: str
    commit: str
    gpus: int
    """GPU shares (a whole GPU and a slice each count one)."""
    gpu_memory_mib: int
    charged_at: float
    placer_id: str = ""


class TenantLedger(Message, frozen=True, kw_only=True):
    """Every charge against one tenant's quota (``tessera-tenants``)."""

    tenant: str
    charges: tuple[TenantCharge, ...] = ()
    updated_at: float = 0.0
