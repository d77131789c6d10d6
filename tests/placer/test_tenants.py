"""A pod's tenant (issue 19, finding 3): its namespace, or what the operator's tenancy file maps
the namespace to; the ``tessera.dev/tenant`` label only chooses among what the namespace is
allowed, and anything else refuses the pod with the reason."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core import cycle
from services.placer.core.groups import (
    NamespaceTenancy,
    NodeSelector,
    ResourceGroup,
    TenancyConfig,
    TenantPermission,
    TenantQuota,
    choose_tenant,
)
from services.placer.core.model import Decision, PodRequest, Rejection
from tests.placer.tenant_builders import node, pod, tenant_cluster

LAB = NamespaceTenancy(namespace="lab", tenant="research", choices=("shared",))


@pytest.mark.parametrize(
    ("namespace", "label", "entry", "tenant", "refused"),
    [
        pytest.param("ml", "", None, "ml", "", id="no-label-no-entry"),
        pytest.param("ml", "ml", None, "ml", "", id="own-name"),
        pytest.param(
            "ml", "other", None, "ml", "namespace ml may not choose tenant 'other'", id="unlisted"
        ),
        pytest.param("lab", "", LAB, "research", "", id="mapped"),
        pytest.param("lab", "research", LAB, "research", "", id="mapped-by-name"),
        pytest.param("lab", "shared", LAB, "shared", "", id="a-choice"),
        pytest.param(
            "lab", "lab", LAB, "research", "(it may choose: research, shared)", id="not-its-name"
        ),
        pytest.param(
            "lab", "victim", LAB, "research", "may not choose tenant 'victim'", id="not-a-choice"
        ),
    ],
)
def test_choose_tenant(
    namespace: str, label: str, entry: NamespaceTenancy | None, tenant: str, refused: str
) -> None:
    choice = choose_tenant(namespace, label, entry)
    assert choice.tenant == tenant
    if refused:
        assert refused in choice.reason
        assert choice.reason.startswith("label tessera.dev/tenant: ")
    else:
        assert choice.ok


# -- the findings: a label moved a pod into another tenant's quota, permissions and group ---------

NODES = tuple(node(f"node-{i}", gpus=2) for i in range(1, 5))
CONFIG = TenancyConfig(
    namespaces=(LAB,),
    groups=(ResourceGroup(name="victim-pool", tenants=("victim",), nodes=NodeSelector()),),
    permissions=(TenantPermission(tenant="restricted", nodes=NodeSelector(names=("node-4",))),),
    quotas=(
        TenantQuota(tenant="quota-team", gpus=1),
        TenantQuota(tenant="research", gpus=1),
        TenantQuota(tenant="shared", gpus=1),
    ),
)


def test_a_label_does_not_escape_the_namespaces_quota() -> None:
    cluster, tenancy, profile = tenant_cluster(NODES, CONFIG)
    first = pod("q-1", tenant="quota-team")
    decision = cycle.decide(first, cluster, profile, tenancy, now=0.0)
    assert isinstance(decision, Decision)
    assert tenancy.reserve(first, decision, cluster) is None
    sibling = cycle.decide(pod("q-2", tenant="quota-team"), cluster, profile, tenancy, now=1.0)
    assert isinstance(sibling, Rejection) and "quota exceeded" in sibling.message
    rider = cycle.decide(
        pod("q-3", tenant="quota-team", label="free-rider"), cluster, profile, tenancy, now=1.0
    )
    assert isinstance(rider, Rejection) and rider.unresolvable
    assert rider.message == (
        "4 nodes: label tessera.dev/tenant: namespace quota-team may not choose tenant "
        "'free-rider' (it may choose: quota-team)"
    )
    assert {t: u.gpus for t, u in tenancy.usage.tenants().items()} == {"quota-team": 1}


def test_a_label_does_not_escape_the_namespaces_permissions() -> None:
    cluster, tenancy, profile = tenant_cluster(NODES, CONFIG)
    for i, label in enumerate(("", "restricted")):
        request = pod(f"r-{i}", tenant="restricted", label=label)
        decision = cycle.decide(request, cluster, profile, tenancy, now=float(i))
        assert isinstance(decision, Decision) and decision.node == "node-4"
        assert tenancy.reserve(request, decision, cluster) is None
    outside = cycle.decide(
        pod("r-2", tenant="restricted", label="anyone"), cluster, profile, tenancy, now=2.0
    )
    assert isinstance(outside, Rejection) and outside.unresolvable
    assert "may not choose tenant 'anyone'" in outside.message


@pytest.mark.parametrize(
    ("label", "group", "reason"),
    [
        pytest.param("victim", "victim-pool", "may not choose tenant 'victim'", id="tenant-label"),
        pytest.param("", "victim-pool", "tenant hostile: may not use resource group", id="group"),
        pytest.param("victim", None, "may not choose tenant 'victim'", id="best-fit-by-label"),
    ],
)
def test_a_label_does_not_enter_another_tenants_group(
    label: str, group: str | None, reason: str
) -> None:
    cluster, tenancy, profile = tenant_cluster(NODES, CONFIG)
    request = pod("h", tenant="hostile", label=label, group=group)
    assert not tenancy.choose(request, cluster).ok
    refused = cycle.decide(request, cluster, profile, tenancy, now=0.0)
    assert isinstance(refused, Rejection) and refused.unresolvable
    assert reason in refused.message


def test_a_mapped_namespace_is_charged_to_its_tenant_or_the_choice_it_is_allowed() -> None:
    cluster, tenancy, profile = tenant_cluster(NODES, CONFIG)
    for uid, label in (("own", ""), ("chosen", "shared")):
        request = pod(uid, tenant="lab", label=label)
        decision = cycle.decide(request, cluster, profile, tenancy, now=0.0)
        assert isinstance(decision, Decision), decision
        assert tenancy.reserve(request, decision, cluster) is None
    assert {t: u.gpus for t, u in tenancy.usage.tenants().items()} == {"research": 1, "shared": 1}
    # Both quotas are full now: each pod waits on its own tenant's, never on "lab".
    for label, tenant in (("", "research"), ("shared", "shared")):
        over = cycle.decide(
            pod("more", tenant="lab", label=label), cluster, profile, tenancy, now=1.0
        )
        assert isinstance(over, Rejection) and f"tenant {tenant}: GPU quota" in over.message


def test_a_refused_label_is_granted_live_when_the_tenancy_file_allows_it() -> None:
    cluster, tenancy, profile = tenant_cluster(NODES, CONFIG)
    asking = pod("a", tenant="hostile", label="guests")
    assert isinstance(cycle.decide(asking, cluster, profile, tenancy, now=0.0), Rejection)
    allowed = NamespaceTenancy(namespace="hostile", choices=("guests",))
    tenancy.configure(TenancyConfig(namespaces=(allowed,)), cluster)
    assert tenancy.resolve(asking).tenant == "guests"
    assert isinstance(cycle.decide(asking, cluster, profile, tenancy, now=1.0), Decision)


def test_the_tenant_a_request_carries_is_never_trusted() -> None:
    cluster, tenancy, profile = tenant_cluster(NODES, CONFIG)
    forged = PodRequest(
        uid="f", namespace="quota-team", tenant="free-rider", containers=pod("x").containers
    )
    assert tenancy.resolve(forged).tenant == "quota-team"
    first = cycle.decide(forged, cluster, profile, tenancy, now=0.0)
    assert isinstance(first, Decision)
    assert tenancy.reserve(forged, first, cluster) is None
    assert set(tenancy.usage.tenants()) == {"quota-team"}


# -- property: no label moves a pod outside its namespace's allowed tenants ------------------------

NAMES = ("a", "b", "c", "d")
entries = st.builds(
    NamespaceTenancy,
    namespace=st.sampled_from(NAMES),
    tenant=st.one_of(st.none(), st.sampled_from(NAMES)),
    choices=st.lists(st.sampled_from(NAMES), max_size=2, unique=True).map(tuple),
)
configs = st.lists(entries, max_size=4, unique_by=lambda e: e.namespace).map(
    lambda found: TenancyConfig(namespaces=tuple(found))
)


@settings(max_examples=100, deadline=None)
@given(
    config=configs,
    asked=st.lists(
        st.tuples(st.sampled_from(NAMES), st.sampled_from(("", *NAMES, "x"))), max_size=12
    ),
)
def test_no_label_moves_a_pod_outside_its_namespaces_allowed_tenants(
    config: TenancyConfig, asked: list[tuple[str, str]]
) -> None:
    cluster, tenancy, profile = tenant_cluster(NODES, config)
    charged: dict[str, int] = {}
    for i, (namespace, label) in enumerate(asked):
        entry = config.namespace_of(namespace)
        own = entry.own if entry else namespace
        allowed = {own, *(entry.choices if entry else ())}
        request = pod(f"p{i}", tenant=namespace, label=label, mib=1_000)
        choice = tenancy.tenant_of(request)
        assert choice.tenant in allowed
        assert choice.ok == (not label or label in allowed)
        assert choice.tenant == (label if choice.ok and label else own)
        outcome = cycle.decide(request, cluster, profile, tenancy, now=float(i))
        assert isinstance(outcome, Decision) == choice.ok
        if isinstance(outcome, Decision):
            assert tenancy.reserve(request, outcome, cluster) is None
            charged[choice.tenant] = charged.get(choice.tenant, 0) + 1
    assert {t: u.gpus for t, u in tenancy.usage.tenants().items()} == charged
