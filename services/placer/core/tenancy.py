"""Seed 001 put together: the live groups, permissions and quotas the placer decides with.

:class:`Tenancy` holds the operator's current :class:`~.groups.TenancyConfig`, the resolved group
membership and every tenant's usage. It is pure bookkeeping (no I/O, no clock), like the ledger;
the service shell owns one and keeps it current:

- ``configure(config, cluster)`` swaps the config *live*: membership is resolved again and written
  onto the cluster's node states, so the very next decision uses it (no restart);
- ``annotate(node)`` marks a node's groups before the shell stores new inventory for it;
- ``resolve(pod)`` is the pod with its tenant as the config makes it: its namespace's (or what
  the file maps the namespace to), or the tenant its ``tessera.dev/tenant`` label asks for when
  the namespace may choose it (``groups.choose_tenant``). Whatever tenant the request carried
  is replaced, so the shell's hands cannot move a pod between tenants;
- ``choose(pod, cluster)`` chooses the pod's group within its resolved tenant's (label, best fit,
  or the tenant's permitted set; a label it may not choose refuses the pod) and
  ``over_quota(tenant, reservation)`` checks the exact quota once GPUs are chosen: the placement
  cycle (``cycle.py``) runs them around the framework, whose ``group`` filter and ``quota``
  PreFilter come from ``plugins()``;
- ``reserve(pod, decision, cluster)`` / ``release(uid, cluster)`` book and give back the
  reservation in the ledger *and* the tenant's usage, both idempotent;
- ``set_committed(tenant, charges)`` tells it what the shared usage entry of a tenant with a quota
  holds (the placer service's ``tessera-tenants``, written by every replica): a tenant's usage is
  its own bookings plus the charges of pods it has not seen booked yet (another replica's commits
  in flight), so a decision counts what the commit's compare-and-set will be checked against.

``profile(base)`` is how a profile gets the two plugins: ``build_profile(spec,
**tenancy.plugins())``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from services.placer.core.facts import pod_facts
from services.placer.core.groups import (
    GroupChoice,
    Membership,
    NamespaceTenancy,
    TenancyConfig,
    TenantChoice,
    TenantQuota,
    annotate,
    choose_group,
    choose_tenant,
    resolve,
)
from services.placer.core.index import ClusterIndex
from services.placer.core.model import (
    Decision,
    NodeState,
    PodRequest,
    Reservation,
)
from services.placer.core.plugins.groups import GroupFilter
from services.placer.core.plugins.quota import QuotaPreFilter
from services.placer.core.quota import TenantUsage, Usage, quota_reason, reservation_usage


class _Nodes(Mapping[str, NodeState]):
    """The cluster's node states as a read-only mapping by name."""

    def __init__(self, cluster: ClusterIndex) -> None:
        self._cluster = cluster

    def __getitem__(self, name: str) -> NodeState:
        return self._cluster.node(name)

    def __iter__(self) -> Iterator[str]:
        return (node.name for node in self._cluster)

    def __len__(self) -> int:
        return len(self._cluster)


class Tenancy:
    """Current groups, permissions and quotas, and each tenant's usage; see the module docstring."""

    def __init__(
        self,
        config: TenancyConfig | None = None,
        *,
        node_labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.config = (config or TenancyConfig()).check()
        self._namespaces = _namespaces(self.config)
        self.node_labels: dict[str, Mapping[str, str]] = dict(node_labels or {})
        self.usage = TenantUsage()
        self._committed: dict[str, dict[str, Usage]] = {}
        """Per tenant: pod UID -> what the shared usage entry charges for it."""
        self._members: dict[str, dict[str, frozenset[int]]] = {}

    # -- config ----------------------------------------------------------------------------------

    def configure(
        self,
        config: TenancyConfig,
        cluster: ClusterIndex,
        *,
        node_labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> int:
        """Make ``config`` current and re-mark every node; returns how many nodes changed.

        Usage is kept: a lower quota does not evict anything, it only stops new placements.
        """
        self.config = config.check()
        self._namespaces = _namespaces(self.config)
        if node_labels is not None:
            self.node_labels = dict(node_labels)
        self._members = {}
        changed = 0
        for node in list(cluster):
            marked = self.annotate(node)
            if marked is not node:
                cluster.put(marked)
                changed += 1
        return changed

    def annotate(self, node: NodeState, *, labels: Mapping[str, str] | None = None) -> NodeState:
        """``node`` with its group memberships set from the current config."""
        if labels is not None:
            self.node_labels[node.name] = labels
        for members in self._members.values():
            members.pop(node.name, None)
        if not self.config.groups and not self.config.permissions:
            # No group and no tenant's permission (no tenancy file): nothing holds any node,
            # as resolve would find, at every derive of a node.
            return annotate(node, Membership())
        mine = resolve(self.config, (node,), node_labels=self.node_labels)
        for group, members in mine.groups.items():
            self._members.setdefault(group, {}).update(members)
        return annotate(node, mine)

    @property
    def membership(self) -> Membership:
        return Membership(groups=self._members)

    # -- QuotaSource -----------------------------------------------------------------------------

    def quota_of(self, tenant: str) -> TenantQuota | None:
        return self.config.quota_of(tenant)

    def quotas(self) -> dict[str, TenantQuota]:
        """The quota of each tenant that has one."""
        return {q.tenant: q for q in self.config.quotas}

    def used(self, tenant: str) -> Usage:
        used = self.usage.used(tenant)
        for pod_uid, charged in self._committed.get(tenant, {}).items():
            if pod_uid not in self.usage:
                used = used + charged
        return used

    def set_committed(self, tenant: str, charges: Mapping[str, Usage]) -> None:
        """What the shared usage entry of ``tenant`` charges now, by pod UID (see the module
        docstring); an empty mapping forgets the tenant's entry."""
        if charges:
            self._committed[tenant] = dict(charges)
        else:
            self._committed.pop(tenant, None)

    def plugins(self) -> dict[str, Any]:
        """Keyword arguments for ``build_profile``: the group filter and the quota PreFilter."""
        group = GroupFilter()
        return {
            "filters": (group,),
            "gpu_filters": (group,),
            "pre_filters": (QuotaPreFilter(self),),
        }

    # -- tenants ---------------------------------------------------------------------------------

    def tenant_of(self, pod: PodRequest) -> TenantChoice:
        """``pod``'s tenant from its namespace and label (never from ``pod.tenant``)."""
        return choose_tenant(pod.namespace, pod.tenant_label, self._namespaces.get(pod.namespace))

    def resolve(self, pod: PodRequest) -> PodRequest:
        """``pod`` with the tenant :meth:`tenant_of` gives it (its namespace's own when the label
        is refused: :meth:`choose` refuses such a pod)."""
        return _with_tenant(pod, self.tenant_of(pod).tenant)

    # -- deciding --------------------------------------------------------------------------------

    def choose(self, pod: PodRequest, cluster: ClusterIndex) -> GroupChoice:
        """``pod``'s group within its resolved tenant's, or why it has none (a label refused)."""
        tenant = self.tenant_of(pod)
        if not tenant.ok:
            return GroupChoice(reason=tenant.reason, unresolvable=True)
        facts = pod_facts(_with_tenant(pod, tenant.tenant))
        return choose_group(facts, self.config, self.membership, _Nodes(cluster))

    def over_quota(self, tenant: str, reservation: Reservation) -> str:
        """Why ``reservation`` would take ``tenant`` over its quota (the exact check, once GPUs
        are chosen); empty when it would not."""
        return quota_reason(
            self.quota_of(tenant), self.used(tenant), reservation_usage(reservation)
        )

    # -- booking ---------------------------------------------------------------------------------

    def reserve(self, pod: PodRequest, decision: Decision, cluster: ClusterIndex) -> str | None:
        """Book ``decision`` in the ledger and the tenant's usage; None when done (or already).

        Either both are booked or neither: a quota refusal books nothing, a ledger refusal gives
        the usage back.
        """
        reservation = decision.reservation
        tenant = self.tenant_of(pod).tenant
        reason = self.usage.charge(tenant, reservation, self.quota_of(tenant))
        if reason:
            return reason
        refused = cluster.reserve(reservation)
        if refused is not None:
            self.usage.refund(reservation.pod_uid)
            return refused
        return None

    def adopt(self, tenant: str, reservation: Reservation) -> None:
        """Count a reservation that already exists (the ledger after a restart) for ``tenant``.

        No quota check: what is allocated stays allocated, even over a since-lowered quota.
        """
        self.usage.charge(tenant, reservation, None)

    def release(self, pod_uid: str, cluster: ClusterIndex) -> bool:
        """Give back ``pod_uid``'s reservation and usage; False when it held neither."""
        refunded = self.usage.refund(pod_uid)
        released = cluster.release(pod_uid)
        return refunded or released


def _namespaces(config: TenancyConfig) -> dict[str, NamespaceTenancy]:
    return {entry.namespace: entry for entry in config.namespaces}


def _with_tenant(pod: PodRequest, tenant: str) -> PodRequest:
    return pod if tenant == pod.tenant else msgspec.structs.replace(pod, tenant=tenant)
