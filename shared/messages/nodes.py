"""``tessera.nodes.<node>``: Kubernetes facts about a node the placer needs (binder -> placer)."""

from __future__ import annotations

from shared.messages.base import Message
from shared.messages.constraints import ExistingPod, Taint


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
