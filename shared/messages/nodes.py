"""``tessera.nodes.<node>``: Kubernetes facts about a node the placer needs (binder -> placer)."""

from __future__ import annotations

from shared.messages.base import Message
from shared.messages.constraints import ExistingPod, Taint


class ClaimedGpu(Message, frozen=True, kw_only=True):
    """A share of one GPU that a ``gpu.tessera.dev`` ResourceClaim holds through an allocation
    Tessera did not make for one of its pods (docs/design.md §14)."""

    claim: str
    """``namespace/name`` of the ResourceClaim."""
    index: int
    """The GPU's index (device ``gpu-<index>``)."""
    memory_mib: int = 0
    core_milli: int = 0
    """Thousandths of the GPU's SMs (``compute: 25`` is 250)."""
    exclusive: bool = False
    """The whole GPU (an allocation consuming no stated capacity)."""


class NodeFacts(Message, frozen=True, kw_only=True):
    """CPU and memory capacity and use, the labels that matter, and readiness of one node."""

    node: str
    cpu_allocatable_milli: int
    memory_allocatable_mib: int
    cpu_requested_milli: int = 0
    """Summed over every non-terminated pod bound to the node (any scheduler), as
    kube-scheduler counts requests."""
    memory_requested_mib: int = 0
    labels: dict[str, str] = {}
    """The node's labels (group and permission selectors, ``nodeSelector`` and affinity may name
    any of them)."""
    ready: bool = True
    schedulable: bool = True
    """False when the node is cordoned."""
    observed_at: float = 0.0
    deleted: bool = False
    """True when the node left the cluster: forget it."""
    extended_allocatable: dict[str, int] = {}
    """The node's ``status.allocatable`` entries for ``tessera.dev/*`` resources: what the device
    plugin advertised through the kubelet (``tessera.dev/gpu`` = logical devices)."""
    tessera_cpu_requested_milli: int = 0
    """The part of ``cpu_requested_milli`` held by pods with Tessera's scheduler name (bound and
    not terminated): the placer's own bookings already count these, so it subtracts them."""
    tessera_memory_requested_mib: int = 0
    """The part of ``memory_requested_mib`` held by Tessera's pods (see above)."""
    taints: tuple[Taint, ...] = ()
    """``spec.taints``: what a pod must tolerate to be placed here."""
    pods: tuple[ExistingPod, ...] = ()
    """The node's running pods that are not Tessera's (the placer knows its own from their
    bookings): what other pods' affinity, anti-affinity and topology spread count. Terminating
    pods are left out, as kube-scheduler leaves them out of spreading."""
    claimed: tuple[ClaimedGpu, ...] = ()
    """GPU capacity held by ``gpu.tessera.dev`` claims allocated on the node by another
    allocator (reserved for no Tessera pod): the placer counts it as used, so it is never
    booked twice."""
