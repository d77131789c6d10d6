"""Seed 001: resource groups of nodes and GPUs per tenant, and the choice of a pod's group.

Operators bind nodes, and optionally specific GPUs on them, into named *resource groups* for one
or more tenants (:class:`ResourceGroup`). Groups may overlap and may share GPUs. Which node and
GPUs a group holds is worked out from the config and the current nodes by :func:`resolve` (a
:class:`Membership`), and written onto ``NodeState.groups`` / ``GpuState.groups`` by
:func:`annotate`, where the ``group`` filter (``plugins/groups.py``) reads it.

Tenants. A pod's tenant is its namespace, or what the operator maps the namespace to
(:class:`NamespaceTenancy`: ``{"namespace": "ml-dev", "tenant": "ml"}``). The
``tessera.dev/tenant`` label is only a request (:func:`choose_tenant`): it may name the
namespace's own tenant or one of the entry's ``choices``, and any other value refuses the pod
(unresolvable, explained, tried again when the tenancy file changes) rather than placing it under
a tenant, quota or group its namespace was never given. Everything below works on the tenant so
chosen, so a group (``tessera.dev/group``) is open to a pod only when its tenant is listed.

Permissions. A tenant listed in ``permissions`` may only use the nodes and GPUs its entry selects
(tenants without an entry are unrestricted). Groups are resolved *only over what every one of their
tenants is permitted to use*, so a group can never hand a tenant a GPU it has no right to. A
restricted tenant's pods that use no group still stay inside the permitted set: it is resolved as
an implicit group named ``tenant:<tenant>`` (the colon keeps it apart from operators' names).

Group choice (:func:`choose_group`), for one pod:

- the pod names a group (``tessera.dev/group``): that group, if it exists, the pod's tenant may use
  it, and its GPU type and model suit the pod; otherwise an unresolvable rejection;
- otherwise, a GPU pod of a tenant with groups: among the tenant's groups whose GPU type (physical =
  whole exclusive GPUs, virtual = shared slices) and model suit the pod, the *best fit*: the group
  whose remaining GPU capacity exceeds the demand by the least (ties: the group name). If none
  has room, the pod waits (an unschedulable rejection saying the most any group has left);
- otherwise (no GPU, or a tenant without groups): the tenant's implicit permission group when it
  is restricted, else no group at all.

Capacity is counted in GPU milli (a whole GPU is 1000): for a pod of whole GPUs, 1000 per idle
healthy member GPU on a schedulable node; for a pod of shares, the free GPU milli of each healthy
member GPU (the smaller of its free compute and free memory fractions). Only GPUs of a model the
pod allows count. The demand is the pod's shares in GPU milli, each the larger of its compute and
memory fractions, memory measured on the group's smallest GPU (so it is never underestimated).

Automatic grouping (:func:`propose_groups`): per GPU model, the permitted GPUs of that model are
split among the tenants' estimated demands, largest demand first; a tenant takes whole nodes while
its demand covers them and single GPUs of the next node for the remainder, so a node's GPUs can be
split between tenants (the seed's point: the GPU, not the machine, is the unit of grouping).

Everything here is pure: new config in, new membership and node states out; the caller decides
when (``Tenancy.configure`` swaps it live, without a restart).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from services.placer.core.facts import PodFacts
from services.placer.core.model import GPU_MILLI, GpuState, NodeState
from services.placer.core.shape import gpu_free_milli
from shared.annotations import TENANT_LABEL

GpuKind = Literal["physical", "virtual"]

IMPLICIT_PREFIX = "tenant:"
"""Name prefix of the implicit group holding what a restricted tenant is permitted to use."""

_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")


class NodeSelector(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Nodes by name, or by labels (every given label must match). Both empty = every node."""

    names: tuple[str, ...] = ()
    labels: dict[str, str] = {}

    def selects(self, node: str, node_labels: Mapping[str, str]) -> bool:
        if self.names and node not in self.names:
            return False
        return all(node_labels.get(k) == v for k, v in self.labels.items())


class GpuSelector(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """GPUs on the selected nodes: by UUID, by index, by model. All empty = every GPU."""

    uuids: tuple[str, ...] = ()
    indices: tuple[int, ...] = ()
    model: str | None = None

    def selects(self, gpu: GpuState) -> bool:
        if self.uuids and gpu.uuid not in self.uuids:
            return False
        if self.indices and gpu.index not in self.indices:
            return False
        return self.model is None or gpu.model == self.model


class ResourceGroup(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A named set of nodes and GPUs that some tenants place their pods into."""

    name: str
    tenants: tuple[str, ...]
    """Tenants that may use the group (a pod's tenant: see :func:`choose_tenant`)."""
    nodes: NodeSelector = NodeSelector()
    gpus: GpuSelector = GpuSelector()
    gpu_type: GpuKind | None = None
    """``physical``: only whole exclusive GPUs; ``virtual``: only shared slices; None: both."""


class TenantPermission(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one tenant may use at all; tenants without an entry may use everything."""

    tenant: str
    nodes: NodeSelector = NodeSelector()
    gpus: GpuSelector = GpuSelector()


class TenantQuota(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Upper limits for one tenant; None = no limit.

    ``gpus`` counts ``tessera.dev/gpu`` shares (a whole GPU and a slice each count one, as a
    Kubernetes ResourceQuota on the resource would); ``gpu_memory_mib`` caps the GPU memory of all
    the tenant's shares (a whole GPU counts the memory it was handed).
    """

    tenant: str
    gpus: int | None = None
    gpu_memory_mib: int | None = None


class NamespaceTenancy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The tenant of one namespace's pods, and the others they may choose with the label."""

    namespace: str
    tenant: str | None = None
    """The tenant of the namespace's pods (None: the namespace's own name)."""
    choices: tuple[str, ...] = ()
    """Further tenants its pods may choose with the ``tessera.dev/tenant`` label."""

    @property
    def own(self) -> str:
        return self.namespace if self.tenant is None else self.tenant


class TenancyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The operator's seed 001 config: namespaces' tenants, groups, permissions and quotas.
    Validated by ``check``."""

    namespaces: tuple[NamespaceTenancy, ...] = ()
    groups: tuple[ResourceGroup, ...] = ()
    permissions: tuple[TenantPermission, ...] = ()
    quotas: tuple[TenantQuota, ...] = ()

    def check(self) -> TenancyConfig:
        """``self`` if consistent, else ``ValueError`` naming the first problem (load time)."""
        named: set[str] = set()
        for entry in self.namespaces:
            if not entry.namespace:
                raise ValueError("a namespaces entry has an empty namespace")
            if entry.namespace in named:
                raise ValueError(f"namespace {entry.namespace!r} has more than one entry")
            named.add(entry.namespace)
            if not entry.own or not all(entry.choices):
                raise ValueError(f"namespace {entry.namespace!r}: a tenant cannot be empty")
        seen: set[str] = set()
        for group in self.groups:
            if not _NAME.match(group.name):
                raise ValueError(
                    f"group {group.name!r}: a name is 1..63 lower-case letters, digits, '.', '_' "
                    "or '-', starting and ending with a letter or digit"
                )
            if group.name in seen:
                raise ValueError(f"group {group.name!r} is defined twice")
            seen.add(group.name)
            if not group.tenants:
                raise ValueError(f"group {group.name!r}: list at least one tenant")
        for kind, tenants in (
            ("permission", [p.tenant for p in self.permissions]),
            ("quota", [q.tenant for q in self.quotas]),
        ):
            twice = sorted({t for t in tenants if tenants.count(t) > 1})
            if twice:
                raise ValueError(f"tenant {twice[0]!r} has more than one {kind} entry")
        for quota in self.quotas:
            for limit in (quota.gpus, quota.gpu_memory_mib):
                if limit is not None and limit < 0:
                    raise ValueError(f"quota of tenant {quota.tenant!r}: limits cannot be negative")
        return self

    def quota_of(self, tenant: str) -> TenantQuota | None:
        return next((q for q in self.quotas if q.tenant == tenant), None)

    def namespace_of(self, namespace: str) -> NamespaceTenancy | None:
        return next((n for n in self.namespaces if n.namespace == namespace), None)

    def permission_of(self, tenant: str) -> TenantPermission | None:
        return next((p for p in self.permissions if p.tenant == tenant), None)

    def group(self, name: str) -> ResourceGroup | None:
        return next((g for g in self.groups if g.name == name), None)


def load_config(data: bytes | str | Mapping[str, object]) -> TenancyConfig:
    """A checked :class:`TenancyConfig` from JSON text or already-parsed data (a ConfigMap).

    Raises ``msgspec.ValidationError`` (with the path of the bad field) or ``ValueError``.
    """
    if isinstance(data, bytes | str):
        return msgspec.json.decode(data, type=TenancyConfig).check()
    return msgspec.convert(data, TenancyConfig).check()


# -- tenants -------------------------------------------------------------------------------------


class TenantChoice(msgspec.Struct, frozen=True, kw_only=True):
    """A pod's tenant, or why its ``tessera.dev/tenant`` label cannot be granted."""

    tenant: str
    """The tenant granted; when refused, the namespace's own (what the pod would be without the
    label)."""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason


def choose_tenant(namespace: str, label: str, entry: NamespaceTenancy | None) -> TenantChoice:
    """The tenant of a pod of ``namespace`` labelled ``label`` (empty: no label), under the
    namespace's ``entry`` of the tenancy file (None: it has none, its tenant is its name).

    The label may name the namespace's own tenant or one of its ``choices``; anything else is
    refused, never granted and never silently dropped (the pod's owner asked for a tenant, quota
    or group the operator did not give the namespace, and should see why it waits).
    """
    own = entry.own if entry is not None else namespace
    if not label or label == own or (entry is not None and label in entry.choices):
        return TenantChoice(tenant=label or own)
    allowed = ", ".join((own, *entry.choices) if entry is not None else (own,))
    return TenantChoice(
        tenant=own,
        reason=f"label {TENANT_LABEL}: namespace {namespace} may not choose tenant {label!r} "
        f"(it may choose: {allowed})",
    )


# -- membership ----------------------------------------------------------------------------------


NodeMembers = Mapping[str, frozenset[int]]
"""Node name -> indices of the node's GPUs in the group (empty: the node, none of its GPUs)."""


class Membership(msgspec.Struct, frozen=True, kw_only=True):
    """Resolved groups: for each group (implicit ones included), its nodes and their GPUs."""

    groups: dict[str, dict[str, frozenset[int]]] = {}

    def members(self, group: str) -> NodeMembers:
        return self.groups.get(group, {})


def implicit_group(tenant: str) -> str:
    return f"{IMPLICIT_PREFIX}{tenant}"


def _permitted(
    permission: TenantPermission | None, node: NodeState, labels: Mapping[str, str]
) -> tuple[bool, frozenset[int]]:
    all_gpus = frozenset(g.index for g in node.gpus)
    if permission is None:
        return True, all_gpus
    if not permission.nodes.selects(node.name, labels):
        return False, frozenset()
    return True, frozenset(g.index for g in node.gpus if permission.gpus.selects(g))


def resolve(
    config: TenancyConfig,
    nodes: Iterable[NodeState],
    *,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Membership:
    """Which nodes and GPUs each group holds, within its tenants' permissions."""
    labels = node_labels or {}
    permissions = {p.tenant: p for p in config.permissions}
    resolved: dict[str, dict[str, frozenset[int]]] = {g.name: {} for g in config.groups}
    resolved.update({implicit_group(t): {} for t in permissions})
    for node in nodes:
        node_labels_ = labels.get(node.name, {})
        permitted = {tenant: _permitted(p, node, node_labels_) for tenant, p in permissions.items()}
        for tenant, (allowed, gpus) in permitted.items():
            if allowed:
                resolved[implicit_group(tenant)][node.name] = gpus
        for group in config.groups:
            if not group.nodes.selects(node.name, node_labels_):
                continue
            gpus = frozenset(g.index for g in node.gpus if group.gpus.selects(g))
            allowed = True
            for tenant in group.tenants:
                ok, tenant_gpus = permitted.get(tenant, (True, gpus))
                allowed = allowed and ok
                gpus &= tenant_gpus
            if allowed:
                resolved[group.name][node.name] = gpus
    return Membership(groups=resolved)


def annotate(node: NodeState, membership: Membership) -> NodeState:
    """``node`` with ``groups`` on it and its GPUs set from ``membership`` (others cleared)."""
    node_groups = frozenset(
        name for name, members in membership.groups.items() if node.name in members
    )
    if not node_groups and not node.groups and not any(gpu.groups for gpu in node.gpus):
        return node  # no group holds the node (every node, with no groups configured)
    changed = node_groups != node.groups
    gpus = []
    for gpu in node.gpus:
        groups = frozenset(
            name for name in node_groups if gpu.index in membership.groups[name][node.name]
        )
        if groups != gpu.groups:
            # Only a GPU whose groups change is copied: the others stay the objects they were.
            gpu = msgspec.structs.replace(gpu, groups=groups)
            changed = True
        gpus.append(gpu)
    if not changed:
        return node
    return msgspec.structs.replace(node, groups=node_groups, gpus=tuple(gpus))


# -- choice --------------------------------------------------------------------------------------


def pod_gpu_kind(pod: PodFacts) -> GpuKind | None:
    """``physical`` when every share is a whole GPU, ``virtual`` for slices, None without GPUs."""
    if not pod.asks:
        return None
    return "physical" if all(a.whole for a in pod.asks) else "virtual"


def _room(pod: PodFacts, members: NodeMembers, nodes: Mapping[str, NodeState]) -> tuple[int, int]:
    """(remaining GPU milli, memory of the smallest member GPU of an allowed model; 0: none)."""
    whole = pod_gpu_kind(pod) == "physical"
    total = 0
    smallest = 0
    for name, indices in members.items():
        node = nodes.get(name)
        if node is None:
            continue
        for gpu in node.gpus:
            if gpu.index not in indices or not pod.request.allows_model(gpu.model):
                continue
            if not smallest or gpu.memory_total_mib < smallest:
                smallest = gpu.memory_total_mib
            if not node.schedulable or not gpu.healthy:
                continue
            if whole:
                total += GPU_MILLI if gpu.idle else 0
            else:
                total += gpu_free_milli(gpu)
    return total, smallest


def remaining_milli(pod: PodFacts, members: NodeMembers, nodes: Mapping[str, NodeState]) -> int:
    """The group's remaining GPU capacity for ``pod``, in GPU milli (see the module docstring)."""
    return _room(pod, members, nodes)[0]


def demand_milli(pod: PodFacts, gpu_memory_mib: int) -> int:
    """``pod``'s GPU demand in GPU milli, memory measured on a GPU of ``gpu_memory_mib``."""
    return sum(ask.shares * ask.milli_on(gpu_memory_mib) for ask in pod.asks)


class GroupChoice(msgspec.Struct, frozen=True, kw_only=True):
    """The group a pod goes into (None: no restriction), or why it cannot be placed."""

    group: str | None = None
    reason: str = ""
    unresolvable: bool = False

    @property
    def ok(self) -> bool:
        return not self.reason


def _suits(group: ResourceGroup, pod: PodFacts) -> str:
    """Empty when ``group`` suits the pod's GPU type and model, else why not."""
    kind = pod_gpu_kind(pod)
    if group.gpu_type is not None and kind is not None and group.gpu_type != kind:
        wants = "whole GPUs" if kind == "physical" else "shared GPU slices"
        return f"group {group.name!r} is for {group.gpu_type} GPUs; the pod asks for {wants}"
    model = group.gpus.model
    if model is not None and kind is not None and not pod.request.allows_model(model):
        return f"group {group.name!r} holds {model} GPUs, which the pod does not allow"
    return ""


def choose_group(
    pod: PodFacts,
    config: TenancyConfig,
    membership: Membership,
    nodes: Mapping[str, NodeState],
) -> GroupChoice:
    """The pod's group by label, else best fit among its tenant's groups (module docstring)."""
    request = pod.request
    tenant = request.tenant
    if request.group is not None:
        group = config.group(request.group)
        if group is None:
            return GroupChoice(
                reason=f"unknown resource group {request.group!r}", unresolvable=True
            )
        if tenant not in group.tenants:
            return GroupChoice(
                reason=f"tenant {tenant}: may not use resource group {group.name!r}",
                unresolvable=True,
            )
        why_not = _suits(group, pod)
        if why_not:
            return GroupChoice(reason=why_not, unresolvable=True)
        return GroupChoice(group=group.name)
    restricted = config.permission_of(tenant) is not None
    fallback = GroupChoice(group=implicit_group(tenant) if restricted else None)
    if not pod.asks:
        return fallback
    own = [g for g in config.groups if tenant in g.tenants]
    if not own:
        return fallback
    room = {
        g.name: _room(pod, membership.members(g.name), nodes) for g in own if not _suits(g, pod)
    }
    # A group without a single GPU of a model the pod allows does not suit it either.
    room = {name: found for name, found in room.items() if found[1]}
    if not room:
        kind = pod_gpu_kind(pod)
        return GroupChoice(
            reason=f"tenant {tenant}: no resource group offers {kind} GPUs of an allowed model",
            unresolvable=True,
        )
    # Slack = remaining minus demand, the demand measured on the group's smallest GPU.
    slack = {name: left - demand_milli(pod, smallest) for name, (left, smallest) in room.items()}
    fitting = [name for name, extra in slack.items() if extra >= 0]
    if not fitting:
        best = max(room, key=lambda name: (slack[name], name))
        return GroupChoice(
            reason=f"tenant {tenant}: no resource group has room (needs "
            f"{demand_milli(pod, room[best][1])} GPU milli, the most any group has left is "
            f"{room[best][0]})"
        )
    return GroupChoice(group=min(fitting, key=lambda name: (slack[name], name)))


# -- automatic grouping --------------------------------------------------------------------------


class TenantDemand(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A tenant's estimated need: so many GPUs of one model (and, optionally, of one type)."""

    tenant: str
    gpu_model: str
    gpus: int
    gpu_type: GpuKind | None = None


class AutoGrouping(msgspec.Struct, frozen=True, kw_only=True):
    """Proposed groups (the operator confirms or edits them) and demand left uncovered."""

    groups: tuple[ResourceGroup, ...]
    shortfalls: dict[str, int] = {}
    """Group name -> GPUs of the estimate that no permitted GPU could cover."""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def propose_groups(
    nodes: Sequence[NodeState],
    demands: Sequence[TenantDemand],
    *,
    permissions: Sequence[TenantPermission] = (),
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> AutoGrouping:
    """Split GPUs of each model among the tenants' estimated demands (see the module docstring).

    Deterministic: nodes are taken in name order, demands largest first (then tenant name). Each
    proposed group is one tenant's, named ``auto-<tenant>-<model>``, and selects its nodes by name
    and its GPUs by UUID, so it stays exact when the cluster changes.
    """
    labels = node_labels or {}
    by_tenant = {p.tenant: p for p in permissions}
    taken: set[tuple[str, int]] = set()
    groups: list[ResourceGroup] = []
    shortfalls: dict[str, int] = {}
    ordered = sorted(demands, key=lambda d: (d.gpu_model, -d.gpus, d.tenant))
    for demand in ordered:
        if demand.gpus <= 0:
            continue
        free_by_node: list[tuple[NodeState, list[GpuState]]] = []
        for node in sorted(nodes, key=lambda n: n.name):
            allowed, permitted = _permitted(
                by_tenant.get(demand.tenant), node, labels.get(node.name, {})
            )
            if not allowed:
                continue
            free = [
                g
                for g in sorted(node.gpus, key=lambda g: g.index)
                if g.model == demand.gpu_model
                and g.index in permitted
                and (node.name, g.index) not in taken
            ]
            if free:
                free_by_node.append((node, free))
        # Whole nodes first, largest first, while they fit in what is still needed; then single
        # GPUs from the node whose free count is closest above the remainder (least left over).
        need = demand.gpus
        chosen: list[tuple[NodeState, list[GpuState]]] = []
        for node, free in sorted(free_by_node, key=lambda nf: (-len(nf[1]), nf[0].name)):
            if len(free) <= need:
                chosen.append((node, free))
                need -= len(free)
        while need > 0:
            used = {n.name for n, _ in chosen}
            rest = [nf for nf in free_by_node if nf[0].name not in used]
            if not rest:
                break
            covering = [nf for nf in rest if len(nf[1]) >= need]
            if covering:
                node, free = min(covering, key=lambda nf: (len(nf[1]), nf[0].name))
            else:
                node, free = min(rest, key=lambda nf: (-len(nf[1]), nf[0].name))
            chosen.append((node, free[:need]))
            need -= len(free[:need])
        if not chosen:
            continue
        base = f"auto-{_slug(demand.tenant)}-{_slug(demand.gpu_model)}"
        if demand.gpu_type is not None:
            base = f"{base}-{demand.gpu_type}"
        name = _unique(base[:60].rstrip("-._"), {g.name for g in groups})
        for node, gpus in chosen:
            taken.update((node.name, g.index) for g in gpus)
        groups.append(
            ResourceGroup(
                name=name,
                tenants=(demand.tenant,),
                nodes=NodeSelector(names=tuple(sorted(n.name for n, _ in chosen))),
                gpus=GpuSelector(
                    uuids=tuple(sorted(g.uuid for _, gpus in chosen for g in gpus)),
                    model=demand.gpu_model,
                ),
                gpu_type=demand.gpu_type,
            )
        )
        if need > 0:
            shortfalls[name] = need
    return AutoGrouping(groups=tuple(groups), shortfalls=shortfalls)
