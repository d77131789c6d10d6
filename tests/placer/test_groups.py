"""Seed 001 resource groups: config, membership, permissions, best-fit choice, auto-grouping."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core.cycle import decide
from services.placer.core.facts import pod_facts
from services.placer.core.groups import (
    GpuKind,
    GpuSelector,
    NamespaceTenancy,
    NodeSelector,
    ResourceGroup,
    TenancyConfig,
    TenantDemand,
    TenantPermission,
    annotate,
    choose_group,
    implicit_group,
    load_config,
    propose_groups,
    resolve,
)
from services.placer.core.model import Decision, NodeState, PodRequest, Rejection
from tests.placer.tenant_builders import node, pod, tenant_cluster


def group(
    name: str,
    *tenants: str,
    nodes: tuple[str, ...] = (),
    gpus: GpuSelector | None = None,
    gpu_type: GpuKind | None = None,
) -> ResourceGroup:
    return ResourceGroup(
        name=name,
        tenants=tenants or ("research",),
        nodes=NodeSelector(names=nodes),
        gpus=gpus or GpuSelector(),
        gpu_type=gpu_type,
    )


# -- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param(TenancyConfig(groups=(group("Bad Name"),)), "lower-case", id="bad-name"),
        pytest.param(TenancyConfig(groups=(group("a"), group("a"))), "twice", id="duplicate"),
        pytest.param(
            TenancyConfig(groups=(ResourceGroup(name="a", tenants=()),)),
            "at least one tenant",
            id="no-tenant",
        ),
        pytest.param(
            TenancyConfig(groups=(group("tenant:x"),)), "lower-case", id="reserved-prefix"
        ),
        pytest.param(
            TenancyConfig(permissions=(TenantPermission(tenant="a"), TenantPermission(tenant="a"))),
            "more than one permission",
            id="two-permissions",
        ),
        pytest.param(
            TenancyConfig(namespaces=(NamespaceTenancy(namespace="a"),) * 2),
            "namespace 'a' has more than one entry",
            id="two-namespace-entries",
        ),
        pytest.param(
            TenancyConfig(namespaces=(NamespaceTenancy(namespace="a", tenant=""),)),
            "a tenant cannot be empty",
            id="empty-tenant",
        ),
        pytest.param(
            TenancyConfig(namespaces=(NamespaceTenancy(namespace="a", choices=("",)),)),
            "a tenant cannot be empty",
            id="empty-choice",
        ),
        pytest.param(
            TenancyConfig(namespaces=(NamespaceTenancy(namespace=""),)),
            "empty namespace",
            id="empty-namespace",
        ),
    ],
)
def test_invalid_config_is_a_clear_error(config: TenancyConfig, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config.check()


def test_config_loads_from_json_and_from_parsed_data() -> None:
    text = (
        b'{"groups": [{"name": "a100-pool", "tenants": ["research"],'
        b' "nodes": {"labels": {"pool": "a100"}}, "gpus": {"model": "A100"},'
        b' "gpu_type": "virtual"}],'
        b' "quotas": [{"tenant": "research", "gpus": 8, "gpu_memory_mib": 81920}],'
        b' "namespaces": [{"namespace": "ml-dev", "tenant": "research", "choices": ["batch"]}]}'
    )
    config = load_config(text)
    assert config.group("a100-pool") is not None
    assert config.namespace_of("ml-dev") == NamespaceTenancy(
        namespace="ml-dev", tenant="research", choices=("batch",)
    )
    assert config.quota_of("research") is not None
    assert load_config(msgspec.json.decode(text)) == config


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b'{"groupz": []}', "unknown field", id="typo"),
        pytest.param(b'{"groups": [{"name": "a", "tenants": "x"}]}', "groups", id="wrong-type"),
        pytest.param(
            b'{"quotas": [{"tenant": "a", "gpus": -1}]}', "cannot be negative", id="negative"
        ),
    ],
)
def test_bad_config_documents_are_rejected_with_the_field(data: bytes, message: str) -> None:
    with pytest.raises((msgspec.ValidationError, ValueError), match=message):
        load_config(data)


# -- membership ----------------------------------------------------------------------------------

NODES = (node("n0"), node("n1"), node("n2", model="H100", gpu_mib=81_920))
LABELS = {"n0": {"pool": "a"}, "n1": {"pool": "a"}, "n2": {"pool": "b"}}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            TenancyConfig(groups=(group("g", nodes=("n1",)),)),
            {"g": {"n1": {0, 1, 2, 3}}},
            id="by-name",
        ),
        pytest.param(
            TenancyConfig(
                groups=(
                    ResourceGroup(
                        name="g", tenants=("t",), nodes=NodeSelector(labels={"pool": "a"})
                    ),
                )
            ),
            {"g": {"n0": {0, 1, 2, 3}, "n1": {0, 1, 2, 3}}},
            id="by-label",
        ),
        pytest.param(
            TenancyConfig(groups=(group("g", gpus=GpuSelector(uuids=("n0-gpu1", "n1-gpu3"))),)),
            {"g": {"n0": {1}, "n1": {3}, "n2": set()}},
            id="by-uuid",
        ),
        pytest.param(
            TenancyConfig(groups=(group("g", gpus=GpuSelector(model="H100")),)),
            {"g": {"n0": set(), "n1": set(), "n2": {0, 1, 2, 3}}},
            id="by-model",
        ),
        pytest.param(
            TenancyConfig(
                groups=(
                    group("left", nodes=("n0",), gpus=GpuSelector(indices=(0, 1, 2))),
                    group("right", nodes=("n0",), gpus=GpuSelector(indices=(2, 3))),
                )
            ),
            {"left": {"n0": {0, 1, 2}}, "right": {"n0": {2, 3}}},
            id="overlapping-groups-share-a-gpu",
        ),
        pytest.param(
            TenancyConfig(
                groups=(group("g", "research", nodes=("n0", "n1")),),
                permissions=(
                    TenantPermission(
                        tenant="research",
                        nodes=NodeSelector(names=("n0", "n1")),
                        gpus=GpuSelector(indices=(0, 1)),
                    ),
                ),
            ),
            {
                "g": {"n0": {0, 1}, "n1": {0, 1}},
                "tenant:research": {"n0": {0, 1}, "n1": {0, 1}},
            },
            id="only-over-permitted-gpus",
        ),
        pytest.param(
            TenancyConfig(
                groups=(group("g", "research", "vision", nodes=("n0", "n1")),),
                permissions=(TenantPermission(tenant="vision", nodes=NodeSelector(names=("n1",))),),
            ),
            {"g": {"n1": {0, 1, 2, 3}}, "tenant:vision": {"n1": {0, 1, 2, 3}}},
            id="shared-group-within-every-tenants-permission",
        ),
    ],
)
def test_resolve(config: TenancyConfig, expected: dict[str, dict[str, set[int]]]) -> None:
    membership = resolve(config.check(), NODES, node_labels=LABELS)
    got = {
        name: {n: set(gpus) for n, gpus in members.items()}
        for name, members in membership.groups.items()
    }
    assert got == expected


def test_annotate_marks_nodes_and_gpus_and_clears_stale_marks() -> None:
    config = TenancyConfig(groups=(group("g", nodes=("n0",), gpus=GpuSelector(indices=(1,))),))
    marked = annotate(NODES[0], resolve(config, NODES))
    assert marked.groups == {"g"}
    assert [g.groups for g in marked.gpus] == [set(), {"g"}, set(), set()]
    assert annotate(marked, resolve(config, NODES)) is marked  # unchanged: same object
    cleared = annotate(marked, resolve(TenancyConfig(), NODES))
    assert cleared.groups == frozenset() and all(not g.groups for g in cleared.gpus)


# -- group choice ----------------------------------------------------------------------------------

CHOICE_CONFIG = TenancyConfig(
    groups=(
        group("small", nodes=("n0",), gpus=GpuSelector(indices=(0, 1))),  # 2 A100
        group("large", nodes=("n0", "n1"), gpus=GpuSelector(model="A100")),  # 8 A100
        group("h100", nodes=("n2",), gpu_type="physical"),  # 4 H100, whole GPUs only
        group("slices", nodes=("n1",), gpu_type="virtual"),
        group("other", "vision", nodes=("n1",)),
    ),
    permissions=(TenantPermission(tenant="guest", nodes=NodeSelector(names=("n2",))),),
)


@pytest.mark.parametrize(
    ("request_", "chosen", "reason"),
    [
        pytest.param(pod("p", shares=2), "small", "", id="best-fit-exact"),
        pytest.param(pod("p", shares=3), "h100", "", id="best-fit-least-slack"),
        pytest.param(pod("p", shares=3, models=("A100",)), "large", "", id="model-narrows"),
        pytest.param(pod("p", shares=9), None, "no resource group has room", id="too-big"),
        pytest.param(pod("p", group="large"), "large", "", id="label-wins"),
        pytest.param(pod("p", group="nope"), None, "unknown resource group", id="unknown-label"),
        pytest.param(pod("p", group="other"), None, "may not use", id="foreign-group"),
        pytest.param(pod("p", mib=1_000, group="h100"), None, "physical", id="type-mismatch"),
        pytest.param(pod("p", mib=30_000), "small", "", id="share-best-fit"),
        pytest.param(
            pod("p", mib=1_000, models=("H100",)),
            None,
            "no resource group offers virtual GPUs",
            id="only-a-physical-group-has-the-model",
        ),
        pytest.param(pod("p", tenant="nobody"), None, "", id="tenant-without-groups"),
        pytest.param(pod("p", tenant="guest"), "tenant:guest", "", id="restricted-tenant"),
        pytest.param(pod("p", shares=0), None, "", id="non-gpu-pod"),
        pytest.param(
            pod("p", tenant="vision", shares=1, models=("H100",)),
            None,
            "no resource group offers",
            id="no-group-of-that-model",
        ),
    ],
)
def test_choose_group(request_: PodRequest, chosen: str | None, reason: str) -> None:
    membership = resolve(CHOICE_CONFIG.check(), NODES)
    nodes = {n.name: n for n in NODES}
    choice = choose_group(pod_facts(request_), CHOICE_CONFIG, membership, nodes)
    assert choice.group == chosen
    if reason:
        assert reason in choice.reason
    else:
        assert choice.ok


def test_best_fit_counts_what_is_left_not_the_size() -> None:
    # "small" has 2 A100s, "large" 8; with one of small's GPUs taken, a 2-GPU pod goes to large.
    cluster, tenancy, profile = tenant_cluster(NODES, CHOICE_CONFIG)
    first = decide(pod("first", shares=1, models=("A100",)), cluster, profile, tenancy, now=0.0)
    assert isinstance(first, Decision)
    assert tenancy.reserve(pod("first", shares=1), first, cluster) is None
    assert tenancy.choose(pod("second", shares=1, models=("A100",)), cluster).group == "small"
    assert tenancy.choose(pod("third", shares=2, models=("A100",)), cluster).group == "large"


# -- placement through the framework ---------------------------------------------------------------


def _gpus_of(decision: Decision | Rejection) -> set[tuple[str, int]]:
    assert isinstance(decision, Decision), decision
    r = decision.reservation
    return {(r.node, s.index) for c in r.containers for s in c.gpus}


def test_a_pod_lands_only_on_its_groups_gpus_even_on_a_shared_node() -> None:
    config = TenancyConfig(
        groups=(
            group("left", "research", nodes=("n0",), gpus=GpuSelector(indices=(0, 1))),
            group("right", "vision", nodes=("n0",), gpus=GpuSelector(indices=(2, 3))),
        )
    )
    cluster, tenancy, profile = tenant_cluster([node("n0"), node("n1")], config)
    placed: set[tuple[str, int]] = set()
    for i in range(2):
        request = pod(f"v{i}", tenant="vision")
        decision = decide(request, cluster, profile, tenancy, now=0.0)
        placed |= _gpus_of(decision)
        assert tenancy.reserve(request, decision, cluster) is None  # type: ignore[arg-type]
    assert placed == {("n0", 2), ("n0", 3)}
    full = decide(pod("v2", tenant="vision"), cluster, profile, tenancy, now=0.0)
    assert isinstance(full, Rejection)
    assert "no resource group has room" in full.message


def test_non_gpu_pod_with_a_group_label_stays_on_the_groups_nodes() -> None:
    config = TenancyConfig(groups=(group("g", nodes=("n1",)),))
    nodes = [node("n0", cpu_milli=128_000), node("n1")]
    cluster, tenancy, profile = tenant_cluster(nodes, config)
    decision = decide(pod("c", shares=0, group="g"), cluster, profile, tenancy, now=0.0)
    assert isinstance(decision, Decision) and decision.node == "n1"
    # Only n0 has the CPU, but it is outside the group: the pod waits rather than leave it.
    outside = decide(
        pod("c2", shares=0, group="g", cpu_milli=100_000), cluster, profile, tenancy, now=0.0
    )
    assert isinstance(outside, Rejection)
    assert outside.message == "1 node: insufficient CPU; 1 node: not in resource group 'g'"


def test_groups_are_updated_live_and_the_next_decision_uses_them() -> None:
    before = TenancyConfig(groups=(group("pool", nodes=("n0",)),))
    cluster, tenancy, profile = tenant_cluster([node("n0"), node("n1")], before)
    first = decide(pod("a"), cluster, profile, tenancy, now=0.0)
    assert isinstance(first, Decision) and first.node == "n0"
    assert tenancy.reserve(pod("a"), first, cluster) is None

    after = TenancyConfig(groups=(group("pool", nodes=("n1",)),))
    assert tenancy.configure(after, cluster) == 2  # both nodes re-marked, nothing restarted
    second = decide(pod("b"), cluster, profile, tenancy, now=1.0)
    assert isinstance(second, Decision) and second.node == "n1"
    assert cluster.ledger.get("a") is not None  # the earlier placement is kept


def test_a_new_node_is_marked_before_it_is_stored() -> None:
    config = TenancyConfig(
        groups=(
            ResourceGroup(
                name="g", tenants=("research",), nodes=NodeSelector(labels={"pool": "g"})
            ),
        )
    )
    cluster, tenancy, profile = tenant_cluster([node("n0")], config)
    assert isinstance(decide(pod("a"), cluster, profile, tenancy, now=0.0), Rejection)
    cluster.put(tenancy.annotate(node("n0"), labels={"pool": "g"}))
    assert isinstance(decide(pod("a"), cluster, profile, tenancy, now=0.0), Decision)


# -- automatic grouping ----------------------------------------------------------------------------


def _shape(groups: tuple[ResourceGroup, ...]) -> dict[str, list[str]]:
    return {g.name: sorted(g.gpus.uuids) for g in groups}


@pytest.mark.parametrize(
    ("nodes", "demands", "expected", "short"),
    [
        pytest.param(
            [node("a"), node("b")],
            [TenantDemand(tenant="research", gpu_model="A100", gpus=4)],
            {"auto-research-a100": [f"a-gpu{i}" for i in range(4)]},
            {},
            id="one-whole-node",
        ),
        pytest.param(
            [node("a"), node("b")],
            [
                TenantDemand(tenant="research", gpu_model="A100", gpus=6),
                TenantDemand(tenant="vision", gpu_model="A100", gpus=2),
            ],
            {
                "auto-research-a100": [f"a-gpu{i}" for i in range(4)] + ["b-gpu0", "b-gpu1"],
                "auto-vision-a100": ["b-gpu2", "b-gpu3"],
            },
            {},
            id="node-split-between-tenants",
        ),
        pytest.param(
            [node("a"), node("h", model="H100")],
            [
                TenantDemand(tenant="research", gpu_model="H100", gpus=2),
                TenantDemand(tenant="vision", gpu_model="A100", gpus=5),
            ],
            {
                "auto-research-h100": ["h-gpu0", "h-gpu1"],
                "auto-vision-a100": [f"a-gpu{i}" for i in range(4)],
            },
            {"auto-vision-a100": 1},
            id="by-model-with-shortfall",
        ),
        pytest.param(
            [node("a", gpus=2), node("b", gpus=8), node("c", gpus=4)],
            [TenantDemand(tenant="research", gpu_model="A100", gpus=3)],
            {"auto-research-a100": ["a-gpu0", "a-gpu1", "c-gpu0"]},
            {},
            id="least-leftover",
        ),
    ],
)
def test_propose_groups(
    nodes: list[NodeState],
    demands: list[TenantDemand],
    expected: dict[str, list[str]],
    short: dict[str, int],
) -> None:
    proposal = propose_groups(nodes, demands)
    assert _shape(proposal.groups) == expected
    assert proposal.shortfalls == short
    TenancyConfig(groups=proposal.groups).check()  # proposals are valid config


def test_proposals_stay_within_permissions() -> None:
    permission = TenantPermission(tenant="research", nodes=NodeSelector(names=("b",)))
    proposal = propose_groups(
        [node("a"), node("b")],
        [TenantDemand(tenant="research", gpu_model="A100", gpus=8)],
        permissions=[permission],
    )
    assert _shape(proposal.groups) == {"auto-research-a100": [f"b-gpu{i}" for i in range(4)]}
    assert proposal.shortfalls == {"auto-research-a100": 4}


# -- property: never outside the group or the permissions ------------------------------------------

PROPERTY_NODES = tuple(node(f"n{i}", gpus=4, model="A100" if i % 2 else "H100") for i in range(4))
PROPERTY_CONFIG = TenancyConfig(
    groups=(
        group("g0", "research", nodes=("n0", "n1"), gpus=GpuSelector(indices=(0, 1))),
        group(
            "g1", "research", "vision", nodes=("n1", "n2", "n3"), gpus=GpuSelector(indices=(1, 2))
        ),
        group("g2", "vision", nodes=("n3",)),
    ),
    permissions=(
        TenantPermission(tenant="vision", nodes=NodeSelector(names=("n2", "n3"))),
        TenantPermission(
            tenant="guest", nodes=NodeSelector(names=("n0",)), gpus=GpuSelector(indices=(3,))
        ),
    ),
)

requests = st.tuples(
    st.sampled_from(["research", "vision", "guest", "free"]),
    st.sampled_from([None, "g0", "g1", "g2"]),
    st.integers(0, 2),
    st.sampled_from([None, 10_000, 30_000]),
)


@settings(max_examples=50, deadline=None)
@given(st.lists(requests, min_size=1, max_size=25))
def test_a_pod_never_lands_outside_its_group_or_permissions(
    items: list[tuple[str, str | None, int, int | None]],
) -> None:
    cluster, tenancy, profile = tenant_cluster(PROPERTY_NODES, PROPERTY_CONFIG)
    membership = tenancy.membership
    for i, (tenant, label, shares, mib) in enumerate(items):
        request = pod(
            f"p{i}", tenant=tenant, group=label, shares=shares, mib=mib if shares else None
        )
        decision = decide(request, cluster, profile, tenancy, now=float(i))
        if isinstance(decision, Rejection):
            continue
        chosen = tenancy.choose(request, cluster).group
        if label is not None:
            assert chosen == label
            assert tenant in (PROPERTY_CONFIG.group(label) or group("x")).tenants
        r = decision.reservation
        if chosen is not None:
            members = membership.members(chosen)
            assert r.node in members
            assert all(s.index in members[r.node] for c in r.containers for s in c.gpus)
        permission = PROPERTY_CONFIG.permission_of(tenant)
        if permission is not None:
            allowed = membership.members(implicit_group(tenant))
            assert r.node in allowed
            assert all(s.index in allowed[r.node] for c in r.containers for s in c.gpus)
        assert tenancy.reserve(request, decision, cluster) is None
