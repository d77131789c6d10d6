"""Hypothesis invariants of the core, checked against a brute-force oracle and the ledger.

- the fit filter says a node fits exactly when the GPU choice finds GPUs on it, exactly when some
  assignment of the pod's shares to the node's GPUs is one the ledger books (the oracle);
- a pod is rejected only when no node can take it, and never over-commits anything;
- a decision respects every constraint: CPU and memory, health, exclusive holders, idle GPUs for
  whole shares, logical-device slots, GPU models, resource groups, distinct GPUs per container;
- decisions are deterministic.

The generators draw GPUs from a few values each (free memory, cores, slots, models, sizes), so
GPUs often tie on free memory and cores while differing in slots or model: the ties in which the
node shape's GPU order differs from the index order (issue 21). CI runs these derandomized
(``tests/conftest.py``); ``scripts/fuzz`` explores random seeds, and each counterexample it finds is
pinned here with ``@example``.
"""

from __future__ import annotations

import itertools
import random

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.placer.core.cycle import decide, prepare
from services.placer.core.facts import ShareAsk, pod_facts
from services.placer.core.framework import place_on_node
from services.placer.core.index import ClusterIndex
from services.placer.core.ledger import book
from services.placer.core.model import (
    ContainerPlacement,
    ContainerRequest,
    Decision,
    GpuSlice,
    GpuState,
    NodeState,
    PodRequest,
    Rejection,
    Reservation,
)
from services.placer.core.plugins.groups import GroupFilter
from services.placer.core.profiles import BUILTIN, build_profile
from services.placer.core.ranking import Ranking, schedule
from services.placer.core.shape import node_shape
from tests.placer.builders import node, pod

MODELS = ("A100", "T4", "V100")
GROUPS = ("g1", "g2")
PROFILES = tuple(BUILTIN)
COMPILED = {name: build_profile(name) for name in PROFILES}
GROUPED = {
    name: build_profile(name, filters=(GroupFilter(),), gpu_filters=(GroupFilter(),))
    for name in PROFILES
}
"""The built-in profiles with the ``group`` filter, as the service compiles them."""


Room = tuple[int, int, int]
"""(free MiB, foreign MiB, cores reserved) that several GPUs of a node share, so that they tie."""

rooms = st.tuples(
    st.sampled_from([2_000, 4_000, 8_000, 13_000, 16_000]),
    st.sampled_from([0, 0, 3_000]),
    st.sampled_from([0, 0, 300, 700, 1_000]),
)


@st.composite
def gpus(draw: st.DrawFn, node: str, index: int, room: Room) -> GpuState:
    free, foreign, cores = room
    total = draw(st.sampled_from([16_000, 16_000, 32_000]))
    slots = draw(st.sampled_from([0, 0, 1, 2, 4]))
    return GpuState(
        index=index,
        uuid=f"{node}-GPU-{index}",
        model=draw(st.sampled_from(MODELS)),
        memory_total_mib=total,
        memory_reserved_mib=max(0, total - foreign - free),
        memory_foreign_mib=foreign,
        core_milli_reserved=cores,
        slots_total=slots,
        slots_reserved=draw(st.integers(0, slots)),
        exclusive=draw(st.integers(0, 9)) == 0,
        healthy=draw(st.integers(0, 5)) > 0,
        groups=frozenset(draw(st.sets(st.sampled_from(GROUPS)))),
    )


@st.composite
def nodes(draw: st.DrawFn, name: str = "n0", max_gpus: int = 4) -> NodeState:
    shared = draw(st.lists(rooms, min_size=1, max_size=2))
    count = draw(st.integers(0, max_gpus))
    return NodeState(
        name=name,
        cpu_milli_total=draw(st.sampled_from([8_000, 32_000, 64_000])),
        memory_mib_total=draw(st.sampled_from([16_384, 262_144])),
        gpus=tuple(draw(gpus(name, i, draw(st.sampled_from(shared)))) for i in range(count)),
        schedulable=draw(st.integers(0, 9)) > 0,
        groups=frozenset(draw(st.sets(st.sampled_from(GROUPS)))),
    )


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeState]:
    return [draw(nodes(f"n{i}")) for i in range(draw(st.integers(1, 4)))]


@st.composite
def containers(draw: st.DrawFn, name: str, cpu: int) -> ContainerRequest:
    size = draw(st.sampled_from(["whole", "mib", "mib", "pct", "cores"]))
    cores: int | None = None
    if size == "cores":
        cores = draw(st.sampled_from([200, 500]))
    elif size != "whole":
        cores = draw(st.sampled_from([None, 200, 500]))
    return ContainerRequest(
        name=name,
        shares=draw(st.integers(1, 3)),
        share_memory_mib=draw(st.sampled_from([2_000, 4_000, 6_000])) if size == "mib" else None,
        share_memory_pct=draw(st.sampled_from([10, 25, 50])) if size == "pct" else None,
        share_core_milli=cores,
        cpu_milli=cpu,
        memory_mib=1_024,
    )


@st.composite
def requests(draw: st.DrawFn, uid: str = "p") -> PodRequest:
    cpu = draw(st.sampled_from([500, 4_000, 16_000]))
    kind = draw(st.sampled_from(["cpu", "gpu", "gpu", "gpu"]))
    if kind == "cpu":
        found: tuple[ContainerRequest, ...] = (
            ContainerRequest(name="main", cpu_milli=cpu, memory_mib=1_024),
        )
    else:
        count = draw(st.integers(1, 3))
        found = tuple(draw(containers(f"c{i}", cpu)) for i in range(count))
    models = draw(st.sampled_from([(), (), (), ("A100",), ("T4", "V100")]))
    excluded = () if models else draw(st.sampled_from([(), (), ("T4",)]))
    return PodRequest(
        uid=uid,
        namespace="ns",
        name=uid,
        containers=found,
        gpu_models=models,
        gpu_models_excluded=excluded,
        gpu_type=draw(st.sampled_from([None, None, None, "physical"])),
        gpu_policy=draw(st.sampled_from([None, None, "binpack", "spread", "colocate"])),
        group=draw(st.sampled_from([None, None, *GROUPS])),
    )


def assert_within_capacity(gpu: GpuState, state: NodeState) -> None:
    """For a GPU a placement touched (telemetry alone may push an untouched one past full)."""
    assert gpu.memory_reserved_mib + gpu.memory_foreign_mib <= gpu.memory_total_mib
    assert 0 <= gpu.core_milli_reserved <= 1000
    assert gpu.slots_total == 0 or gpu.slots_reserved <= gpu.slots_total
    assert state.cpu_milli_reserved <= state.cpu_milli_total
    assert state.memory_mib_reserved <= state.memory_mib_total


def _admitted(request: PodRequest, gpu: GpuState) -> bool:
    return request.allows_model(gpu.model) and (
        request.group is None or request.group in gpu.groups
    )


def _slice(ask: ShareAsk, gpu: GpuState) -> GpuSlice:
    memory = gpu.memory_free_mib if ask.whole else ask.memory_on(gpu.memory_total_mib)
    return GpuSlice(
        index=gpu.index,
        uuid=gpu.uuid,
        memory_mib=memory,
        core_milli=ask.core_milli,
        exclusive=ask.whole,
    )


def fits_by_brute_force(request: PodRequest, state: NodeState) -> bool:
    """Whether some assignment of the pod's shares to the node's GPUs is one the ledger books:
    every choice of distinct allowed GPUs per container, tried one by one."""
    if not state.schedulable or (request.group is not None and request.group not in state.groups):
        return False
    facts = pod_facts(request)
    allowed = [g for g in state.gpus if _admitted(request, g)]
    per_container = [itertools.permutations(allowed, ask.shares) for ask in facts.asks]
    for combo in itertools.product(*per_container):
        reservation = Reservation(
            pod_uid=request.uid,
            node=state.name,
            cpu_milli=facts.cpu_milli,
            memory_mib=facts.memory_mib,
            containers=tuple(
                ContainerPlacement(container=ask.container, gpus=tuple(_slice(ask, g) for g in on))
                for ask, on in zip(facts.asks, combo, strict=True)
            ),
        )
        if not isinstance(book(state, reservation), str):
            return True
    return False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=nodes(), request=requests(), profile=st.sampled_from(PROFILES))
# Found by scripts/fuzz on the greedy filter (smallest fitting GPU first, no search): on three
# GPUs of 4,000 MiB free, c0 and c1 both went on GPU 0, which left c2 two GPUs, not three.
@example(
    state=node("n0").cpu(8_000).memory(16_384).gpus(3, used=750, cores_used=0).build(),
    request=pod("p")
    .container("c0", cpu=500, shares=1, mib=2_000)
    .container("c1", cpu=500, shares=1, mib=2_000)
    .container("c2", cpu=500, shares=3, mib=2_000)
    .build(),
    profile="tessera",
)
@example(
    state=node("n0")
    .cpu(8_000)
    .memory(16_384)
    .gpu(used=750, cores_used=0)
    .gpu(used=750, cores_used=0, slots=1)
    .gpu(used=750, cores_used=0)
    .build(),
    request=pod("p")
    .container("c0", cpu=500, shares=1, mib=2_000)
    .container("c1", cpu=500, shares=2, mib=2_000)
    .container("c2", cpu=500, shares=2, mib=2_000)
    .build(),
    profile="tessera",
)
def test_the_filter_says_a_node_fits_exactly_when_gpus_are_found_there(
    state: NodeState, request: PodRequest, profile: str
) -> None:
    compiled = GROUPED[profile].for_pod(request)
    facts = pod_facts(request)
    fits = not isinstance(compiled.judge(facts, node_shape(state)), str)
    found = place_on_node(facts, state, compiled, random.Random(7)) if fits else None
    assert fits == fits_by_brute_force(request, state)
    assert fits == (found is not None)
    if found is not None:
        assert not isinstance(book(state, found), str)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster_nodes=clusters(),
    pods=st.lists(requests(), min_size=1, max_size=10),
    profile=st.sampled_from(PROFILES),
)
def test_decisions_respect_every_constraint_and_never_over_commit(
    cluster_nodes: list[NodeState], pods: list[PodRequest], profile: str
) -> None:
    cluster = ClusterIndex(cluster_nodes)
    initial = {n.name: n for n in cluster_nodes}
    placed = []
    for i, drawn in enumerate(pods):
        request = msgspec.structs.replace(drawn, uid=f"p{i}", name=f"p{i}")
        fitting = [n.name for n in cluster if fits_by_brute_force(request, n)]
        outcome = decide(request, cluster, GROUPED[profile], now=float(i))
        assert isinstance(outcome, Decision) == bool(fitting), outcome  # rejected only if none fits
        if not isinstance(outcome, Decision):
            continue
        assert outcome.node in fitting
        before = cluster.node(outcome.node)
        _assert_respects_constraints(request, outcome.reservation, before)
        assert cluster.reserve(outcome.reservation) is None  # the ledger books what was decided
        placed.append(request.uid)
        after = cluster.node(outcome.node)
        for old, gpu in zip(before.gpus, after.gpus, strict=True):
            if gpu != old:
                assert_within_capacity(gpu, after)
    for uid in placed:
        assert cluster.release(uid)
    for name, state in initial.items():
        assert cluster.node(name) == state


def _assert_respects_constraints(
    request: PodRequest, reservation: Reservation, node: NodeState
) -> None:
    facts = pod_facts(request)
    assert node.schedulable
    assert request.group is None or request.group in node.groups
    assert reservation.cpu_milli == facts.cpu_milli <= node.cpu_milli_free
    assert reservation.memory_mib == facts.memory_mib <= node.memory_mib_free
    assert [c.container for c in reservation.containers] == [a.container for a in facts.asks]
    gpus = {g.index: g for g in node.gpus}
    for ask, container in zip(facts.asks, reservation.containers, strict=True):
        indices = [piece.index for piece in container.gpus]
        assert len(indices) == ask.shares == len(set(indices))  # distinct GPUs per container
        for piece in container.gpus:
            gpu = gpus[piece.index]
            assert gpu.healthy and not gpu.exclusive
            assert _admitted(request, gpu)  # model and group
            assert piece.exclusive == ask.whole
            if ask.whole:
                assert gpu.idle
            else:
                assert piece.memory_mib == ask.memory_on(gpu.memory_total_mib)
                assert piece.core_milli == ask.core_milli


@settings(max_examples=60, deadline=None)
@given(cluster_nodes=clusters(), request=requests(), profile=st.sampled_from(PROFILES))
def test_same_input_same_decision(
    cluster_nodes: list[NodeState], request: PodRequest, profile: str
) -> None:
    first = decide(request, ClusterIndex(cluster_nodes), build_profile(profile), now=3.0)
    second = decide(request, ClusterIndex(cluster_nodes), COMPILED[profile], now=3.0)
    assert first == second


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster_nodes=clusters(),
    request=requests(),
    profile=st.sampled_from(PROFILES),
    avoids=st.lists(
        st.sets(st.sampled_from(["n0", "n1", "n2", "n3", "n0-twin", "n1-twin", "gone"])),
        max_size=5,
    ),
)
def test_one_ranking_picks_under_any_avoided_nodes_what_judging_every_node_picks(
    cluster_nodes: list[NodeState], request: PodRequest, profile: str, avoids: list[set[str]]
) -> None:
    """A decision that tries node after node ranks the cluster once (issue 23): each pick must
    be what judging every node afresh with those nodes avoided gives. Each node has a twin of
    its shape, so that ties and shapes of several nodes, some avoided, are common."""
    cluster_nodes = [
        *cluster_nodes,
        *(msgspec.structs.replace(n, name=f"{n.name}-twin") for n in cluster_nodes),
    ]
    index = ClusterIndex(cluster_nodes)
    prepared = prepare(request, index, COMPILED[profile], now=3.0)
    if isinstance(prepared, Rejection):
        return
    chosen = prepared.profile
    ranking = Ranking(prepared.facts, index, chosen)
    judged = {n.name: chosen.judge(prepared.facts, node_shape(n)) for n in cluster_nodes}
    fitting = {name: j for name, j in judged.items() if not isinstance(j, str)}
    # Each fitting node avoided alone, then the drawn sets, then every fitting node but one.
    alone = [{name} for name in fitting]
    but_one = [set(fitting) - {name} for name in fitting]
    # Before each pick the node is asked (as the decider asks it), in turn under the same nodes
    # avoided (the pick takes that answer) and under the last pick's (the pick chooses anew).
    previous: set[str] = set()
    for turn, avoid in enumerate([set(), *alone, *avoids, *but_one]):
        asked = avoid if turn % 2 == 0 else previous
        told = ranking.node(avoid=asked)
        picked = ranking.pick(now=3.0, avoid=avoid)
        previous = avoid
        fresh = ClusterIndex(cluster_nodes)  # no memo shared with the ranking
        assert picked == schedule(prepared.facts, fresh, chosen, now=3.0, avoid=avoid)
        if asked == avoid:
            assert told == (picked.node if isinstance(picked, Decision) else None)
        usable = {name: j for name, j in fitting.items() if name not in avoid}
        if not usable:
            assert isinstance(picked, Rejection)
            continue
        assert isinstance(picked, Decision)
        assert picked.feasible_nodes == len(usable)
        if chosen.normalizing:
            continue  # totals rescaled over the usable shapes: the schedule equality covers it
        best = max(usable.values())
        tied = sorted((n for n, j in usable.items() if j == best), key=index.rank_of)
        if chosen.tie_break == "random":
            assert picked.node in tied
        else:
            assert picked.node == tied[0]


def _gpu(
    index: int, *, reserved: int = 0, foreign: int = 0, cores: int = 0, healthy: bool = True
) -> GpuState:
    return GpuState(
        index=index,
        uuid=f"n0-GPU-{index}",
        model="A100",
        memory_total_mib=16_000,
        memory_reserved_mib=reserved,
        memory_foreign_mib=foreign,
        core_milli_reserved=cores,
        healthy=healthy,
    )


def _share(
    name: str, *, mib: int | None = None, pct: int | None = None, cores: int | None = None
) -> ContainerRequest:
    return ContainerRequest(
        name=name,
        shares=1,
        share_memory_mib=mib,
        share_memory_pct=pct,
        share_core_milli=cores,
        cpu_milli=500,
        memory_mib=1024,
    )


@pytest.mark.parametrize("profile", PROFILES)
def test_a_pod_of_two_containers_is_placed_where_a_greedy_first_pick_would_strand_the_second(
    profile: str,
) -> None:
    # Found by the property test above (CI): once p0 took half of GPU 0, the `tessera` chooser
    # put p1's small share on GPU 0 too, leaving its 40 % share nowhere, though the fit filter
    # (smallest fitting GPU first: the small share on GPU 1) had found the node fits.
    n0 = NodeState(
        name="n0",
        cpu_milli_total=8000,
        memory_mib_total=262_144,
        gpus=(
            _gpu(0),
            _gpu(1, reserved=9600, foreign=2000, cores=600),
            _gpu(2, healthy=False),
            _gpu(3, healthy=False),
        ),
    )
    n1 = NodeState(name="n1", cpu_milli_total=8000, memory_mib_total=262_144)
    cluster = ClusterIndex([n0, n1])
    p0 = PodRequest(
        uid="p0", namespace="ns", name="p0", containers=(_share("c0", mib=8000, cores=500),)
    )
    p1 = PodRequest(
        uid="p1",
        namespace="ns",
        name="p1",
        containers=(_share("a", mib=2000, cores=200), _share("b", pct=40)),
    )
    for number, request in enumerate((p0, p1)):
        outcome = decide(request, cluster, COMPILED[profile], now=float(number))
        assert isinstance(outcome, Decision), outcome
        assert cluster.reserve(outcome.reservation) is None
    after = cluster.node("n0")
    for gpu in after.gpus:
        assert_within_capacity(gpu, after)
