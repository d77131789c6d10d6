"""decide(): selection, tie-breaks, rejections with counted reasons, hints and extension points."""

from __future__ import annotations

import random

import pytest

from services.placer.core.cycle import decide, prepare
from services.placer.core.facts import PodFacts, pod_facts
from services.placer.core.framework import SUCCESS, CycleState, Status
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision, PodRequest, Rejection
from services.placer.core.profiles import build_profile
from services.placer.core.ranking import Ranking, judgements
from services.placer.core.shape import GpuShape, NodeShape
from tests.placer.builders import node, pod


def decided(result: Decision | Rejection) -> Decision:
    assert isinstance(result, Decision), result
    return result


def rejected(result: Decision | Rejection) -> Rejection:
    assert isinstance(result, Rejection), result
    return result


def test_binpack_prefers_the_fuller_node_and_gpu() -> None:
    cluster = ClusterIndex(
        [node("a").gpu(used=200).gpu(used=600).build(), node("b").gpus(2).build()]
    )
    result = decided(decide(pod().share(300).build(), cluster, build_profile("binpack"), now=5.0))
    assert result.node == "a"
    (container,) = result.reservation.containers
    assert [g.index for g in container.gpus] == [1]  # least free memory that fits
    assert result.decided_at == 5.0


def test_spread_prefers_the_emptier_node_and_idle_gpu() -> None:
    cluster = ClusterIndex(
        [
            node("a").gpu(used=200).gpu(used=600).build(),
            node("b").gpu(utilization=80).gpu(utilization=10).build(),
        ]
    )
    result = decided(decide(pod().share(300).build(), cluster, build_profile("spread"), now=0))
    assert result.node == "b"
    assert result.reservation.containers[0].gpus[0].index == 1


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        pytest.param(None, "n1", id="by-name"),
        pytest.param(["n3", "n1", "n2"], "n3", id="by-given-order"),
    ],
)
def test_ties_go_to_the_best_rank(order: list[str] | None, expected: str) -> None:
    nodes = [node(f"n{i}").gpus(1).build() for i in (1, 2, 3)]
    cluster = ClusterIndex(nodes, order=order)
    result = decided(decide(pod().share(500).build(), cluster, build_profile("binpack"), now=0))
    assert result.node == expected


def test_rejection_counts_reasons_over_nodes() -> None:
    cluster = ClusterIndex(
        [
            node("a").gpu(healthy=False).build(),
            node("b").gpu(healthy=False).build(),
            node("c").cpu(1_000).gpus(1).build(),
            node("d").gpu(model="T4").build(),
        ]
    )
    request = pod().share(500, cpu=4_000).with_(gpu_models_excluded=("T4",)).build()
    result = rejected(decide(request, cluster, build_profile("fgd"), now=0))
    assert {(r.reason, r.nodes) for r in result.reasons} == {
        ("unhealthy GPU", 2),
        ("insufficient CPU", 1),
        ("too few GPUs of an allowed model or group", 1),
    }
    assert result.message.startswith("2 nodes: unhealthy GPU")
    assert not result.unresolvable


def test_invalid_request_is_unresolvable() -> None:
    cluster = ClusterIndex([node("a").gpus(1).build()])
    request = pod().container(shares=1, cores=150).build()
    result = rejected(decide(request, cluster, build_profile("binpack"), now=0))
    assert result.unresolvable
    assert "GPU cores must be 1..100" in result.reasons[0].reason


def test_multi_container_pod_gets_slices_per_container() -> None:
    cluster = ClusterIndex([node("a").gpus(2).build()])
    request = (
        pod()
        .container("trainer", shares=2, mib=4_000, cores=25)
        .container("sidecar", shares=1, mib=2_000, cores=10)
        .with_(gpu_policy="colocate")
        .build()
    )
    result = decided(decide(request, cluster, build_profile("binpack"), now=0))
    trainer, sidecar = result.reservation.containers
    assert sorted(g.index for g in trainer.gpus) == [0, 1]
    assert {g.memory_mib for g in trainer.gpus} == {4_000}
    assert {g.core_milli for g in trainer.gpus} == {250}
    assert sidecar.gpus[0].index in {0, 1}
    assert result.reservation.cpu_milli == 2_000


def test_whole_gpus_take_the_lowest_idle_indices() -> None:
    cluster = ClusterIndex([node("a").gpu(used=100).gpus(3).build()])
    result = decided(decide(pod().whole(2).build(), cluster, build_profile("fgd"), now=0))
    gpus = result.reservation.containers[0].gpus
    assert [g.index for g in gpus] == [1, 2]
    assert all(g.exclusive and g.core_milli == 1000 for g in gpus)


def test_node_policy_hint_overrides_the_profile() -> None:
    cluster = ClusterIndex([node("a").gpu(used=600).build(), node("b").gpus(1).build()])
    base = build_profile("binpack")
    request = pod().share(300).build()
    assert decided(decide(request, cluster, base, now=0)).node == "a"
    spread = pod().share(300).with_(node_policy="spread").build()
    assert decided(decide(spread, cluster, base, now=0)).node == "b"


def test_random_profile_is_reproducible_with_the_same_rng() -> None:
    nodes = [node(f"n{i}").gpus(1).build() for i in range(20)]
    profile = build_profile("random")
    picks = []
    for _ in range(2):
        cluster = ClusterIndex(nodes)
        rng = random.Random(7)
        picks.append(
            [
                decided(
                    decide(pod(f"p{i}").share(100).build(), cluster, profile, now=0, rng=rng)
                ).node
                for i in range(5)
            ]
        )
    assert picks[0] == picks[1]
    assert len(set(picks[0])) > 1


class DenyTenant:
    """A quota-style PreFilter: what the groups/quota engineer plugs in."""

    name = "quota"

    def pre_filter(self, pod: PodFacts, cluster: ClusterIndex, state: CycleState) -> Status:
        if pod.request.tenant == "over-quota":
            return Status(code="unschedulable", reason="tenant quota exceeded", plugin=self.name)
        state[self.name] = "checked"
        return SUCCESS


class InGroup:
    """A group-style Filter + GpuFilter on ``groups``."""

    name = "group"

    def filter(self, pod: PodFacts, shape: NodeShape) -> str | None:
        group = pod.request.group
        return None if group is None or group in shape.groups else "not in the pod's group"

    def admits_gpu(self, pod: PodFacts, gpu: GpuShape) -> bool:
        group = pod.request.group
        return group is None or not gpu.groups or group in gpu.groups


def test_extension_points_for_quota_and_groups() -> None:
    in_group = InGroup()
    profile = build_profile(
        "binpack", pre_filters=(DenyTenant(),), filters=(in_group,), gpu_filters=(in_group,)
    )
    cluster = ClusterIndex(
        [
            node("a").gpu(used=500).build(),
            node("b")
            .groups("team-x")
            .gpu(groups=frozenset({"team-y"}))
            .gpu(groups=frozenset({"team-x"}))
            .build(),
        ]
    )
    over = pod().share(100).with_(tenant="over-quota").build()
    assert (
        rejected(decide(over, cluster, profile, now=0)).reasons[0].reason == "tenant quota exceeded"
    )
    grouped = pod().share(100).with_(group="team-x").build()
    result = decided(decide(grouped, cluster, profile, now=0))
    assert result.node == "b"
    assert result.reservation.containers[0].gpus[0].index == 1


def test_a_random_tie_break_draws_alike_whatever_the_index_went_through() -> None:
    """A placer restarted on a cluster draws the node one that ran all along draws: the
    index's shape ids (in which order the tied shapes come) follow the history of node states,
    so the draw must not (found when a restarted placer chose another node, issue 22)."""
    profile = build_profile("random")

    def cluster() -> ClusterIndex:
        return ClusterIndex([node(name).gpu(used=used).build() for name, used in NODES_USED])

    straight, travelled = cluster(), cluster()
    for name, _ in NODES_USED[:2]:  # these two nodes leave their shape and come back to it
        only_here = ClusterIndex([travelled.node(name)])
        visit = decided(decide(pod(f"visit-{name}").share(100).build(), only_here, profile, now=0))
        assert travelled.reserve(visit.reservation) is None
        assert travelled.release(visit.reservation.pod_uid)
    assert list(travelled.groups) != list(straight.groups), "the shapes now come in another order"
    for i in range(20):
        request = pod(f"p{i}").share(100).build()
        assert (
            decided(decide(request, straight, profile, now=0, rng=random.Random(i))).node
            == decided(decide(request, travelled, profile, now=0, rng=random.Random(i))).node
        )


NODES_USED = [("a", 100), ("b", 200), ("c", 300), ("d", 400)]


@pytest.mark.parametrize(
    "avoid",
    [set(), {"a1"}, {"a2", "b1"}, {"a1", "a2"}, {"b2", "c1", "c2"}, {"a1", "b1", "c1"}],
)
def test_a_random_draw_among_shapes_of_several_nodes_skips_only_the_avoided(
    avoid: set[str],
) -> None:
    """Three shapes of two nodes each, all tied: every draw lands on a node not avoided, and
    every such node is drawn by some pod (one ranking picks for each pod, as the placer's burst
    spreading does)."""
    nodes = [node(f"{s}{n}").gpu(used=used).build() for s, used in NODES_USED[:3] for n in (1, 2)]
    cluster = ClusterIndex(nodes)
    profile = build_profile("random")
    drawn = set()
    for i in range(60):
        request = pod(f"p{i}").share(100).build()
        prepared = prepare(request, cluster, profile, now=0)
        assert not isinstance(prepared, Rejection)
        ranking = Ranking(prepared.facts, cluster, prepared.profile)
        assert decided(ranking.pick(now=0)) == decided(decide(request, cluster, profile, now=0))
        picked = decided(ranking.pick(now=0, avoid=avoid))
        assert picked.feasible_nodes == len(nodes) - len(avoid)
        drawn.add(picked.node)
    assert drawn == {n.name for n in nodes} - avoid


def test_reserving_a_decision_changes_only_the_chosen_node() -> None:
    nodes = [node(f"n{i}").gpus(2).build() for i in range(4)]
    cluster = ClusterIndex(nodes)
    assert len(cluster.groups) == 1
    result = decided(decide(pod().share(400).build(), cluster, build_profile("binpack"), now=0))
    assert cluster.reserve(result.reservation) is None
    assert len(cluster.groups) == 2
    assert cluster.node(result.node).gpus[0].memory_reserved_mib == 6_400
    assert all(cluster.node(n.name) == n for n in nodes if n.name != result.node)


def test_same_input_same_decision_across_fresh_profiles() -> None:
    nodes = [node(f"n{i}").gpu(used=100 * i).gpu(used=50 * i).build() for i in range(6)]
    request: PodRequest = pod().share(350).build()
    outcomes = [
        decide(request, ClusterIndex(nodes), build_profile("tessera"), now=1) for _ in range(3)
    ]
    assert outcomes[0] == outcomes[1] == outcomes[2]


def test_the_extenders_judgements_and_decisions_share_one_memo() -> None:
    cluster = ClusterIndex([node(f"n{i}").gpu(used=100 * i).build() for i in range(4)])
    profile = build_profile("fgd")
    request = pod().share(300).build()
    judged = judgements(pod_facts(request), cluster, profile, cluster.groups)
    assert len(judged) == len(cluster.groups) == cluster.memo_size == 4
    result = decided(decide(request, cluster, profile, now=0))
    assert cluster.memo_size == 4  # nothing judged twice
    assert result.score == max(judged.values())
