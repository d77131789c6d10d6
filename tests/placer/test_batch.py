"""Judging shapes together (``core/batch.py``) gives exactly the scalar plugins' judgements."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core import ranking
from services.placer.core.batch import FgdBatch, shape_rows
from services.placer.core.facts import pod_facts
from services.placer.core.fragmentation import TypicalTask
from services.placer.core.framework import BATCH_MIN, CATCH_UP_MIN, Profile
from services.placer.core.index import ClusterIndex
from services.placer.core.model import NodeState, PodRequest
from services.placer.core.plugins.groups import GroupFilter
from services.placer.core.profiles import DEFAULT_TYPICAL_TASKS, build_profile
from tests.placer.builders import node, pod

GROUP = "team-a"


@st.composite
def gpus_of(draw: st.DrawFn, name: str) -> NodeState:
    built = node(name)
    built.cpu(64_000, draw(st.sampled_from((0, 8_000, 40_000, 63_000, 64_000))))
    built.memory(262_144, draw(st.sampled_from((0, 100_000, 250_000))))
    for _ in range(draw(st.sampled_from((0, 1, 2, 4, 4, 8)))):
        slots = draw(st.sampled_from((0, 0, 4)))
        built.gpu(
            model=draw(st.sampled_from(("A100", "A100", "T4"))),
            mib=draw(st.sampled_from((16_000, 81_920))),
            used=draw(st.sampled_from((0, 0, 100, 250, 300, 500, 650, 700, 1000))),
            foreign_mib=draw(st.sampled_from((0, 0, 512, 7_000))),
            healthy=draw(st.booleans()) or draw(st.booleans()),
            exclusive=draw(st.integers(0, 9)) == 0,
            slots=slots,
            slots_used=draw(st.integers(0, slots)),
            groups=draw(st.sampled_from((frozenset(), frozenset({GROUP})))),
        )
    if draw(st.integers(0, 9)) == 0:
        built.cordoned()
    if draw(st.booleans()):
        built.groups(GROUP)
    return built.build()


@st.composite
def requests(draw: st.DrawFn) -> PodRequest:
    cpu = draw(st.sampled_from((500, 1_000, 4_000, 16_000)))
    memory = draw(st.sampled_from((1_024, 16_384, 120_000)))
    built = pod("p")
    kind = draw(st.sampled_from(("share", "share", "pct", "cores", "shares", "whole")))
    if kind == "share":
        built.container(
            cpu=cpu,
            memory=memory,
            shares=1,
            mib=draw(st.sampled_from((2_048, 8_192, 16_384, 40_000))),
            cores=draw(st.sampled_from((None, 10, 30, 50))),
        )
    elif kind == "pct":
        built.container(cpu=cpu, memory=memory, shares=1, pct=draw(st.sampled_from((10, 25, 50))))
    elif kind == "shares":  # a share on each of 2 or 3 GPUs: not the paper's sharing task
        built.container(cpu=cpu, memory=memory, shares=draw(st.integers(2, 3)), mib=4_096, cores=20)
    elif kind == "cores":
        built.container(cpu=cpu, memory=memory, shares=1, cores=draw(st.sampled_from((5, 20))))
    else:
        built.whole(draw(st.integers(1, 3)), cpu=cpu, memory=memory)
    fields: dict[str, object] = {}
    models = draw(st.sampled_from(((), ("A100",), ("T4",))))
    if models:
        fields["gpu_models"] = models
    if draw(st.integers(0, 4)) == 0:
        fields["gpu_models_excluded"] = ("T4",)
    if draw(st.booleans()):
        fields["group"] = GROUP
    return built.with_(**fields).build() if fields else built.build()


MIXES = st.one_of(
    st.just(DEFAULT_TYPICAL_TASKS),
    st.lists(
        st.builds(
            TypicalTask,
            cpu_milli=st.sampled_from((0, 1_000, 8_000, 12_000)),
            gpu_count=st.sampled_from((0, 1, 1, 2, 8)),
            gpu_milli=st.sampled_from((100, 250, 500, 1_000, 1_500)),
            models=st.sampled_from(((), ("T4",), ("A100", "V100"))),
            weight=st.sampled_from((0.5, 1.0, 3.0)),
            memory_mib=st.sampled_from((0, 4_096, 48_000)),
        ),
        min_size=1,
        max_size=6,
    ),
)


def tessera(mix: tuple[TypicalTask, ...] | list[TypicalTask], **options: object) -> Profile:
    return build_profile("tessera", typical_tasks=mix, **options)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(
    nodes=st.lists(st.integers(0, 10**6), min_size=1, max_size=14).flatmap(
        lambda seeds: st.tuples(*(gpus_of(f"n{i:02d}") for i in range(len(seeds))))
    ),
    asked=st.lists(requests(), min_size=1, max_size=2),
    mix=MIXES,
    grouped=st.booleans(),
)
def test_batch_judgements_are_the_scalar_ones(
    nodes: tuple[NodeState, ...],
    asked: list[PodRequest],
    mix: list[TypicalTask],
    grouped: bool,
) -> None:
    """Fit reasons, scores of a GPU-sharing pod on every GPU it fits (fill-waste tie-break
    included), of other shares and of whole GPUs where the GPU search puts them: equal to the
    last bit, on shapes of every GPU count, health, model, group and slot."""
    groups = GroupFilter()
    options = {"filters": (groups,), "gpu_filters": (groups,)} if grouped else {}
    profile = tessera(mix, **options)
    assert profile.batch is not None
    index = ClusterIndex(nodes)
    sids = list(range(len(index.shapes)))
    for request in asked:  # the second request finds the shapes' rows and fragmentation kept
        facts = pod_facts(request)
        judged = profile.batch.judge(facts, index, sids)
        assert judged == {sid: profile.judge(facts, index.shapes[sid]) for sid in sids}


def test_a_request_of_several_containers_is_left_to_the_scalar_judge() -> None:
    profile = tessera(DEFAULT_TYPICAL_TASKS)
    assert profile.batch is not None
    index = ClusterIndex([node("a").gpus(2).build()])
    two = pod("p").share(200).share(300).build()
    assert profile.batch.judge(pod_facts(two), index, [0]) is None
    assert profile.batch.judge(pod_facts(pod("c").cpu_only(1_000).build()), index, [0]) is None


@pytest.mark.parametrize(
    "request_",
    [
        pod("memory").container(shares=1, mib=10**23, cores=30).build(),
        pod("percent").container(shares=1, pct=10**21).build(),
        pod("cpu").container(shares=1, mib=1_024, cores=30, cpu=10**20).build(),
        pod("cores").container(shares=1, mib=1_024, cores=10**19).build(),
    ],
    ids=["GPU memory", "GPU memory percent", "CPU", "cores"],
)
def test_a_pod_asking_more_than_any_array_holds_is_judged_one_shape_at_a_time(
    request_: PodRequest,
) -> None:
    """Kubernetes quantities have no upper bound: a pod may ask 10**23 MiB. The batch judge
    (64-bit arrays) leaves it to the scalar code, whose answer the memo then holds."""
    profile = tessera(DEFAULT_TYPICAL_TASKS)
    assert profile.batch is not None
    nodes = [node(f"n{i:02d}").gpus(2, used=10 * i).build() for i in range(BATCH_MIN + 4)]
    index = ClusterIndex(nodes)
    facts = pod_facts(request_)
    sids = list(range(len(index.shapes)))
    assert profile.batch.judge(facts, index, sids) is None
    judged = ranking.judgements(facts, index, profile, sids)
    assert judged == {sid: profile.judge(facts, index.shapes[sid]) for sid in sids}
    assert all(isinstance(judgement, str) for judgement in judged.values())


@pytest.mark.parametrize(
    ("name", "batched"),
    [
        ("tessera", True),
        ("fgd", False),  # FGD's own measure has no array form here
        ("binpack", False),
        ("spread", False),
        ("random", False),
    ],
)
def test_which_profiles_judge_in_batches(name: str, batched: bool) -> None:
    assert isinstance(build_profile(name).batch, FgdBatch) is batched


def test_decisions_judge_a_new_request_together_and_keep_the_shape_rows() -> None:
    """A decision over many shapes not judged yet for the request takes the batch; the rows it
    copied stay on the index for the next request, and go when the index compacts."""
    profile = tessera(DEFAULT_TYPICAL_TASKS)
    nodes = [node(f"n{i:03d}").gpu(used=i).gpu(used=2 * i).build() for i in range(BATCH_MIN + 8)]
    index = ClusterIndex(nodes)
    request = pod("p").share(150).build()
    decision = ranking.schedule(pod_facts(request), index, profile, now=0.0)
    unbatched = msgspec.structs.replace(request, uid="q")
    alone = tessera(DEFAULT_TYPICAL_TASKS)
    alone.batch = None
    expected = ranking.schedule(pod_facts(unbatched), ClusterIndex(nodes), alone, now=0.0)
    assert not isinstance(decision, str) and not isinstance(expected, str)
    assert (decision.node, decision.score) == (expected.node, expected.score)  # type: ignore[union-attr]
    rows = shape_rows(index)
    assert len(index.shapes) == len(nodes)
    assert all(rows.holds(sid) for sid in range(len(nodes)))
    index._compact()
    assert shape_rows(index) is not rows


@pytest.mark.parametrize(
    ("judged_before", "missing", "batched"),
    [
        pytest.param(False, BATCH_MIN - 1, False, id="new request, few shapes"),
        pytest.param(False, BATCH_MIN, True, id="new request, enough shapes"),
        pytest.param(True, BATCH_MIN, False, id="catching up on few shapes"),
        pytest.param(True, CATCH_UP_MIN - 1, False, id="catching up, just too few"),
        pytest.param(True, CATCH_UP_MIN, True, id="catching up on enough shapes"),
    ],
)
def test_a_request_judged_before_catches_up_together_only_on_many_shapes(
    judged_before: bool, missing: int, batched: bool
) -> None:
    """A request never judged takes the batch from BATCH_MIN shapes; one the memo knows
    already (new shapes since its last decision) from CATCH_UP_MIN. Either way every shape is
    judged as the scalar plugins judge it."""
    profile = tessera(DEFAULT_TYPICAL_TASKS)
    nodes = [node(f"n{i:03d}").gpu(used=i).gpu(used=2 * i).build() for i in range(missing + 1)]
    index = ClusterIndex(nodes)
    facts = pod_facts(pod("p").share(150).build())
    memo = profile.judged(index, facts.request.shape_key())
    if judged_before:
        memo[0] = profile.judge(facts, index.shapes[0])
    sids = list(range(1, len(nodes))) if judged_before else list(range(missing))
    assert len(sids) == missing
    found = ranking.judgements(facts, index, profile, sids)
    assert [shape_rows(index).holds(sid) for sid in sids] == [batched] * missing
    assert found == {sid: profile.judge(facts, index.shapes[sid]) for sid in sids}
