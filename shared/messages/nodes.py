"""``tessera.nodes.<node>``: Kubernetes facts about a node the placer needs (binder -> placer)."""

from __future__ import annotations

from shared.messages.base import Message


class NodeFacts(Message, frozen=True, kw_only=True):
    """CPU and memory capacity and use, the labels that matter, and readiness of one node."""

    node: str
    cpu_allocatable_milli: int
    memory_allocatable_mib: int
    cpu_requested_milli: int = 0
    memory_requested_mib: int = 0
    labels: dict[str, str] = {}
    """Only the labels placement reads (GPU model, groups, tenants, topology)."""
    ready: bool = True
    schedulable: bool = True
    """False when the node is cordoned."""
    observed_at: float = 0.0
    deleted: bool = False
    """True when the node left the cluster: forget it."""
    extended_allocatable: dict[str, int] = {}
    """The node's ``status.allocatable`` entries for ``tessera.dev/*`` resources (what the device
    plugin advertised through the kubelet)."""
