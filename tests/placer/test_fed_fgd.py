"""The ``tessera`` profile: FGD over CPU- and memory-fed fragmentation with a fill tie-break."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.placer.core.cycle import decide
from services.placer.core.fragmentation import TypicalTask, fill_waste, with_median_memory
from services.placer.core.index import ClusterIndex
from services.placer.core.model import Decision
from services.placer.core.plugins.fed_fgd import FedFragmentation
from services.placer.core.plugins.fgd import FgdScore
from services.placer.core.plugins.gpu_choice import Fgd
from services.placer.core.profiles import ProfileError, ProfileSpec, ScoreSpec, build_profile
from tests.placer.builders import node, pod

A100 = frozenset({"A100"})

# A whole-GPU task asking 10 cores and 48,000 MiB (an eighth of a 384,000 MiB node).
WHOLE_MEM = (
    TypicalTask(cpu_milli=10_000, gpu_count=1, gpu_milli=1_000, memory_mib=48_000, weight=1),
)
WHOLE_NO_MEM = (TypicalTask(cpu_milli=10_000, gpu_count=1, gpu_milli=1_000, weight=1),)
PAIR_MEM = (
    TypicalTask(cpu_milli=1_000, gpu_count=2, gpu_milli=1_000, memory_mib=10_000, weight=1),
)
SHARE_MEM = (TypicalTask(cpu_milli=1_000, gpu_count=1, gpu_milli=500, memory_mib=10_000, weight=1),)
CPU_ONLY_MEM = (
    TypicalTask(cpu_milli=1_000, gpu_count=0, gpu_milli=0, memory_mib=10_000, weight=1),
)
EIGHT_IDLE = (1_000,) * 8


@pytest.mark.parametrize(
    ("mix", "cpu_free", "memory_free", "free", "expected"),
    [
        # Unfed weight 1, memory margin 1 (a GPU nothing can feed is lost).
        # Memory for two copies, CPU for twenty: 2 of 8 idle GPUs fed, 6,000 milli unfed.
        pytest.param(WHOLE_MEM, 200_000, 96_000, EIGHT_IDLE, 6_000, id="memory-feeds-two"),
        # CPU for two, memory for eight: the smaller count feeds.
        pytest.param(WHOLE_MEM, 20_000, 384_000, EIGHT_IDLE, 6_000, id="cpu-feeds-two"),
        pytest.param(WHOLE_MEM, 200_000, 384_000, EIGHT_IDLE, 0, id="all-fed"),
        # Not the memory for one copy: the task cannot run, all idle milli is its fragment.
        pytest.param(WHOLE_MEM, 200_000, 47_999, EIGHT_IDLE, 8_000, id="no-memory-for-one"),
        # A task without a memory figure (0) ignores memory, as the CPU-fed measure does.
        pytest.param(WHOLE_NO_MEM, 200_000, 0, EIGHT_IDLE, 0, id="memory-unknown-ignored"),
        # A 2-GPU task with memory for one copy uses 2 of the 4 idle GPUs.
        pytest.param(PAIR_MEM, 100_000, 10_000, (1_000,) * 4, 2_000, id="pair-one-copy"),
        # Memory for one 500 share: the most-free fitting GPU is fed, the 600 is not.
        pytest.param(SHARE_MEM, 100_000, 19_999, (600, 1_000), 600, id="share-one-copy"),
        pytest.param(SHARE_MEM, 100_000, 20_000, (600, 1_000), 0, id="share-two-copies"),
        # A too-small GPU is FGD's fragment whatever memory there is.
        pytest.param(SHARE_MEM, 100_000, 100_000, (300, 1_000), 300, id="too-small-as-fgd"),
        pytest.param(CPU_ONLY_MEM, 100_000, 100_000, (300, 1_000), 1_300, id="cpu-only-task"),
        pytest.param(WHOLE_MEM, 0, 0, (0, 0), 0, id="nothing-idle"),
    ],
)
def test_fed_fragmentation_by_hand(
    mix: tuple[TypicalTask, ...],
    cpu_free: int,
    memory_free: int,
    free: tuple[int, ...],
    expected: float,
) -> None:
    model = FedFragmentation(mix, unfed_weight=1, memory_margin=1)
    assert model.node(A100, cpu_free, memory_free, free) == pytest.approx(expected)
    # Asked again in another GPU order: the memoised value is the same.
    assert model.node(A100, cpu_free, memory_free, tuple(reversed(free))) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("margin", "unfed_weight", "expected"),
    [
        # 144,000 MiB free: three 48,000 MiB copies at margin 1, two at 1.5 (72,000 each).
        pytest.param(1.0, 1.0, 5_000, id="margin-1"),
        pytest.param(1.5, 1.0, 6_000, id="margin-1.5"),
        pytest.param(1.5, 0.5, 3_000, id="margin-1.5-unfed-half"),
        # Margin 0 leaves memory out.
        pytest.param(0.0, 1.0, 0, id="margin-0-ignores-memory"),
    ],
)
def test_memory_margin_and_unfed_weight(
    margin: float, unfed_weight: float, expected: float
) -> None:
    model = FedFragmentation(WHOLE_MEM, unfed_weight=unfed_weight, memory_margin=margin)
    assert model.node(A100, 200_000, 144_000, EIGHT_IDLE) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("first_copy_exact", "memory_free", "expected"),
    [
        # 50,000 MiB free: the 48,000 MiB ask fits once, its margined 57,600 does not.
        pytest.param(True, 50_000, 3_500, id="first-copy-at-the-ask"),
        pytest.param(False, 50_000, 8_000, id="margin-on-the-first-copy-too"),
        # Below the ask itself the task cannot run either way.
        pytest.param(True, 47_999, 8_000, id="below-the-ask"),
        # Past the first, copies count at the margin: 105,599 // 57,600 = 1, 115,200 holds two.
        pytest.param(True, 105_599, 3_500, id="second-copy-at-the-margin"),
        pytest.param(True, 115_200, 3_000, id="two-copies"),
    ],
)
def test_the_first_copy_needs_the_typical_ask_without_margin(
    first_copy_exact: bool, memory_free: int, expected: float
) -> None:
    """A G3 node's 768 GiB hold the 720 GiB 8-GPU task of the trace, which the margined ask (864
    GiB) said could never run there: the node's GPUs were not kept for it."""
    model = FedFragmentation(
        WHOLE_MEM, unfed_weight=0.5, memory_margin=1.2, first_copy_exact=first_copy_exact
    )
    assert model.node(A100, 200_000, memory_free, EIGHT_IDLE) == pytest.approx(expected)


def test_bad_model_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match=r"memory_margin must be >= 0"):
        FedFragmentation(WHOLE_MEM, memory_margin=-1)
    with pytest.raises(ValueError, match=r"unfed_weight must be in 0\.\.1"):
        FedFragmentation(WHOLE_MEM, unfed_weight=2)


TASKS = st.builds(
    TypicalTask,
    cpu_milli=st.integers(0, 40_000),
    gpu_count=st.integers(0, 4),
    gpu_milli=st.sampled_from([100, 250, 470, 810, 1_000]),
    memory_mib=st.integers(0, 100_000),
    weight=st.floats(0.01, 1.0),
)


@given(
    mix=st.lists(TASKS, min_size=1, max_size=5),
    cpu_free=st.integers(0, 200_000),
    memory_free=st.integers(0, 800_000),
    free=st.lists(st.integers(0, 1_000), min_size=1, max_size=8),
    unfed_weight=st.floats(0, 1),
)
def test_fed_never_below_cpu_fed_and_equal_with_memory_to_spare(
    mix: list[TypicalTask], cpu_free: int, memory_free: int, free: list[int], unfed_weight: float
) -> None:
    fed = FedFragmentation(mix, unfed_weight=unfed_weight)
    without_memory = FedFragmentation(mix, unfed_weight=unfed_weight, memory_margin=0)
    cpu_fed = without_memory.node(A100, cpu_free, memory_free, free)
    assert cpu_fed - 1e-6 <= fed.node(A100, cpu_free, memory_free, free) <= sum(free) + 1e-6
    plenty = max(t.memory_mib for t in mix) * 2 * len(free)
    assert fed.node(A100, cpu_free, plenty, free) == pytest.approx(cpu_fed)
    # Memory margin 0 leaves memory out: no free memory at all changes nothing.
    assert without_memory.node(A100, cpu_free, 0, free) == pytest.approx(cpu_fed)


def by_definition(
    mix: list[TypicalTask], unfed_weight: float, cpu_free: int, memory_free: int, free: list[int]
) -> float:
    """The fed fragment straight from the module docstring's definition, GPU by GPU."""
    total_weight = sum(t.weight for t in mix)
    idle = sum(free)
    total = 0.0
    for task in mix:
        memory = int(task.memory_mib * 1.2)
        fitting = sorted((m for m in free if m >= task.gpu_milli), reverse=True)
        if (
            task.gpu_count == 0
            or cpu_free < task.cpu_milli
            or memory_free < task.memory_mib  # the first copy needs the typical ask itself
            or len(fitting) < task.gpu_count
        ):
            total += task.weight / total_weight * idle
            continue
        copies = max(  # one copy fits; the margin counts from the second on
            1,
            min(
                len(free),
                cpu_free // task.cpu_milli if task.cpu_milli else len(free),
                memory_free // memory if memory else len(free),
            ),
        )
        unfed = sum(fitting[copies * task.gpu_count :])
        total += task.weight / total_weight * (idle - sum(fitting) + unfed_weight * unfed)
    return total


@given(
    mix=st.lists(TASKS, min_size=1, max_size=5),
    cpu_free=st.integers(0, 200_000),
    memory_free=st.integers(0, 800_000),
    free=st.lists(st.sampled_from([0, 130, 250, 470, 810, 1_000]), min_size=1, max_size=8),
    unfed_weight=st.floats(0, 1),
)
def test_fed_fragmentation_is_its_definition(
    mix: list[TypicalTask], cpu_free: int, memory_free: int, free: list[int], unfed_weight: float
) -> None:
    """The model's prefix sums and memos (copies by free CPU and memory) give the definition's
    value for any state, asked twice (the second time from the memos)."""
    model = FedFragmentation(mix, unfed_weight=unfed_weight)
    expected = by_definition(mix, unfed_weight, cpu_free, memory_free, free)
    for _ in range(2):
        assert model.node(A100, cpu_free, memory_free, free) == pytest.approx(expected)


def _share(milli: int) -> TypicalTask:
    return TypicalTask(cpu_milli=1_000, gpu_count=1, gpu_milli=milli, weight=1)


@pytest.mark.parametrize(
    ("sizes", "hole", "expected"),
    [
        # The trace's 190 hole beside a 0.81 share: a 160 share still fits, 30 stays.
        pytest.param((160, 810), 190, 30, id="190-takes-160"),
        pytest.param((160, 810), 150, 150, id="nothing-fits"),
        pytest.param((160, 810), 0, 0, id="empty"),
        # 940 = 810 + 130 (130 left) or 470 + 470 (nothing left): the best packing counts.
        pytest.param((470, 810), 940, 0, id="best-packing"),
        pytest.param((470, 810), 1_000, 60, id="idle-gpu-without-whole-tasks"),
        pytest.param((470, 810, 1_000), 1_000, 0, id="idle-gpu-takes-a-whole-task"),
        pytest.param((), 700, 700, id="no-sizes"),
    ],
)
def test_fill_waste_by_hand(sizes: tuple[int, ...], hole: int, expected: int) -> None:
    mix = [_share(s) for s in sizes] + [
        TypicalTask(cpu_milli=1_000, gpu_count=2, gpu_milli=1_000, weight=1),  # multi-GPU: no size
        TypicalTask(cpu_milli=1_000, gpu_count=0, gpu_milli=0, weight=1),  # CPU-only: no size
    ]
    assert fill_waste(mix)[hole] == expected


# FGD points tie, fill waste does not: a 300 share on an 800-free GPU leaves a 500 hole the
# typical 500 share fills; on a 500-free GPU it fills that hole with the wrong size, leaving 200.
# (F: 0.999 x 800 -> 0.999 x 500 and 0.999 x 500 -> 200, both 57 points.)
TIE_MIX = (
    TypicalTask(cpu_milli=1_000, gpu_count=1, gpu_milli=1_000, weight=999),
    TypicalTask(cpu_milli=1_000, gpu_count=1, gpu_milli=500, weight=1),
)
HOLE_800 = node("hole-800").gpu(used=200).build()
HOLE_500 = node("hole-500").gpu(used=500).build()


@pytest.mark.parametrize(
    ("profile", "expected_node"),
    [
        # hole-500 comes first in the seed order: the CPU-fed score ties and takes it.
        pytest.param(
            ProfileSpec(name="cpu", scores=(ScoreSpec(plugin="fgd-cpu"),), gpu_choice="fgd-cpu"),
            "hole-500",
            id="fgd-cpu-seed-order",
        ),
        pytest.param("tessera", "hole-800", id="tessera-keeps-the-500-hole"),
    ],
)
def test_share_ties_keep_holes_fillable(profile: ProfileSpec | str, expected_node: str) -> None:
    cluster = ClusterIndex([HOLE_500, HOLE_800], order=["hole-500", "hole-800"])
    built = build_profile(profile, typical_tasks=TIE_MIX)
    outcome = decide(pod().share(300).build(), cluster, built, now=0)
    assert isinstance(outcome, Decision)
    assert outcome.node == expected_node
    assert int(outcome.score) == 57


def test_gpu_choice_follows_the_fill_tie_break() -> None:
    # One node with both GPUs: the share goes to the 800-free GPU (index 1), not the first index.
    both = node("both").gpu(used=500).gpu(used=200).build()
    cluster = ClusterIndex([both])
    outcome = decide(
        pod().share(300).build(), cluster, build_profile("tessera", typical_tasks=TIE_MIX), now=0
    )
    assert isinstance(outcome, Decision)
    [placement] = outcome.reservation.containers
    assert [s.index for s in placement.gpus] == [1]


# 8 idle GPUs, CPU to spare, 120,000 MiB free: two typical tasks at the 1.2 margin (57,600 MiB
# each), one after the pod's 20,000 MiB go. The fed measure scores that 37 (F 3,000 -> 3,500).
MEMORY_STARVED = node("memory-starved").cpu(96_000).memory(384_000, used=264_000).gpus(8).build()
RICH = node("rich").cpu(104_000).memory(524_288).gpus(2).build()


@pytest.mark.parametrize(
    ("profile", "expected_node"),
    [
        # Both measures see no CPU change; only the fed measure sees the memory go.
        pytest.param(
            ProfileSpec(name="cpu", scores=(ScoreSpec(plugin="fgd-cpu"),), gpu_choice="fgd-cpu"),
            "memory-starved",
            id="fgd-cpu-strands",
        ),
        pytest.param("tessera", "rich", id="tessera-feeds"),
    ],
)
def test_cpu_only_pod_keeps_memory_where_gpus_need_it(
    profile: ProfileSpec | str, expected_node: str
) -> None:
    cluster = ClusterIndex([MEMORY_STARVED, RICH], order=["memory-starved", "rich"])
    built = build_profile(profile, typical_tasks=WHOLE_MEM)
    outcome = decide(pod().cpu_only(4_000, memory=20_000).build(), cluster, built, now=0)
    assert isinstance(outcome, Decision)
    assert outcome.node == expected_node


def test_tessera_profile_uses_the_fed_score_and_gpu_choice() -> None:
    profile = build_profile("tessera", typical_tasks=WHOLE_MEM)
    [(score, weight)] = profile.scores
    assert (score.name, weight) == ("fgd-fed", 1.0)
    assert isinstance(score, FgdScore)
    assert isinstance(score.model, FedFragmentation)
    assert (score.model.unfed_weight, score.model.memory_margin) == (0.5, 1.2)
    assert score.fill_waste == fill_waste(WHOLE_MEM)
    assert isinstance(profile.gpu_choice, Fgd)
    assert profile.gpu_choice.model is score.model
    assert profile.gpu_choice.fill_waste == fill_waste(WHOLE_MEM)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param({"exact": True}, "unknown argument(s) exact", id="unknown"),
        pytest.param({"unfed_weight": 2}, "'unfed_weight' must be a number in 0..1", id="big"),
        pytest.param({"memory_margin": -1}, "'memory_margin' must be a number >= 0", id="neg"),
        pytest.param({"memory_margin": True}, "'memory_margin' must be a number", id="bool"),
    ],
)
def test_fgd_fed_arguments_are_checked(args: dict[str, object], message: str) -> None:
    spec = ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd-fed", args=args),))
    with pytest.raises(ProfileError) as caught:
        build_profile(spec)
    assert message in str(caught.value)
    assert "plugin 'fgd-fed'" in str(caught.value)


def test_fgd_fed_arguments_reach_the_model() -> None:
    args = {"unfed_weight": 1, "memory_margin": 1.5}
    spec = ProfileSpec(name="p", scores=(ScoreSpec(plugin="fgd-fed", args=args),))
    [(score, _)] = build_profile(spec, typical_tasks=WHOLE_MEM).scores
    assert isinstance(score, FgdScore)
    assert isinstance(score.model, FedFragmentation)
    assert (score.model.unfed_weight, score.model.memory_margin) == (1, 1.5)


@pytest.mark.parametrize(
    ("memories", "expected"),
    [
        pytest.param((5_600,), 5_600, id="one"),
        pytest.param((1_000, 3_000, 2_000), 2_000, id="median"),
        pytest.param((1_000, 3_000), 1_000, id="median-low"),
    ],
)
def test_typical_memory_is_the_median_of_the_spec(memories: tuple[int, ...], expected: int) -> None:
    mix = (TypicalTask(cpu_milli=4_000, gpu_count=1, gpu_milli=1_000, weight=1),)
    other = (8_000, 1_000, 1, (), 999_999)  # another spec: not counted
    tasks = [(4_000, 1_000, 1, (), m) for m in memories] + [other]
    [typical] = with_median_memory(mix, tasks)
    assert typical.memory_mib == expected
