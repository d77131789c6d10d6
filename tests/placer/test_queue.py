"""Seed 002 queue order: priority, then total requested resources (larger first), then FIFO."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core.model import (
    ClusterSnapshot,
    ContainerRequest,
    PodRequest,
    Rejection,
)
from services.placer.core.queue import (
    PPM,
    PlacementQueue,
    PodMark,
    QueuedPod,
    ReferenceNode,
    admit,
    demand_ppm,
    in_queue_order,
    queue_key,
    reference_node,
)
from tests.placer.tenant_builders import node, pod

REF = ReferenceNode(cpu_milli=64_000, memory_mib=256_000, gpus=8)


def cpu_pod(uid: str, *, cpu: int = 1_000, memory: int = 1_024, priority: int = 0) -> PodRequest:
    return pod(uid, shares=0, cpu_milli=cpu, memory_mib=memory, priority=priority)


# -- normalisation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        pytest.param(cpu_pod("p", cpu=64_000, memory=0), PPM, id="all-cpu-is-one"),
        pytest.param(cpu_pod("p", cpu=0, memory=128_000), PPM // 2, id="half-memory"),
        pytest.param(pod("p", shares=8, cpu_milli=0, memory_mib=0), PPM, id="eight-whole-gpus"),
        pytest.param(pod("p", shares=1, cpu_milli=0, memory_mib=0), PPM // 8, id="one-whole-gpu"),
        pytest.param(
            pod("p", shares=1, cores=50, cpu_milli=0, memory_mib=0), PPM // 16, id="half-gpu-share"
        ),
        pytest.param(
            pod("p", shares=8, cpu_milli=64_000, memory_mib=256_000), 3 * PPM, id="whole-node-is-3"
        ),
        pytest.param(cpu_pod("p", cpu=0, memory=0), 0, id="nothing"),
    ],
)
def test_demand_is_the_sum_of_fractions_of_the_reference_node(
    request_: PodRequest, expected: int
) -> None:
    assert demand_ppm(request_, REF) == expected


def test_reference_node_is_the_largest_in_each_dimension() -> None:
    snapshot = ClusterSnapshot(
        nodes=(
            node("a", gpus=8, cpu_milli=32_000, memory_mib=512_000),
            node("b", gpus=2, cpu_milli=96_000, memory_mib=128_000),
        )
    )
    assert reference_node(snapshot) == ReferenceNode(cpu_milli=96_000, memory_mib=512_000, gpus=8)
    assert reference_node(ClusterSnapshot(nodes=(node("c", gpus=0),))).gpus == ReferenceNode().gpus


def test_reference_node_rejects_non_positive_sizes() -> None:
    with pytest.raises(ValueError, match="positive"):
        ReferenceNode(gpus=0)


# -- validation and marking ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "mark"),
    [
        pytest.param(pod("g"), PodMark.GPU, id="whole-gpu"),
        pytest.param(pod("s", mib=1_000), PodMark.GPU, id="gpu-share"),
        pytest.param(cpu_pod("c"), PodMark.NON_GPU, id="cpu-only"),
    ],
)
def test_admit_marks_gpu_and_non_gpu_pods(request_: PodRequest, mark: PodMark) -> None:
    admitted = admit(request_, reference=REF)
    assert isinstance(admitted, QueuedPod)
    assert admitted.mark is mark


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        pytest.param(PodRequest(uid="x"), "no containers", id="no-containers"),
        pytest.param(pod("x", cores=150), "1..100", id="cores-over-100"),
        pytest.param(pod("x", mib=10, pct=10), "not both", id="mib-and-pct"),
        pytest.param(
            PodRequest(uid="x", containers=(ContainerRequest(name="c", share_memory_mib=5),)),
            "without tessera.dev/gpu",
            id="memory-without-gpu",
        ),
    ],
)
def test_admit_rejects_invalid_pods_as_unresolvable_data(request_: PodRequest, reason: str) -> None:
    rejected = admit(request_, reference=REF, now=7.0)
    assert isinstance(rejected, Rejection)
    assert rejected.unresolvable
    assert rejected.decided_at == 7.0
    assert reason in rejected.message


def test_an_invalid_push_is_not_queued_and_drops_an_earlier_valid_entry() -> None:
    queue = PlacementQueue(reference=REF)
    assert isinstance(queue.push(pod("x")), QueuedPod)
    assert isinstance(queue.push(pod("x", cores=500)), Rejection)
    assert "x" not in queue
    assert queue.pop() is None


# -- ordering --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pushes", "expected"),
    [
        pytest.param(
            [(cpu_pod("low", cpu=60_000), None, 0.0), (cpu_pod("high", priority=10), None, 0.0)],
            ["high", "low"],
            id="priority-beats-size",
        ),
        pytest.param(
            [(cpu_pod("plain"), None, 0.0), (cpu_pod("labelled"), 5, 0.0)],
            ["labelled", "plain"],
            id="label-refines-equal-priority",
        ),
        pytest.param(
            [(cpu_pod("labelled"), 50, 0.0), (cpu_pod("important", priority=1), None, 0.0)],
            ["important", "labelled"],
            id="label-never-beats-priority",
        ),
        pytest.param(
            [(cpu_pod("negative"), -1, 0.0), (cpu_pod("unlabelled"), None, 0.0)],
            ["unlabelled", "negative"],
            id="no-label-counts-as-zero",
        ),
        pytest.param(
            [(pod("small", mib=1_000), None, 0.0), (pod("big", shares=4), None, 0.0)],
            ["big", "small"],
            id="larger-demand-first",
        ),
        pytest.param(
            [(cpu_pod("late"), None, 20.0), (cpu_pod("early"), None, 10.0)],
            ["early", "late"],
            id="fifo-by-creation-time",
        ),
        pytest.param(
            [(cpu_pod("first"), None, 5.0), (cpu_pod("second"), None, 5.0)],
            ["first", "second"],
            id="fifo-by-push-order-within-a-second",
        ),
    ],
)
def test_queue_order(
    pushes: list[tuple[PodRequest, int | None, float]], expected: list[str]
) -> None:
    queue = PlacementQueue(reference=REF)
    for request, label, created in pushes:
        queue.push(request, priority_label=label, created_at=created)
    assert [entry.uid for entry in queue] == expected
    assert [queue.pop().uid for _ in expected] == expected  # type: ignore[union-attr]
    assert queue.pop() is None


def test_update_keeps_the_place_among_equals_and_remove_is_idempotent() -> None:
    queue = PlacementQueue(reference=REF)
    for uid in ("a", "b", "c"):
        queue.push(cpu_pod(uid), created_at=1.0)
    queue.push(cpu_pod("a"), created_at=1.0)  # redelivered: must not go behind b and c
    assert queue.remove("b") is not None
    assert queue.remove("b") is None
    assert queue.remove("never-queued") is None
    assert len(queue) == 2
    assert queue.peek() is not None and queue.peek().uid == "a"  # type: ignore[union-attr]
    queue.push(cpu_pod("c", priority=3), created_at=1.0)  # raised priority: now first
    assert [queue.pop().uid, queue.pop().uid] == ["c", "a"]  # type: ignore[union-attr]
    assert len(queue) == 0


def test_many_updates_do_not_grow_the_heap_without_bound() -> None:
    queue = PlacementQueue(reference=REF)
    for round_ in range(500):
        queue.push(cpu_pod("same", priority=round_ % 7))
    assert len(queue) == 1
    assert len(queue._heap) <= 2 * len(queue) + 64 + 1
    entry = queue.pop()
    assert entry is not None and entry.request.priority == 499 % 7


# -- properties ------------------------------------------------------------------------------------

arrivals = st.lists(
    st.tuples(
        st.integers(0, 2),  # priority
        st.one_of(st.none(), st.integers(-1, 1)),  # label
        st.integers(0, 3),  # whole GPUs
        st.sampled_from([0.0, 1.0, 2.0]),  # created_at
    ),
    min_size=1,
    max_size=40,
)


def _fill(queue: PlacementQueue, items: list[tuple[int, int | None, int, float]]) -> None:
    for i, (priority, label, gpus, created) in enumerate(items):
        request = pod(f"p{i:02d}", shares=gpus, priority=priority)
        queue.push(request, priority_label=label, created_at=created)


@settings(max_examples=60, deadline=None)
@given(arrivals)
def test_pops_follow_a_total_deterministic_order(
    items: list[tuple[int, int | None, int, float]],
) -> None:
    first, second = PlacementQueue(reference=REF), PlacementQueue(reference=REF)
    _fill(first, items)
    _fill(second, items)
    popped: list[QueuedPod] = []
    while (entry := first.pop()) is not None:
        popped.append(entry)
    again = [second.pop() for _ in popped]
    assert [e.uid for e in popped] == [e.uid for e in again if e is not None]
    keys = [queue_key(e) for e in popped]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)  # total: no two entries compare equal
    assert popped == in_queue_order(popped)
    for earlier, later in itertools.pairwise(popped):
        a, b = earlier.request, later.request
        assert (a.priority, earlier.priority_label) >= (b.priority, later.priority_label)
        if (a.priority, earlier.priority_label) == (b.priority, later.priority_label):
            assert earlier.demand_ppm >= later.demand_ppm


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=2, max_size=30))
def test_fifo_among_equals(priorities: list[int]) -> None:
    queue = PlacementQueue(reference=REF)
    for i, priority in enumerate(priorities):
        queue.push(pod(f"p{i:02d}", mib=2_000, priority=priority), created_at=100.0)
    order = [queue.pop() for _ in priorities]
    for priority in set(priorities):
        same = [e.sequence for e in order if e is not None and e.request.priority == priority]
        assert same == sorted(same)
