"""GPU choice inside a node: each chooser against a node built for it."""

from __future__ import annotations

import random

import pytest

from services.placer.core.facts import pod_facts
from services.placer.core.fragmentation import FragmentationModel, TypicalTask
from services.placer.core.framework import GpuChooser
from services.placer.core.model import NodeState, PodRequest
from services.placer.core.plugins import gpu_choice
from services.placer.core.search import share_fits
from services.placer.core.shape import gpu_shape
from tests.placer.builders import node, pod

MIX = FragmentationModel((TypicalTask(cpu_milli=1_000, gpu_count=1, gpu_milli=500, weight=1),))


def pick(
    chooser: GpuChooser,
    request: PodRequest,
    state: NodeState,
    chosen: tuple[int, ...] = (),
) -> int:
    """The GPU index ``chooser`` puts first for the pod's next share (``state``'s GPUs are in
    index order, so positions are indices)."""
    facts = pod_facts(request)
    ask = facts.asks[0]
    gpus = [gpu_shape(g) for g in state.gpus]
    # Shares of one container never share a GPU; colocate cases place an *earlier container*.
    taken = set() if isinstance(chooser, gpu_choice.Colocate) else set(chosen)
    candidates = [i for i, g in enumerate(gpus) if share_fits(ask, g) and i not in taken]
    order = chooser.order(facts, state, gpus, candidates, chosen, random.Random(1))
    assert sorted(order) == candidates  # an order of the candidates, nothing else
    return state.gpus[order[0]].index


@pytest.mark.parametrize(
    ("chooser", "request_", "state", "chosen", "expected"),
    [
        pytest.param(
            gpu_choice.Binpack(),
            pod().share(300).build(),
            node("n").gpu(used=100).gpu(used=600).gpu(used=800).build(),
            (),
            1,
            id="binpack-least-free-that-fits",
        ),
        pytest.param(
            gpu_choice.Binpack(),
            pod().share(300).build(),
            node("n").gpus(3).build(),
            (),
            0,
            id="binpack-ties-lowest-index",
        ),
        pytest.param(
            gpu_choice.Spread(),
            pod().share(300).build(),
            node("n").gpu(utilization=70).gpu(utilization=20).gpu(utilization=20, used=300).build(),
            (),
            1,
            id="spread-least-utilised-then-most-free",
        ),
        pytest.param(
            gpu_choice.FirstFit(),
            pod().share(300).build(),
            node("n").gpu(used=800).gpu(used=600).gpu().build(),
            (),
            1,
            id="first-fit-lowest-index-that-fits",
        ),
        pytest.param(
            gpu_choice.Colocate(),
            pod("me").share(100).build(),
            node("n").gpu(used=600).gpu(used=100, holders=("me",)).build(),
            (),
            1,
            id="colocate-gpu-already-serving-the-pod",
        ),
        pytest.param(
            gpu_choice.Colocate(),
            pod().share(100).build(),
            node("n").gpu(used=600).gpu(used=100).build(),
            (1,),
            1,
            id="colocate-with-an-earlier-container",
        ),
        pytest.param(
            gpu_choice.Topology(),
            pod().container(shares=2, mib=1_000).build(),
            node("n")
            .gpu(numa=0)
            .gpu(numa=1, nvlink=(3,))
            .gpu(numa=0)
            .gpu(numa=1, nvlink=(1,))
            .build(),
            (1,),
            3,
            id="topology-nvlink-peer",
        ),
        pytest.param(
            gpu_choice.Topology(),
            pod().container(shares=2, mib=1_000).build(),
            node("n").gpu(numa=1).gpu(numa=0).gpu(numa=0).gpu(numa=1).build(),
            (0,),
            3,
            id="topology-same-numa",
        ),
        # FGD with a 0.5-share mix: putting 0.3 on the 0.3-free GPU leaves the whole GPU usable.
        pytest.param(
            gpu_choice.Fgd(MIX),
            pod().share(300).build(),
            node("n").gpu().gpu(used=700).build(),
            (),
            1,
            id="fgd-least-fragmenting",
        ),
        pytest.param(
            gpu_choice.Fgd(MIX),
            pod().whole(1).build(),
            node("n").gpu(used=700).gpu().gpu().build(),
            (),
            1,
            id="fgd-whole-lowest-idle",
        ),
    ],
)
def test_gpu_choice(
    chooser: GpuChooser,
    request_: PodRequest,
    state: NodeState,
    chosen: tuple[int, ...],
    expected: int,
) -> None:
    assert pick(chooser, request_, state, chosen) == expected


def test_random_choice_is_uniform_over_fitting_gpus() -> None:
    state = node("n").gpus(4).gpu(used=900).build()
    facts = pod_facts(pod().share(300).build())
    rng = random.Random(11)
    gpus = [gpu_shape(g) for g in state.gpus]
    seen = {
        gpu_choice.Random().order(facts, state, gpus, [0, 1, 2, 3], (), rng)[0] for _ in range(200)
    }
    assert seen == {0, 1, 2, 3}
