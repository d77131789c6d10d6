"""The placement core's own values: node and GPU state, the pod request, and the core's answers.

Everything here is a frozen msgspec Struct, so a snapshot can be shared, hashed and compared. The
service shell translates ``shared.messages`` (``PodPending``, ``NodeInventory``) into these types
and ``Decision`` / ``Rejection`` back into a ``Booking`` / ``PlacementRejected``.

Units. CPU in milli-cores, memory in MiB. A GPU's compute is counted in *core milli*: 1000 = all
of its SMs (``tessera.dev/gpu-cores: 30`` is 300 core milli). "GPU milli" is the FGD paper's
measure of how much of a GPU is free: the smaller of its free compute and free memory, each as
thousandths of the whole GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Literal, Protocol

import msgspec

from shared.capacity import model_matches
from shared.dra import cel
from shared.dra.devices import MODEL, DeviceDescription, device_name, qualified
from shared.messages.constraints import Constraints, Labels, PodAffinity, Taint

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
    pci_bus_id: str = ""
    """As the inventory reports it (NVML's notation); with ``pcie_root``, only what a DRA
    claim's selectors may read (``devicesel.py``): not in a shape."""
    pcie_root: str = ""
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


class PodOnNode(Protocol):
    """A pod on a node as other pods' affinity, anti-affinity and spread see it: a pod
    Tessera did not place (``shared.messages.constraints.ExistingPod``) or one it booked
    (``shared.messages.ledger.Booking``)."""

    @property
    def namespace(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def affinity(self) -> PodAffinity | None: ...

    @property
    def anti_affinity(self) -> PodAffinity | None: ...


class PlacedPod(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A pod the core itself placed on a node (:class:`Reservation`), as a :class:`PodOnNode`."""

    namespace: str
    labels: Mapping[str, str]
    affinity: PodAffinity | None = None
    anti_affinity: PodAffinity | None = None


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
    labels: Mapping[str, str] = {}
    """The node's Kubernetes labels. Like the taints and pods below, not part of the node's
    shape: node-aware rules (``nodeaware.py``) read them from the index, node by node."""
    taints: tuple[Taint, ...] = ()
    pods: tuple[PodOnNode, ...] = ()
    """Every pod on the node, Tessera's or not."""

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


def model_device(model: str) -> DeviceDescription:
    """A device of which only its ``model`` is known: what selectors reading only the model
    (:func:`model_selectors`) are judged on."""
    return DeviceDescription(name=device_name(0), attributes={qualified(MODEL): model}, capacity={})


@functools.lru_cache(maxsize=4096)
def selects_model(selectors: tuple[str, ...], model: str) -> bool:
    """Whether a GPU of ``model`` satisfies every CEL selector that reads only the model (the
    others are judged on each GPU, ``devicesel.py``)."""
    return cel.select(model_selectors(selectors), model_device(model)) is True


@functools.lru_cache(maxsize=4096)
def model_selectors(selectors: tuple[str, ...]) -> tuple[str, ...]:
    """The selectors that read nothing of a GPU but its model (``cel.reads_model_only``)."""
    return tuple(s for s in selectors if cel.reads_model_only(s))


@functools.lru_cache(maxsize=4096)
def device_selectors(selectors: tuple[str, ...]) -> tuple[str, ...]:
    """The selectors that read more of a GPU than its model: judged GPU by GPU."""
    return tuple(s for s in selectors if not cel.reads_model_only(s))


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
    labels: Labels = ()
    """The pod's labels, sorted: what existing pods' anti-affinity and a spread constraint's
    own-pod match read."""
    constraints: Constraints | None = None
    """``nodeSelector``, affinity, tolerations, topology spread; None: none stated."""
    gpu_selectors: tuple[str, ...] = ()
    """CEL selectors of the pod's DRA claims (docs/design.md §14): each GPU must satisfy them
    all. Those reading only the model are judged with it, shape by shape (a GPU filter);
    the others (index, memory, NUMA node...) on each GPU of a node, node by node
    (``devicesel.py``)."""

    def allows_model(self, model: str) -> bool:
        """Whether a GPU of ``model`` may hold this pod (``tessera.dev/gpu-model`` and
        ``-exclude``; see :func:`model_matches`; and the claims' selectors)."""
        if not (self.gpu_models or self.gpu_selectors or self.gpu_models_excluded):
            return True  # most pods name no model: asked for GPU after GPU of every shape judged
        if self.gpu_models and not any(model_matches(model, w) for w in self.gpu_models):
            return False
        if self.gpu_selectors and not selects_model(self.gpu_selectors, model):
            return False
        return not any(model_matches(model, w) for w in self.gpu_models_excluded)

    @property
    def device_selectors(self) -> tuple[str, ...]:
        """Its selectors judged GPU by GPU (see :attr:`gpu_selectors`)."""
        return device_selectors(self.gpu_selectors) if self.gpu_selectors else ()

    @property
    def cpu_milli(self) -> int:
        return sum(c.cpu_milli for c in self.containers)

    @property
    def memory_mib(self) -> int:
        return sum(c.memory_mib for c in self.containers)

    @property
    def gpu_shares(self) -> int:
        return sum(c.shares for c in self.containers)

    @property
    def counts_pods(self) -> bool:
        """Whether where the pod may go depends on the pods already placed."""
        return self.constraints is not None and self.constraints.counts_pods

    def placement_key(self) -> PodRequest:
        """The request without identity: two pods with equal keys fit and score identically
        (on a cluster whose pods and nodes have not changed)."""
        return msgspec.structs.replace(self, uid="", name="")

    def placed(self) -> PlacedPod | None:
        """This pod once placed, as later pods see it (None when nothing could select it)."""
        if not self.labels and self.constraints is None:
            return None
        constraints = self.constraints
        return PlacedPod(
            namespace=self.namespace,
            labels=dict(self.labels),
            affinity=constraints.pod_affinity if constraints is not None else None,
            anti_affinity=constraints.pod_anti_affinity if constraints is not None else None,
        )

    def shape_key(self) -> PodRequest:
        """What node shapes judge a pod by: its request without identity, labels or node
        constraints (those are judged node by node, ``nodeaware.py``), so that a
        deployment's replicas share the shape memo whatever they ask of nodes."""
        if self.constraints is None and not self.labels:
            return msgspec.structs.replace(self, uid="", namespace="", name="")
        return msgspec.structs.replace(
            self, uid="", namespace="", name="", labels=(), constraints=None
        )


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
    pod: PlacedPod | None = None
    """The pod as later pods' affinity and spread see it (None: a pod with no labels and no
    constraints, which no selector can tell from nothing); booked into ``NodeState.pods``."""


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
