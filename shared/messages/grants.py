"""What a node's device plugin granted, subject ``tessera.grants.<node>`` (request/reply).

The device plugin keeps every grant in its state file (``services/deviceplugin/grants.py``),
across its own restarts and across NATS losing its store, until the pod's record is released.
Before the binder restores placements into a store that lost them (docs/design.md §12), it asks
each node's plugin (:class:`GrantsRequest`); the answer (:class:`NodeGrants`) is what each
container of each pod was actually handed there, and the node's GPUs, against which the
placements read from the pods' annotations are checked (``services/binder/rules/restorecheck.py``).
"""

from __future__ import annotations

from shared.messages.base import ContainerSlices, Message


class GrantsRequest(Message, frozen=True, kw_only=True):
    node: str


class GrantedPod(Message, frozen=True, kw_only=True):
    """What the plugin handed one pod: its commit and each granted container's slices."""

    pod_uid: str
    commit: str
    containers: tuple[ContainerSlices, ...]
    """The containers granted so far, in order, with the slices they were handed (empty slices:
    granted by a plugin from before slices were kept)."""


class NodeGpu(Message, frozen=True, kw_only=True):
    uuid: str
    index: int
    memory_mib: int


class NodeGrants(Message, frozen=True, kw_only=True):
    """A device plugin's answer: its node's GPUs and every pod it granted GPUs to."""

    node: str
    gpus: tuple[NodeGpu, ...]
    granted: tuple[GrantedPod, ...]
    answered_at: float
