"""``tessera.pods.pending`` / ``.deleted`` / ``.restore``: pods to place, pods gone, placements to
restore (binder -> placer).

The binder parses the pod spec and the docs/design.md §3 annotations into these typed fields at the
edge, so the placer never reads raw annotations.
"""

from __future__ import annotations

from typing import Literal

from shared.messages.base import ContainerSlices, GpuPolicy, GpuType, Message, NodePolicy
from shared.messages.constraints import Constraints
from shared.messages.resourceclaims import PodResourceClaim


class ContainerRequest(Message, frozen=True, kw_only=True):
    """What one container asks for. ``gpu_shares`` = 0 means a container without GPU."""

    name: str
    gpu_shares: int = 0
    """``tessera.dev/gpu``: shares, each on a distinct physical GPU."""
    gpu_memory_mib: int | None = None
    """``tessera.dev/gpu-memory``: MiB per share."""
    gpu_memory_pct: int | None = None
    """``tessera.dev/gpu-memory-percentage``: percent of the GPU's memory per share."""
    gpu_cores: int | None = None
    """``tessera.dev/gpu-cores``: percent of the GPU's SMs per share (1..100)."""
    cpu_milli: int = 0
    memory_mib: int = 0
    resources: dict[str, int] = {}
    """The raw Tessera extended-resource limits, kept for the device-plugin hand-off."""


class PlacementHints(Message, frozen=True, kw_only=True):
    """The user-settable annotations and labels of docs/design.md §3, parsed and validated."""

    gpu_policy: GpuPolicy | None = None
    node_policy: NodePolicy | None = None
    gpu_models: tuple[str, ...] = ()
    """``tessera.dev/gpu-model``: allowed models (empty = any)."""
    gpu_models_excluded: tuple[str, ...] = ()
    gpu_type: GpuType | None = None
    group: str | None = None
    tenant: str = ""
    """The ``tessera.dev/tenant`` label as the pod sets it (empty: none). A request, never the
    tenant itself: the placer grants it only when the pod's namespace may choose it."""
    priority_label: int | None = None
    """``tessera.dev/priority`` label, refining ``priority`` among equals."""


class PodPending(Message, frozen=True, kw_only=True):
    """A pod with ``schedulerName: tessera`` that has no node yet (or, with ``extender``, a pod
    kube-scheduler is binding through the placer's scheduler extender)."""

    uid: str
    namespace: str
    name: str
    containers: tuple[ContainerRequest, ...]
    priority: int = 0
    hints: PlacementHints = PlacementHints()
    created_at: float = 0.0
    """Seconds since the epoch (pod creationTimestamp)."""
    resource_version: str = ""
    extender: bool = False
    """Scheduled by kube-scheduler through the extender (issue 14): kube-scheduler chooses its
    node, so a placement given back is never put on ``tessera.pods.pending`` again (kube-scheduler
    tries the pod again by itself). Never published on ``tessera.pods.pending``."""
    labels: dict[str, str] = {}
    """The pod's labels: what other pods' affinity, anti-affinity and spread select it by."""
    constraints: Constraints | None = None
    """``nodeSelector``, affinity, tolerations and topology spread (``shared.scheduling``);
    None when the pod states none."""
    claims: tuple[PodResourceClaim, ...] = ()
    """The pod's DRA ResourceClaims (docs/design.md §14), as the binder read them; the placer
    places those of class ``gpu.tessera.dev`` (``shared.dra.claims``)."""


class PodDeleted(Message, frozen=True, kw_only=True):
    """A Tessera pod that was deleted or finished: its GPUs are free again."""

    uid: str
    namespace: str
    name: str
    node: str | None = None
    deleted_at: float = 0.0


class PodRestore(Message, frozen=True, kw_only=True):
    """A bound pod whose placement the store lost (``shared.messages.epoch``): what the binder
    reads of it in the Kubernetes API, for a placer to book, claim and record again as it was."""

    pod: PodPending
    """The pod's request as its spec says now (CPU, memory, tenant, whole or shared GPUs)."""
    node: str
    containers: tuple[ContainerSlices, ...]
    """Its GPU slices, from ``tessera.dev/assignment`` (each container's resources from its
    spec)."""
    decided_at: float
    placer_id: str
    commit: str
    """The annotation's commit id, or one made up for it when the annotation predates them."""
    state: Literal["bound", "allocated"]
    """``allocated`` once the pod carries ``tessera.dev/assigned: "true"``."""
    bound_at: float | None = None
    epoch: str
    """The store epoch it is restored into (a restore meant for another store is dropped)."""
