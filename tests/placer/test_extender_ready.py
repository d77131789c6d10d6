"""The extender's judgements made ahead of kube-scheduler's calls (``ready.py``, issue 23): served
from what the background judged, the answers are exactly what a fresh ``decider.verdicts`` gives
on the same view; a node whose shape changed is re-judged, and nothing else is."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from services.placer.core.framework import Profile
from services.placer.core.model import PodRequest
from services.placer.core.profiles import build_profile
from services.placer.metrics import PlacerMetrics
from services.placer.ready import ReadyJudgements
from services.placer.rules import decider
from services.placer.rules.extender_api import priorities
from services.placer.rules.state import ClusterView
from services.placer.rules.translate import pod_request
from services.placer.shell.upkeep import service_profile
from tests.placer import wire

NODES = [f"n{i}" for i in range(8)]
CANDIDATES = [*NODES, "unknown"]
USED = (0, 1024, 4096, 12_288, 16_000)


@dataclass
class Cluster:
    """A view of ``NODES`` (4 GPUs each) whose GPU usage a test sets and changes."""

    view: ClusterView
    used: dict[str, list[int]]

    def change(self, node: str, used: list[int]) -> None:
        self.used[node] = used
        self.view.set_inventory(
            wire.inventory(node, len(used), used_mib=used, at=wire.NOW + 1), now=wire.NOW + 1
        )


def cluster(seed: int, *, tight_cpu: bool = True) -> Cluster:
    """Every node a GPU usage of its own; with ``tight_cpu`` some have too little CPU for
    more than one pod."""
    view = ClusterView(inventory_stale_s=3600, task_mix_window=100)
    used = {}
    for i, name in enumerate(NODES):
        rng = random.Random(seed * 100 + i)
        used[name] = [rng.choice(USED) for _ in range(4)]
        view.set_inventory(wire.inventory(name, 4, used_mib=used[name]), now=wire.NOW)
        cpu = rng.choice((2000, 64_000)) if tight_cpu else 64_000
        view.set_facts(wire.facts(name, cpu_milli=cpu))
    view.finish_load(wire.NOW)
    return Cluster(view=view, used=used)


def request(
    uid: str, *, shares: int = 1, memory: int | None = 4096, cores: int | None = 20
) -> PodRequest:
    return pod_request(wire.pending(uid, shares=shares, memory_mib=memory, cores=cores))


REQUESTS = [
    request("share", memory=4096, cores=20),
    request("big-share", memory=15_000, cores=50),
    request("two-shares", shares=2, memory=2048, cores=10),
    request("whole", memory=None, cores=None),
    request("two-whole", shares=2, memory=None, cores=None),
]


def profile_of(view: ClusterView, name: str) -> Profile:
    return build_profile(service_profile(name), typical_tasks=view.mix.typical())


def catch_up(view: ClusterView, profile: Profile, known: list[PodRequest]) -> int:
    """The background's work, done at once: every known request on every shape not judged."""
    return sum(
        decider.judge_shapes(view, profile, pod, decider.unjudged(view, profile, pod))
        for pod in known
    )


def fresh(view: ClusterView, name: str, pod: PodRequest) -> list[decider.NodeVerdict]:
    """What ``verdicts`` says with nothing judged before (a profile with an empty memo)."""
    return decider.verdicts(view, profile_of(view, name), pod, CANDIDATES, detail=False)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    profile_name=st.sampled_from(["tessera", "fgd", "bestfit"]),
    known=st.lists(st.sampled_from(REQUESTS), min_size=1, max_size=3, unique=True),
    changes=st.lists(
        st.tuples(st.sampled_from(NODES), st.lists(st.sampled_from(USED), min_size=4, max_size=4)),
        max_size=4,
    ),
)
def test_answers_from_background_judgements_equal_fresh_verdicts_on_the_same_view(
    seed: int,
    profile_name: str,
    known: list[PodRequest],
    changes: list[tuple[str, list[int]]],
) -> None:
    state = cluster(seed)
    view = state.view
    profile = profile_of(view, profile_name)
    catch_up(view, profile, known)
    for pod in known:
        assert decider.unjudged(view, profile, pod, CANDIDATES) == []
    for node, used in changes:
        state.change(node, used)
        # Before the background caught up: a changed node is a shape not judged, never stale.
        for pod in known:
            served = decider.verdicts(view, profile, pod, CANDIDATES, detail=False)
            assert served == fresh(view, profile_name, pod)
    catch_up(view, profile, known)
    for pod in known:
        assert decider.unjudged(view, profile, pod, CANDIDATES) == []
        served = decider.verdicts(view, profile, pod, CANDIDATES, detail=False)
        expected = fresh(view, profile_name, pod)
        assert served == expected
        assert priorities(served) == priorities(expected)


@pytest.mark.parametrize(
    ("changes", "rejudged"),
    [
        pytest.param([], 0, id="nothing-changed"),
        pytest.param([("n0", [16_000, 16_000, 16_000, 16_000])], 1, id="one-node"),
        pytest.param(
            [("n0", [16_000, 16_000, 16_000, 16_000]), ("n1", [16_000, 16_000, 16_000, 16_000])],
            1,
            id="two-nodes-one-new-shape",
        ),
        pytest.param(
            [("n0", [16_000, 0, 0, 0]), ("n1", [16_000, 16_000, 0, 0])], 2, id="two-new-shapes"
        ),
    ],
)
def test_only_the_shapes_that_changed_are_judged_again(
    changes: list[tuple[str, list[int]]], rejudged: int
) -> None:
    state = cluster(7, tight_cpu=False)
    view = state.view
    profile = profile_of(view, "tessera")
    assert catch_up(view, profile, REQUESTS) == len(REQUESTS) * len(NODES)
    for node, used in changes:
        state.change(node, used)
    assert catch_up(view, profile, REQUESTS) == len(REQUESTS) * rejudged


def metrics() -> PlacerMetrics:
    return PlacerMetrics.create(CollectorRegistry())


def count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(f"tessera_placer_{name}_total", labels) or 0.0


async def test_a_request_asked_about_is_judged_in_the_background_and_then_served_ready() -> None:
    state = cluster(3)
    view = state.view
    profile = profile_of(view, "tessera")
    registry = CollectorRegistry()
    ready = ReadyJudgements(
        lambda: (view, profile), PlacerMetrics.create(registry), batch_slice_shapes=3
    )
    pod = REQUESTS[0]

    await ready.ready(pod, CANDIDATES, verb="filter")  # never seen: judged during the call
    judged = count(registry, "extender_judgements", verb="filter", source="judged")
    assert (judged, count(registry, "extender_judgements", verb="filter", source="ready")) == (1, 0)
    assert decider.unjudged(view, profile, pod, CANDIDATES) == []
    await ready.ready(pod, CANDIDATES, verb="prioritize")
    assert count(registry, "extender_judgements", verb="prioritize", source="ready") == 1

    ready.note(REQUESTS[1])  # known: the background judges it on every shape
    assert await ready.catch_up() == len(NODES)
    assert await ready.catch_up() == 0  # nothing changed since
    state.change("n2", [16_000, 16_000, 0, 0])
    assert await ready.catch_up() == 2  # the changed shape, for each known request
    for pod in REQUESTS[:2]:
        await ready.ready(pod, CANDIDATES, verb="filter")
        served = decider.verdicts(view, profile, pod, CANDIDATES, detail=False)
        assert served == fresh(view, "tessera", pod)
    assert count(registry, "extender_judgements", verb="filter", source="ready") == 2
    assert count(registry, "extender_background_judgements") == len(NODES) + 2


async def test_the_known_requests_are_the_most_recently_asked_about() -> None:
    state = cluster(5)
    profile = profile_of(state.view, "bestfit")
    ready = ReadyJudgements(lambda: (state.view, profile), metrics(), known=2)
    for pod in (REQUESTS[0], REQUESTS[1], REQUESTS[0], REQUESTS[2]):
        ready.note(pod)
    keys = [pod.placement_key() for pod in ready.known]
    assert keys == [REQUESTS[2].placement_key(), REQUESTS[0].placement_key()]
    ready.note(request("other-uid-same-ask"))  # a replica of the same job: the same request
    keys = [pod.placement_key() for pod in ready.known]
    assert keys == [REQUESTS[0].placement_key(), REQUESTS[2].placement_key()]
