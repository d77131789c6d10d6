"""Hypothesis invariants of the core: no over-commit, only allowed healthy GPUs, determinism."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.placer.core.framework import decide
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision, GpuState, NodeState, PodRequest
from services.placer.core.profiles import build_profile
from tests.placer.builders import node, pod

MODELS = ("A100", "T4", "V100")
PROFILES = (
    "tessera",
    "fgd",
    "bestfit",
    "dotprod",
    "packing",
    "clustering",
    "binpack",
    "spread",
    "balanced",
    "random",
)
COMPILED = {name: build_profile(name) for name in PROFILES}


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeState]:
    nodes = []
    for i in range(draw(st.integers(1, 5))):
        builder = node(f"n{i}").cpu(draw(st.sampled_from([8_000, 32_000, 64_000])))
        for _ in range(draw(st.integers(0, 4))):
            builder.gpu(
                model=draw(st.sampled_from(MODELS)),
                used=draw(st.sampled_from([0, 0, 250, 600, 1000])),
                foreign_mib=draw(st.sampled_from([0, 0, 2_000])),
                healthy=draw(st.booleans()) or draw(st.booleans()),
                slots=draw(st.sampled_from([0, 0, 2])),
            )
        nodes.append(builder.build())
    return nodes


@st.composite
def requests(draw: st.DrawFn, uid: str) -> PodRequest:
    builder = pod(uid)
    kind = draw(st.sampled_from(["cpu", "share", "whole", "multi"]))
    cpu = draw(st.sampled_from([500, 4_000, 16_000]))
    if kind == "cpu":
        builder.cpu_only(cpu)
    elif kind == "share":
        builder.share(draw(st.sampled_from([100, 250, 500, 800, 1000])), cpu=cpu)
    elif kind == "whole":
        builder.whole(draw(st.integers(1, 3)), cpu=cpu)
    else:
        builder.container(
            "a",
            cpu=cpu,
            shares=draw(st.integers(1, 2)),
            mib=draw(st.sampled_from([2_000, 6_000])),
            cores=20,
        )
        builder.container("b", cpu=cpu, shares=1, pct=draw(st.sampled_from([10, 40])))
    if draw(st.booleans()):
        builder.with_(gpu_models=(draw(st.sampled_from(MODELS)),))
    elif draw(st.booleans()):
        builder.with_(gpu_models_excluded=(draw(st.sampled_from(MODELS)),))
    return builder.build()


def assert_within_capacity(gpu: GpuState, state: NodeState) -> None:
    """For a GPU a placement touched (telemetry alone may push an untouched one past full)."""
    assert gpu.memory_reserved_mib + gpu.memory_foreign_mib <= gpu.memory_total_mib
    assert 0 <= gpu.core_milli_reserved <= 1000
    assert gpu.slots_total == 0 or gpu.slots_reserved <= gpu.slots_total
    assert state.cpu_milli_reserved <= state.cpu_milli_total
    assert state.memory_mib_reserved <= state.memory_mib_total


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), nodes=clusters(), profile=st.sampled_from(PROFILES))
def test_placements_never_over_commit_and_respect_health_and_models(
    data: st.DataObject, nodes: list[NodeState], profile: str
) -> None:
    cluster = ClusterIndex(nodes)
    initial = {n.name: n for n in nodes}
    placed = []
    for i in range(data.draw(st.integers(1, 12))):
        request = data.draw(requests(f"p{i}"))
        outcome = decide(request, cluster, COMPILED[profile], now=float(i))
        if not isinstance(outcome, Decision):
            continue
        before = cluster.node(outcome.node)
        for container in outcome.reservation.containers:
            indices = [g.index for g in container.gpus]
            assert len(indices) == len(set(indices))  # shares of one container on distinct GPUs
            for piece in container.gpus:
                gpu = before.gpus[piece.index]
                assert gpu.healthy
                assert not request.gpu_models or gpu.model in request.gpu_models
                assert gpu.model not in request.gpu_models_excluded
        assert cluster.reserve(outcome.reservation) is None
        placed.append(request.uid)
        after = cluster.node(outcome.node)
        for old, gpu in zip(before.gpus, after.gpus, strict=True):
            if gpu != old:
                assert_within_capacity(gpu, after)
    for uid in placed:
        assert cluster.release(uid)
    for name, state in initial.items():
        restored = cluster.node(name)
        assert restored == state


@settings(max_examples=40, deadline=None)
@given(data=st.data(), nodes=clusters(), profile=st.sampled_from(PROFILES))
def test_same_input_same_decision(
    data: st.DataObject, nodes: list[NodeState], profile: str
) -> None:
    request = data.draw(requests("p"))
    first = decide(request, ClusterIndex(nodes), build_profile(profile), now=3.0)
    second = decide(request, ClusterIndex(nodes), COMPILED[profile], now=3.0)
    assert first == second
