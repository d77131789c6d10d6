"""CPU-fed fragmentation (``fgd-cpu``, the ``tessera`` profile before ``fgd-fed``), by hand."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.placer.core.cycle import decide
from services.placer.core.facts import pod_facts
from services.placer.core.fragmentation import FragmentationModel, TypicalTask
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision, NodeState, PodRequest
from services.placer.core.plugins.fed_fgd import FedFragmentation
from services.placer.core.plugins.fgd import FgdScore
from services.placer.core.plugins.gpu_choice import Fgd
from services.placer.core.profiles import ProfileError, ProfileSpec, ScoreSpec, build_profile
from services.placer.core.shape import node_shape
from tests.placer.builders import node, pod

A100 = frozenset({"A100"})


def cpu_fed(mix: Sequence[TypicalTask], *, unfed_weight: float = 0.5) -> FedFragmentation:
    """The ``fgd-cpu`` measure: fed fragmentation with memory left out."""
    return FedFragmentation(mix, unfed_weight=unfed_weight, memory_margin=0)


WHOLE = (TypicalTask(cpu_milli=10_000, gpu_count=1, gpu_milli=1_000, weight=1),)
HALF_SHARE = (TypicalTask(cpu_milli=1_000, gpu_count=1, gpu_milli=500, weight=1),)
PAIR = (TypicalTask(cpu_milli=8_000, gpu_count=2, gpu_milli=1_000, weight=1),)
V100_ONLY = (
    TypicalTask(cpu_milli=1_000, gpu_count=1, gpu_milli=1_000, models=("V100",), weight=1),
)
CPU_ONLY = (TypicalTask(cpu_milli=1_000, gpu_count=0, gpu_milli=0, weight=1),)
# Half CPU-only tasks, half half-GPU shares (the mix of test_scores.py).
MIXED = CPU_ONLY + HALF_SHARE


@pytest.mark.parametrize(
    ("mix", "cpu_free", "free", "expected"),
    [
        # At unfed weight 1 (a GPU no CPU can feed is lost).
        # 20 cores feed two 10-core tasks: 2 of the 8 idle GPUs usable, 6,000 milli stranded.
        # (FGD's F is 0 here: one task fits, so every free GPU counts as usable.)
        pytest.param(WHOLE, 20_000, (1_000,) * 8, 6_000, id="cpu-feeds-two-of-eight"),
        pytest.param(WHOLE, 80_000, (1_000,) * 8, 0, id="cpu-feeds-all-eight"),
        pytest.param(WHOLE, 9_999, (1_000,) * 8, 8_000, id="no-cpu-all-stranded"),
        # Only the 1,000-free GPU fits a 500 share; the 300 left on the other is stranded.
        pytest.param(HALF_SHARE, 32_000, (300, 1_000), 300, id="share-as-fgd"),
        pytest.param(HALF_SHARE, 1_000, (300, 1_000), 300, id="share-one-copy-enough"),
        # Three GPUs fit, CPU feeds two: the two most-free ones are usable, the 600 is not.
        pytest.param(HALF_SHARE, 2_000, (600, 1_000, 1_000), 600, id="share-two-copies"),
        # A 2-GPU task with CPU for one copy uses 2 of the 4 idle GPUs.
        pytest.param(PAIR, 8_000, (1_000,) * 4, 2_000, id="pair-one-copy"),
        pytest.param(PAIR, 16_000, (1_000,) * 4, 0, id="pair-two-copies"),
        pytest.param(PAIR, 100_000, (1_000, 500, 1_000), 500, id="pair-half-gpu-left"),
        pytest.param(PAIR, 100_000, (1_000, 500), 1_500, id="pair-does-not-fit"),
        pytest.param(V100_ONLY, 100_000, (1_000, 400), 1_400, id="model-excluded"),
        pytest.param(CPU_ONLY, 100_000, (1_000, 400), 1_400, id="cpu-only-task"),
        pytest.param(WHOLE, 0, (0, 0), 0, id="nothing-idle"),
        # 0.5 * 1,300 (CPU-only) + 0.5 * 300 (share) = 800, as FGD.
        pytest.param(MIXED, 32_000, (300, 1_000), 800, id="mixed-as-fgd"),
    ],
)
def test_cpu_fed_fragmentation_by_hand(
    mix: tuple[TypicalTask, ...], cpu_free: int, free: tuple[int, ...], expected: float
) -> None:
    model = cpu_fed(mix, unfed_weight=1)
    assert model.node(A100, cpu_free, 0, free) == pytest.approx(expected)
    # Asked again in another GPU order: the memoised value is the same.
    assert model.node(A100, cpu_free, 0, tuple(reversed(free))) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("unfed_weight", "expected"),
    [
        # 8 idle GPUs, CPU feeds 2: FGD's 0 plus the weight times the 6,000 unfed milli.
        pytest.param(1.0, 6_000, id="unfed-lost"),
        pytest.param(0.5, 3_000, id="unfed-half"),
        pytest.param(0.0, 0, id="unfed-ignored-as-fgd"),
    ],
)
def test_unfed_weight_scales_the_cpu_stranded_part(unfed_weight: float, expected: float) -> None:
    model = cpu_fed(WHOLE, unfed_weight=unfed_weight)
    assert model.node(A100, 20_000, 0, (1_000,) * 8) == pytest.approx(expected)


def test_unfed_weight_outside_0_to_1_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unfed_weight must be in 0\.\.1"):
        cpu_fed(WHOLE, unfed_weight=1.5)


TASKS = st.builds(
    TypicalTask,
    cpu_milli=st.integers(0, 40_000),
    gpu_count=st.integers(0, 4),
    gpu_milli=st.sampled_from([100, 250, 470, 810, 1_000]),
    weight=st.floats(0.01, 1.0),
)


@given(
    mix=st.lists(TASKS, min_size=1, max_size=5),
    cpu_free=st.integers(0, 200_000),
    free=st.lists(st.integers(0, 1_000), min_size=1, max_size=8),
    unfed_weight=st.floats(0, 1),
)
def test_cpu_fed_never_below_fgd_and_equal_with_cpu_to_spare(
    mix: list[TypicalTask], cpu_free: int, free: list[int], unfed_weight: float
) -> None:
    fed = cpu_fed(mix, unfed_weight=unfed_weight).node(A100, cpu_free, 0, free)
    fgd = FragmentationModel(mix).node(A100, cpu_free, 0, free)
    assert fgd - 1e-6 <= fed <= sum(free) + 1e-6
    plenty = max(t.cpu_milli for t in mix) * len(free)
    assert cpu_fed(mix, unfed_weight=unfed_weight).node(A100, plenty, 0, free) == pytest.approx(
        FragmentationModel(mix).node(A100, plenty, 0, free)
    )


# 8 idle GPUs and 20 free cores: room for two 10-core tasks.
STARVED = node("starved").cpu(96_000, used=76_000).gpus(8).build()
# 2 idle GPUs and 100 free cores.
RICH = node("rich").cpu(104_000, used=4_000).gpus(2).build()


def score_of(model: FragmentationModel, request: PodRequest, state: NodeState) -> float:
    return FgdScore(model).score(pod_facts(request), node_shape(state))


@pytest.mark.parametrize(
    ("request_", "state", "fed_score", "fgd_score"),
    [
        # Unfed weight 0.5: F = 0.5 x 6,000 unfed milli -> after 10 cores go, CPU feeds one GPU:
        # F' = 0.5 x 7,000; int(100 * sigmoid(-0.5)) = 37. FGD sees no change (one task still
        # fits): 50.
        pytest.param(pod().cpu_only(10_000).build(), STARVED, 37, 50, id="cpu-only-on-starved"),
        # Plenty of CPU before and after: no change for either measure.
        pytest.param(pod().cpu_only(10_000).build(), RICH, 50, 50, id="cpu-only-on-rich"),
        # A whole-GPU task uses one fed GPU: 6,000 unfed milli before and after (7 idle, one fed).
        pytest.param(pod().whole(1, cpu=10_000).build(), STARVED, 50, 50, id="gpu-on-starved"),
    ],
)
def test_fgd_score_over_cpu_fed_fragmentation(
    request_: PodRequest, state: NodeState, fed_score: float, fgd_score: float
) -> None:
    assert score_of(cpu_fed(WHOLE), request_, state) == fed_score
    assert score_of(FragmentationModel(WHOLE), request_, state) == fgd_score


@pytest.mark.parametrize(
    ("profile", "expected_node"),
    [
        # The starved node comes first in the tie-break order: FGD scores both 50 and takes it,
        # stranding its GPUs; tessera sees the stranding and takes the CPU-rich node.
        pytest.param("fgd", "starved", id="fgd-strands"),
        pytest.param("tessera", "rich", id="tessera-feeds"),
    ],
)
def test_cpu_only_pod_goes_where_it_strands_no_gpu(profile: str, expected_node: str) -> None:
    cluster = ClusterIndex([STARVED, RICH], order=["starved", "rich"])
    outcome = decide(
        pod().cpu_only(10_000).build(),
        cluster,
        build_profile(profile, typical_tasks=WHOLE),
        now=0,
    )
    assert isinstance(outcome, Decision)
    assert outcome.node == expected_node


def test_fgd_cpu_profile_scores_and_chooses_gpus_on_cpu_fed_fragmentation() -> None:
    spec = ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd-cpu"),), gpu_choice="fgd-cpu")
    profile = build_profile(spec, typical_tasks=WHOLE)
    [(score, weight)] = profile.scores
    assert (score.name, weight) == ("fgd", 1.0)
    assert isinstance(score, FgdScore)
    assert isinstance(score.model, FedFragmentation)
    assert score.model.memory_margin == 0
    assert isinstance(profile.gpu_choice, Fgd)
    assert profile.gpu_choice.model is score.model


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            {"exact": True}, "unknown argument(s) exact (known: unfed_weight)", id="unknown"
        ),
        pytest.param({"unfed_weight": 2}, "'unfed_weight' must be a number in 0..1", id="too-big"),
        pytest.param({"unfed_weight": True}, "'unfed_weight' must be a number", id="not-a-number"),
    ],
)
def test_fgd_cpu_arguments_are_checked(args: dict[str, object], message: str) -> None:
    spec = ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd-cpu", args=args),))
    with pytest.raises(ProfileError) as caught:
        build_profile(spec)
    assert message in str(caught.value)
    assert "plugin 'fgd-cpu'" in str(caught.value)


def test_fgd_cpu_unfed_weight_argument_reaches_the_model() -> None:
    spec = ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd-cpu", args={"unfed_weight": 1}),))
    [(score, _)] = build_profile(spec, typical_tasks=WHOLE).scores
    assert isinstance(score, FgdScore)
    assert isinstance(score.model, FedFragmentation)
    assert (score.model.unfed_weight, score.model.memory_margin) == (1, 0)
