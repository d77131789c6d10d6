"""The one search over a node's GPUs: the fit filter and the GPU choice agree on every node.

Issue 21's reproductions: two GPUs that tie on free memory and cores but differ in free slots,
their sorted order (the node shape's) differing from their index order, crashed every built-in
profile; and the filter refused a pod that fits once the shares go in another order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core.cycle import decide
from services.placer.core.facts import ShareAsk, pod_facts
from services.placer.core.index import ClusterIndex
from services.placer.core.ledger import take_share
from services.placer.core.model import Decision, GpuSlice, GpuState, NodeState, PodRequest
from services.placer.core.plugins.fit import GpuModel, NodeFit
from services.placer.core.profiles import BUILTIN, build_profile
from services.placer.core.search import (
    SEARCH_STEPS,
    Prefer,
    assign,
    share_fits,
    slice_memory,
    smallest_first,
    taken,
)
from services.placer.core.shape import GpuShape, gpu_shape, node_shape
from tests.placer.builders import node, pod
from tests.placer.test_properties import gpus, nodes, requests

PROFILES = tuple(BUILTIN)

# Container a: one share of 4,000 MiB; container b: two shares of 4,000 MiB (distinct GPUs).
A_AND_B = pod("p").container("a", shares=1, mib=4_000).container("b", shares=2, mib=4_000).build()

TIED_IN_ANOTHER_ORDER = [
    pytest.param(node("n0").gpu(model="T4", slots=1).gpu(model="A100").build(), id="models"),
    pytest.param(node("n0").gpu(slots=4, slots_used=3).gpu().build(), id="slots-limited-unlimited"),
    pytest.param(
        node("n0")
        .gpu(mib=32_000, used=500, cores_used=700, slots=2, slots_used=1)
        .gpu(mib=16_000, cores_used=700)
        .build(),
        id="32-and-16-gb",
    ),
]

# Same model, 4 slots each, 3 and 1 free, 13,000 MiB free on both: a -> GPU 0, b -> GPU 0 + 1.
FITS_ANOTHER_WAY = (
    node("n0")
    .gpu(slots=4, slots_used=1, foreign_mib=3_000)
    .gpu(slots=4, slots_used=3, foreign_mib=3_000)
    .build()
)


def placed_on(state: NodeState, profile: str) -> dict[str, list[int]]:
    """The GPUs ``A_AND_B``'s containers get on ``state`` alone, once the ledger booked them."""
    cluster = ClusterIndex([state])
    outcome = decide(A_AND_B, cluster, build_profile(profile), now=0.0)
    assert isinstance(outcome, Decision), outcome
    assert cluster.reserve(outcome.reservation) is None
    return {c.container: sorted(g.index for g in c.gpus) for c in outcome.reservation.containers}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("state", TIED_IN_ANOTHER_ORDER)
def test_a_valid_pod_on_gpus_tied_in_another_order_is_placed(
    state: NodeState, profile: str
) -> None:
    where = placed_on(state, profile)
    # b needs both GPUs, so the slot-limited GPU 0 (one slot free) can only be b's.
    assert where == {"a": [1], "b": [0, 1]}


@pytest.mark.parametrize("profile", PROFILES)
def test_a_pod_that_fits_only_another_way_is_placed(profile: str) -> None:
    assert placed_on(FITS_ANOTHER_WAY, profile) == {"a": [0], "b": [0, 1]}


def test_the_fit_filter_passes_a_pod_that_fits_only_another_way() -> None:
    fit = NodeFit((GpuModel(),))
    assert fit.filter(pod_facts(A_AND_B), node_shape(FITS_ANOTHER_WAY)) is None


# -- the search itself -------------------------------------------------------------------------


def greedy(
    asks: Sequence[ShareAsk], gpus: list[GpuShape], prefer: Prefer
) -> tuple[int, ...] | None:
    """Each share on the order's first candidate, never going back (what the core did before)."""
    chosen: list[int] = []
    for ask in asks:
        used: set[int] = set()
        for _ in range(ask.shares):
            candidates = [i for i, g in enumerate(gpus) if i not in used and share_fits(ask, g)]
            if not candidates:
                return None
            first = prefer(gpus, candidates, chosen)[0]
            gpus[first] = taken(gpus[first], ask)
            used.add(first)
            chosen.append(first)
    return tuple(chosen)


@settings(max_examples=300, deadline=None)
@given(state=nodes(max_gpus=6), request=requests(), seed=st.integers(0, 3))
def test_the_search_keeps_the_greedy_choice_whenever_it_fits(
    state: NodeState, request: PodRequest, seed: int
) -> None:
    # So a decision changes only where the greedy walk found no GPUs (and the core crashed).
    gpus = [gpu_shape(g) for g in state.gpus]
    asks = pod_facts(request).asks

    def shuffled(
        now: Sequence[GpuShape], candidates: list[int], chosen: Sequence[int]
    ) -> list[int]:
        return random.Random(seed + len(chosen)).sample(candidates, len(candidates))

    for prefer in (smallest_first, shuffled):
        walked = greedy(asks, list(gpus), prefer)
        if walked is not None:
            assert assign(asks, gpus, [True] * len(gpus), prefer) == walked


@settings(max_examples=300, deadline=None)
@given(gpu=gpus("n0", 0, (16_000, 0, 0)) | gpus("n0", 0, (4_000, 3_000, 300)), request=requests())
def test_the_search_leaves_a_gpu_as_the_ledger_books_it(gpu: GpuState, request: PodRequest) -> None:
    for ask in pod_facts(request).asks:
        shape = gpu_shape(gpu)
        piece = GpuSlice(
            index=0,
            uuid=gpu.uuid,
            memory_mib=slice_memory(ask, gpu),
            core_milli=ask.core_milli,
            exclusive=ask.whole,
        )
        booked = take_share(gpu, piece, "p")
        assert share_fits(ask, shape) == (not isinstance(booked, str))
        if not isinstance(booked, str):
            assert gpu_shape(booked) == taken(shape, ask)


def eight_gpus(used: tuple[int, ...], slots: tuple[int, ...]) -> list[GpuShape]:
    state = node("n0")
    for milli, count in zip(used, slots, strict=True):
        state.gpu(used=milli, cores_used=0, slots=count)
    return list(node_shape(state.build()).gpus)


def asks_of(*containers: tuple[int, int]) -> tuple[ShareAsk, ...]:
    request = pod()
    for n, (shares, mib) in enumerate(containers):
        request.container(f"c{n}", shares=shares, mib=mib)
    return pod_facts(request.build()).asks


# The pods of three containers of up to three shares that took the search the most placements to
# rule out and to place, among 40,000 random ones on 8-GPU nodes.
HARDEST_MISFIT = (
    eight_gpus((600, 500, 600, 750, 750, 0, 0, 500), (0, 0, 2, 2, 2, 2, 0, 2)),
    asks_of((3, 5_000), (3, 5_000), (3, 7_000)),
)
HARDEST_FIT = (
    eight_gpus((500, 500, 700, 700, 500, 500, 750, 750), (2, 3, 0, 2, 2, 0, 2, 2)),
    asks_of((3, 4_000), (3, 7_000), (3, 4_000)),
)


@pytest.fixture
def placements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the shares the search places (its steps)."""
    counted: list[int] = []

    def counting_taken(gpu: GpuShape, ask: ShareAsk) -> GpuShape:
        counted.append(1)
        return taken(gpu, ask)

    monkeypatch.setattr("services.placer.core.search.taken", counting_taken)
    return counted


def test_a_pod_that_does_not_fit_is_ruled_out_within_the_bound(placements: list[int]) -> None:
    gpus, asks = HARDEST_MISFIT
    assert assign(asks, gpus, [True] * 8) is None
    assert 400 < len(placements) < SEARCH_STEPS  # every way was tried, none fits


def test_past_its_bound_the_search_takes_a_pod_as_not_fitting(
    placements: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus, asks = HARDEST_FIT
    assert assign(asks, gpus, [True] * 8) is not None
    assert 40 < len(placements) < SEARCH_STEPS
    monkeypatch.setattr("services.placer.core.search.SEARCH_STEPS", 20)
    placements.clear()
    assert assign(asks, gpus, [True] * 8) is None
    assert len(placements) == 20
