"""The placement core's own values: node and GPU state, the pod request, and the core's answers.

Everything here is a frozen msgspec Struct, so a snapshot can be shared, hashed and compared. The
service shell translates ``shared.messages`` (``PodPending``, ``NodeInventory``) into these types
and ``Decision`` / ``Rejection`` back into ``PlacementDecision`` / ``PlacementRejected``.

Units. CPU in milli-cores, memory in MiB. A GPU's compute is counted in *core milli*: 1000 = all
of its SMs (``tessera.dev/gpu-cores: 30`` is 300 core milli). "GPU milli" is the FGD paper's
measure of how much of a GPU is free: the smaller of its free compute and free memory, each as
thousandths of the whole GPU.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.capacity import model_matches

GPU_MILLI = 1000
"""A whole GPU, in core milli and in GPU milli."""

GpuChoiceName = Literal["binpack", "spread", "first-fit", "colocate", "topology", "fgd", "random"]
NodePolicyName = Literal["binpack", "spread", "fgd", "balanced"]


class GpuState(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One physical GPU: identity, capacity, what Tessera reserved on it and what it observes."""

    index: int
    uuid: str = ""
    model: str = ""
    memory_total_mib: int
    memory_reserved_mib: int = 0
    """Held by shares Tessera placed."""
    memory_foreign_mib: int = 0
    """Held by processes Tessera did not place (live telemetry): not free either."""
    core_milli_reserved: int = 0
    slots_total: int = 0
    """Logical devices the device plugin advertises for this GPU; 0 = no limit."""
    slots_reserved: int = 0
    exclusive: bool = False
    """Held whole by one share (a physical GPU request): nothing else may land on it."""
    healthy: bool = True
    utilization_pct: int = 0
    numa_node: int = -1
    nvlink_peers: tuple[int, ...] = ()
    """Indices of GPUs on the same node reachable over NVLink."""
    groups: frozenset[str] = frozenset()
    """Resource groups (seed 001) this GPU belongs to; filled by the groups extension."""
    holders: tuple[str, ...] = ()
    """UIDs of the pods holding a share of this GPU (sorted, one entry per pod)."""

    @property
    def memory_free_mib(self) -> int:
        return max(0, self.memory_total_mib - self.memory_reserved_mib - self.memory_foreign_mib)

    @property
    def core_milli_free(self) -> int:
        return GPU_MILLI - self.core_milli_reserved

    @property
    def slots_free(self) -> int:
        """Logical devices left; -1 = no limit. Clamped at 0: a view may briefly count more
        shares than slots (a replica's own decision in flight beside another replica's commit)."""
        return max(0, self.slots_total - self.slots_reserved) if self.slots_total else -1

    @property
    def idle(self) -> bool:
        """Nothing reserved on it by Tessera: it can be handed out whole."""
        return (
            self.core_milli_reserved == 0 and self.memory_reserved_mib == 0 and not self.exclusive
        )


class NodeState(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One node: allocatable CPU and memory, what is reserved, its GPUs, its group memberships."""

    name: str
    cpu_milli_total: int
    memory_mib_total: int
    cpu_milli_reserved: int = 0
    memory_mib_reserved: int = 0
    gpus: tuple[GpuState, ...] = ()
    schedulable: bool = True
    """False when cordoned or not ready: no new placements."""
    groups: frozenset[str] = frozenset()
    """Resource groups (seed 001) this node belongs to; filled by the groups extension."""
    gpu_task_kinds: tuple[tuple[str, int], ...] = ()
    """How many GPU pods of each kind ("share", "2-gpu", ...) run here, sorted by kind."""

    @property
    def cpu_milli_free(self) -> int:
        return self.cpu_milli_total - self.cpu_milli_reserved

    @property
    def memory_mib_free(self) -> int:
        return self.memory_mib_total - self.memory_mib_reserved


class ClusterSnapshot(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Every node the placer may use, as seen at one instant."""

    nodes: tuple[NodeState, ...]
    taken_at: float = 0.0


class ContainerRequest(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One container's ask. ``shares`` GPUs, each share on a distinct physical GPU.

    A share with neither memory nor cores given (or a pod with ``gpu_type="physical"``) takes a
    whole GPU exclusively.
    """

    name: str
    shares: int = 0
    share_memory_mib: int | None = None
    share_memory_pct: int | None = None
    share_core_milli: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0


class PodRequest(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """What the core needs to know about a pod to place it."""

    uid: str
    namespace: str = ""
    name: str = ""
    containers: tuple[ContainerRequest, ...] = ()
    gpu_models: tuple[str, ...] = ()
    gpu_models_excluded: tuple[str, ...] = ()
    gpu_type: Literal["physical", "virtual"] | None = None
    gpu_policy: Literal["binpack", "spread", "colocate"] | None = None
    node_policy: NodePolicyName | None = None
    group: str | None = None
    tenant: str = ""
    """The pod's tenant: its namespace until ``Tenancy`` applies the operator's tenancy file,
    which every decision does first (``tenancy.Tenancy.resolve``)."""
    tenant_label: str = ""
    """The tenant the pod asks for with the ``tessera.dev/tenant`` label (empty: none). Only a
    request: ``Tenancy`` grants it when the pod's namespace may choose it, else refuses the pod."""
    priority: int = 0

    def allows_model(self, model: str) -> bool:
        """Whether a GPU of ``model`` may hold this pod (``tessera.dev/gpu-model`` and
        ``-exclude``; see :func:`model_matches`)."""
        if self.gpu_models and not any(model_matches(model, w) for w in self.gpu_models):
            return False
        return not any(model_matches(model, w) for w in self.gpu_models_excluded)

    @property
    def cpu_milli(self) -> int:
        return sum(c.cpu_milli for c in self.containers)

    @property
    def memory_mib(self) -> int:
        return sum(c.memory_mib for c in self.containers)

    @property
    def gpu_shares(self) -> int:
        return sum(c.shares for c in self.containers)

    def placement_key(self) -> PodRequest:
        """The request without identity: two pods with equal keys fit and score identically."""
        return msgspec.structs.replace(self, uid="", namespace="", name="")


class GpuSlice(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One share placed on one GPU."""

    index: int
    uuid: str
    memory_mib: int
    core_milli: int
    exclusive: bool = False


class ContainerPlacement(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    container: str
    gpus: tuple[GpuSlice, ...] = ()


class Reservation(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Everything a placed pod holds on its node: what the ledger books and later gives back."""

    pod_uid: str
    node: str
    cpu_milli: int
    memory_mib: int
    containers: tuple[ContainerPlacement, ...]
    kind: str = ""
    """The pod's GPU task kind ("share", "<k>-gpu", "" for none), for GPU clustering."""


class Decision(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Where a pod goes and why."""

    reservation: Reservation
    score: float
    scores: dict[str, float] = {}
    """Weighted score of each plugin for the chosen node."""
    feasible_nodes: int = 0
    decided_at: float = 0.0

    @property
    def node(self) -> str:
        return self.reservation.node


class RejectionReason(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    reason: str
    nodes: int


class Rejection(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A pod that fits nowhere now, with reasons counted over nodes."""

    pod_uid: str
    reasons: tuple[RejectionReason, ...]
    unresolvable: bool = False
    """No change in the cluster can help (an invalid request)."""
    decided_at: float = 0.0

    @property
    def message(self) -> str:
        parts = [f"{r.nodes} node{'s' if r.nodes != 1 else ''}: {r.reason}" for r in self.reasons]
        return "; ".join(parts) if parts else "no nodes"
