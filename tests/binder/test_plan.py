"""The bind plan: what binding a placement leads to, and the ambiguity gate as a property."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.binder.rules.plan import (
    Admission,
    Bind,
    Drop,
    ObservedPod,
    Report,
    Wait,
    admission_of,
    gate_resources,
    plan_bind,
    served_elsewhere,
    stranded,
    withdrawable,
)
from shared import annotations as names
from shared import codec, subjects
from shared.kubeobjects import Pod
from shared.messages.assignments import (
    AssignmentRecord,
    ContainerAllocation,
    RecordView,
    released,
    settled,
)
from shared.messages.base import ContainerSlices, GpuSlice
from shared.validation import record_problem
from tests.binder.builders import NODE, booking, record, slices

NOW = 1_700_000_100.0
GPU = frozenset({"tessera.dev/gpu"})


def view(of: AssignmentRecord, revision: int = 1) -> RecordView:
    return RecordView(key=f"{NODE}.{of.pod_uid}", revision=revision, record=of)


def seen(uid: str = "u1", node: str = "", terminating: bool = False) -> ObservedPod:
    return ObservedPod(uid=uid, namespace="default", name="p", node=node, terminating=terminating)


def plan(
    found: AssignmentRecord | None,
    pod: ObservedPod | None,
    *others: AssignmentRecord,
    placed: AssignmentRecord | None = None,
) -> object:
    """The plan for ``placed`` (by default :data:`MINE`) with ``found`` at its key."""
    return plan_bind(
        booking=booking(placed or MINE),
        pod=pod,
        record=view(found) if found else None,
        node_records=[view(o) for o in others],
        resources=GPU,
        now=NOW,
    )


MINE = record("u1", "p", slices("main", (0, 4096, 25)))
BOUND = msgspec.structs.replace(MINE, state="bound", bound_at=NOW)
"""The record the binder writes for :data:`MINE`'s booking."""
OLDER = msgspec.structs.replace(MINE, commit="commit-older")


@pytest.mark.parametrize(
    ("found", "pod", "expected"),
    [
        pytest.param(
            released(MINE, now=NOW),
            seen(),
            Drop(reason="the placement was given back before the pod was bound"),
            id="fenced",
        ),
        pytest.param(
            msgspec.structs.replace(released(OLDER, now=NOW), fenced=(MINE.commit,)),
            seen(),
            Drop(reason="the placement was given back before the pod was bound"),
            id="fenced-beside-an-older-commit",
        ),
        pytest.param(
            OLDER,
            seen(),
            Drop(reason="a live record of another commit holds the pod's key on the node"),
            id="another-commit-live",
        ),
        pytest.param(
            None, None, Report(outcome="gone", reason="the pod no longer exists"), id="pod-gone"
        ),
        pytest.param(
            None,
            seen(uid="other"),
            Report(outcome="gone", reason="the pod no longer exists"),
            id="pod-replaced",
        ),
        pytest.param(
            None,
            seen(node="gpu-9"),
            Report(outcome="failed", reason="the pod is already bound to node gpu-9"),
            id="bound-elsewhere",
        ),
        pytest.param(
            BOUND,
            seen(node=NODE),
            Report(outcome="bound", reason="already bound"),
            id="seen-again",
        ),
        pytest.param(
            None,
            seen(terminating=True),
            Report(outcome="gone", reason="the pod is being deleted"),
            id="terminating",
        ),
    ],
)
def test_plans_without_binding(
    found: AssignmentRecord | None, pod: ObservedPod | None, expected: object
) -> None:
    assert plan(found, pod) == expected


def test_bind_creates_the_record_bound_and_carries_the_annotations() -> None:
    result = plan(None, seen())
    assert isinstance(result, Bind)
    assert (result.write, result.binding) == (0, True)
    assert result.record == BOUND
    annotation = codec.decode(result.annotations[names.ASSIGNMENT], names.AssignmentAnnotation)
    assert annotation.node == NODE and annotation.placer_id == "placer-test"
    assert annotation.containers[0].gpus == (
        GpuSlice(uuid="GPU-0000", index=0, memory_mib=4096, cores=25),
    )
    assert result.annotations[names.BIND_TIME] == "2023-11-14T22:15:00.000000Z"


def test_a_placement_over_an_older_commit_s_released_record_carries_its_fence() -> None:
    result = plan(released(OLDER, now=NOW), seen())
    assert isinstance(result, Bind) and result.write == 1
    assert result.record == msgspec.structs.replace(BOUND, fenced=(OLDER.commit,))


def test_a_reserved_record_an_earlier_placer_wrote_is_moved_on_by_compare_and_set() -> None:
    result = plan(MINE, seen())
    assert isinstance(result, Bind) and (result.write, result.record) == (1, BOUND)


def test_a_pod_on_its_node_with_a_reserved_record_gets_it_bound_and_no_binding() -> None:
    result = plan(MINE, seen(node=NODE))
    assert isinstance(result, Bind)
    assert (result.write, result.record, result.binding) == (1, BOUND, False)


def test_a_pod_bound_before_any_record_is_left_to_its_restore() -> None:
    assert plan(None, seen(node=NODE)) == Drop(
        reason="the pod is bound already: its restore writes its record"
    )


def test_a_bound_record_continues_without_a_new_write() -> None:
    bound = msgspec.structs.replace(MINE, state="bound", bound_at=NOW - 5)
    result = plan(bound, seen())
    assert isinstance(result, Bind) and result.write is None and result.binding


def other(
    uid: str, *containers: ContainerSlices, state: str = "bound", allocated: int = 0
) -> AssignmentRecord:
    made = record(uid, uid, *containers, state=state, bound_at=NOW - 1)
    return msgspec.structs.replace(
        made,
        allocated=tuple(
            ContainerAllocation(container=c.container, device_ids=("d",), allocated_at=NOW)
            for c in made.containers[:allocated]
        ),
    )


@pytest.mark.parametrize(
    ("others", "waits"),
    [
        pytest.param(
            [other("b", slices("main", (1, 4096, 25)))], True, id="same-size-other-gpu-waits"
        ),
        pytest.param(
            [other("b", slices("main", (0, 4096, 25)))],
            False,
            id="identical-slices-are-not-ambiguous",
        ),
        pytest.param(
            [other("b", slices("main", (1, 4096, 25), (2, 4096, 25)))], False, id="different-size"
        ),
        pytest.param(
            [other("b", slices("main", (1, 4096, 25)), state="allocated")],
            False,
            id="other-allocated",
        ),
        pytest.param(
            [other("b", slices("main", (1, 4096, 25)), state="reserved")],
            False,
            id="other-only-reserved",
        ),
        pytest.param(
            [other("b", slices("a", (1, 1, 1), (2, 1, 1)), slices("b", (3, 1, 1)))],
            True,
            id="a-later-container-of-the-other-pod",
        ),
        pytest.param(
            [other("b", slices("a", (1, 1, 1)), slices("b", (2, 1, 1), (3, 1, 1)), allocated=1)],
            False,
            id="the-other-pods-matching-container-is-already-allocated",
        ),
    ],
)
def test_the_ambiguity_gate(others: list[AssignmentRecord], waits: bool) -> None:
    result = plan(None, seen(), *others)
    if waits:
        assert isinstance(result, Wait)
        assert result.blocker.record.pod_uid == "b"
        assert "waits for default/b on node gpu-1 to be allocated first" in result.reason
    else:
        assert isinstance(result, Bind)


def test_gate_resources_follow_what_the_node_advertises() -> None:
    mine = record(
        "u1",
        "p",
        ContainerSlices(
            container="main",
            gpus=(GpuSlice(uuid="GPU-0000", index=0, memory_mib=4096, cores=0),),
            resources={"tessera.dev/gpu": 1, "tessera.dev/gpu-memory": 4096},
        ),
    )
    theirs = other(
        "b",
        ContainerSlices(
            container="main",
            gpus=(GpuSlice(uuid="GPU-0001", index=1, memory_mib=8192, cores=0),),
            resources={"tessera.dev/gpu": 1, "tessera.dev/gpu-memory": 8192},
        ),
    )
    memory_units = gate_resources({"tessera.dev/gpu-memory": 81920}, mine)
    unknown = gate_resources({}, mine)
    assert memory_units == {"tessera.dev/gpu-memory"}
    assert unknown == {"tessera.dev/gpu", "tessera.dev/gpu-memory"}
    for resources, waits in ((memory_units, False), (unknown, True)):
        result = plan_bind(
            booking=booking(mine),
            pod=seen(),
            record=None,
            node_records=[view(theirs)],
            resources=resources,
            now=NOW,
        )
        assert isinstance(result, Wait) == waits


# --- the gate as a property -----------------------------------------------------------------


def sizes_left(rec: AssignmentRecord) -> list[tuple[int, tuple[str, ...]]]:
    waiting = [c for c in rec.containers if c.resources.get("tessera.dev/gpu", 0) > 0]
    return [
        (c.resources["tessera.dev/gpu"], tuple(g.uuid for g in c.gpus))
        for c in waiting[len(rec.allocated) :]
    ]


def allocate_could_confuse(bound: Iterable[AssignmentRecord]) -> bool:
    """The device plugin's view: for some device count, two bound records wait for a container
    of that size with different GPUs, so Allocate could answer the wrong one."""
    by_size: dict[int, set[tuple[str, tuple[str, ...]]]] = {}
    for rec in bound:
        for size, gpus in sizes_left(rec):
            by_size.setdefault(size, set()).add((rec.pod_uid, gpus))
    return any(
        len({g for _, g in entries}) > 1 and len({u for u, _ in entries}) > 1
        for entries in by_size.values()
    )


container_plans = st.lists(
    st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True), min_size=1, max_size=2
)


@settings(max_examples=150, deadline=None)
@given(pods=st.lists(container_plans, min_size=2, max_size=8))
def test_no_two_bound_records_on_a_node_are_ever_ambiguous(pods: list[list[list[int]]]) -> None:
    records = {
        f"p{i}": record(
            f"p{i}",
            f"p{i}",
            *(slices(f"c{j}", *((g, 1024, 10) for g in gpus)) for j, gpus in enumerate(plan_)),
        )
        for i, plan_ in enumerate(pods)
    }
    waiting = list(records)
    steps = 0
    while waiting:
        steps += 1
        assert steps < 200, "the gate must never deadlock"
        uid = waiting.pop(0)
        mine = records[uid]
        result = plan_bind(
            booking=booking(mine),
            pod=seen(uid=uid),
            record=None,
            node_records=[view(r) for r in records.values() if r.pod_uid != uid],
            resources=GPU,
            now=NOW,
        )
        if isinstance(result, Wait):
            # The device plugin allocates the blocker's next container meanwhile.
            blocker = records[result.blocker.record.pod_uid]
            done = len(blocker.allocated) + 1
            allocated = tuple(
                ContainerAllocation(container=c.container, device_ids=("d",), allocated_at=NOW)
                for c in blocker.containers[:done]
            )
            records[blocker.pod_uid] = msgspec.structs.replace(
                blocker,
                allocated=allocated,
                state="allocated" if done >= len(blocker.containers) else "bound",
            )
            waiting.append(uid)
        else:
            assert isinstance(result, Bind)
            records[uid] = result.record
        bound = [r for r in records.values() if r.state == "bound"]
        assert not allocate_could_confuse(bound), bound


PARTLY_ALLOCATED = msgspec.structs.replace(
    record("p", "p", slices("a"), slices("b"), state="bound", bound_at=NOW),
    allocated=(ContainerAllocation(container="a", device_ids=("d",), allocated_at=NOW),),
)


@pytest.mark.parametrize(
    ("rec", "expected"),
    [
        (record("p", "p", state="reserved"), False),  # never bound: the kubelet never saw it
        (record("p", "p", state="bound", bound_at=NOW), True),
        (PARTLY_ALLOCATED, True),  # rejected between two containers' Allocates
        (record("p", "p", state="allocated", bound_at=NOW), False),  # ran: the placer's
        (record("p", "p", state="released", bound_at=NOW), False),
        (  # no GPU: bound is final, nobody ever Allocates it
            record(
                "p", "p", ContainerSlices(container="cpu", gpus=()), state="bound", bound_at=NOW
            ),
            False,
        ),
    ],
    ids=["reserved", "bound", "partly-allocated", "allocated", "released", "no-gpu"],
)
def test_what_the_binder_withdraws_when_a_pod_ends(rec: AssignmentRecord, expected: bool) -> None:
    assert stranded(rec) is expected


def test_a_withdrawn_record_is_only_released() -> None:
    assert released(PARTLY_ALLOCATED, now=NOW + 5) == msgspec.structs.replace(
        PARTLY_ALLOCATED, state="released", released_at=NOW + 5
    )


def pod_in(phase: str) -> Pod:
    return msgspec.convert(
        {
            "metadata": {"name": "p", "uid": "p"},
            "spec": {"nodeName": NODE},
            "status": {"phase": phase},
        },
        Pod,
    )


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (None, "ended"),
        (pod_in("Failed"), "ended"),
        (pod_in("Succeeded"), "ended"),
        (pod_in("Running"), "admitted"),
        (pod_in("Pending"), "waiting"),
    ],
    ids=["gone", "failed", "succeeded", "running", "pending"],
)
def test_where_the_kubelet_is_with_a_pod(pod: Pod | None, expected: str) -> None:
    assert admission_of(pod) == expected


def shaped(uid: str, state: str, gpu: int = 0, mib: int = 8192) -> AssignmentRecord:
    return record(uid, uid, slices("main", (gpu, mib, 10)), state=state, bound_at=NOW)


LIVE = shaped("live", "bound")


@pytest.mark.parametrize(
    ("live", "others", "admission", "expected"),
    [
        # The chaos run: the plugin served the live pod from the record of a pod the kubelet had
        # rejected itself; that record is allocated, the live pod's own one is the surplus.
        (LIVE, [shaped("dead", "allocated")], {"live": "admitted", "dead": "ended"}, True),
        # Two live pods, the second admitted first, from the first's record: the first is served
        # from this one later, so it stays bound.
        (LIVE, [shaped("first", "allocated")], {"live": "admitted", "first": "waiting"}, False),
        # ... until the first is admitted too, or ends.
        (LIVE, [shaped("first", "allocated")], {"live": "admitted", "first": "admitted"}, True),
        # A dead pod's bound record counts: the binder withdraws it only while it is a surplus
        # itself, so the waiting pod is served from one of the two.
        (
            LIVE,
            [shaped("dead", "bound"), shaped("waits", "allocated")],
            {"live": "admitted", "dead": "ended", "waits": "waiting"},
            True,
        ),
        # Beside the dead pod's allocated record, the waiting pods' own records are theirs.
        (
            LIVE,
            [shaped("dead", "allocated"), shaped("next", "bound"), shaped("then", "bound")],
            {"live": "admitted", "dead": "ended", "next": "waiting", "then": "waiting"},
            True,
        ),
        # A UID not known counts as waiting.
        (LIVE, [shaped("dead", "allocated")], {"live": "admitted"}, False),
        # Records of another shape do not count.
        (
            LIVE,
            [shaped("other", "bound", mib=4096)],
            {"live": "admitted", "other": "waiting"},
            True,
        ),
        (LIVE, [shaped("other", "bound", gpu=1)], {"live": "admitted", "other": "waiting"}, True),
        # Not admitted yet, or nothing to settle.
        (LIVE, [], {"live": "waiting"}, False),
        (shaped("live", "allocated"), [], {"live": "admitted"}, False),
        (shaped("live", "reserved"), [], {"live": "admitted"}, False),
        (
            record("live", "live", ContainerSlices(container="cpu", gpus=()), state="bound"),
            [],
            {"live": "admitted"},
            False,
        ),
    ],
    ids=[
        "served-from-a-dead-pods-record",
        "exchanged-with-a-waiting-pod",
        "exchanged-both-admitted",
        "dead-bound-beside-a-taken-one",
        "dead-allocated-beside-waiting",
        "unknown-uid",
        "other-memory",
        "other-gpu",
        "not-admitted",
        "allocated",
        "reserved",
        "no-gpu",
    ],
)
def test_which_admitted_pods_records_the_binder_settles(
    live: AssignmentRecord,
    others: list[AssignmentRecord],
    admission: dict[str, Admission],
    expected: bool,
) -> None:
    assert served_elsewhere(live, [live, *others], admission) is expected


def test_a_settled_record_is_allocated_keeping_the_answered_containers() -> None:
    cpu_only = ContainerSlices(container="sidecar", gpus=())
    rec = msgspec.structs.replace(
        record("p", "p", slices("a"), cpu_only, slices("b"), state="bound", bound_at=NOW),
        allocated=PARTLY_ALLOCATED.allocated,
    )
    after = settled(rec, now=NOW + 5)
    # Every reader still believes it: a device plugin, a placer, the dashboard.
    assert record_problem(after, key=subjects.assignment_key(NODE, "p")) is None
    assert after == msgspec.structs.replace(
        rec,
        state="allocated",
        allocated_at=NOW + 5,
        allocated=(
            *PARTLY_ALLOCATED.allocated,
            ContainerAllocation(container="b", device_ids=(), allocated_at=NOW + 5),
        ),
    )


@pytest.mark.parametrize(
    ("dead", "others", "admission", "expected"),
    [
        # Rejected before its Allocate, nobody waiting: withdrawn.
        (shaped("dead", "bound"), [], {"dead": "ended"}, True),
        # Beside waiting pods with their own records: withdrawn.
        (
            shaped("dead", "bound"),
            [shaped("next", "bound")],
            {"dead": "ended", "next": "waiting"},
            True,
        ),
        # It ran from a waiting pod's record: that pod is served from this one, so it is kept.
        (
            shaped("dead", "bound"),
            [shaped("waits", "allocated")],
            {"dead": "ended", "waits": "waiting"},
            False,
        ),
        # ... and withdrawn once that pod was admitted (from another record) or ended.
        (
            shaped("dead", "bound"),
            [shaped("waits", "allocated")],
            {"dead": "ended", "waits": "ended"},
            True,
        ),
        # Allocated, or of another shape: not this rule's.
        (shaped("dead", "allocated"), [], {"dead": "ended"}, False),
        (
            shaped("dead", "bound"),
            [shaped("waits", "allocated", mib=4096)],
            {"dead": "ended", "waits": "waiting"},
            True,
        ),
    ],
    ids=[
        "alone",
        "beside-waiting",
        "took-a-waiting-pods",
        "that-pod-done",
        "allocated",
        "other-shape",
    ],
)
def test_which_ended_pods_records_the_binder_withdraws(
    dead: AssignmentRecord,
    others: list[AssignmentRecord],
    admission: dict[str, Admission],
    expected: bool,
) -> None:
    assert withdrawable(dead, [dead, *others], admission) is expected
