"""The dashboard's reducer: what each input does to the state, and invariants over any sequence."""

from __future__ import annotations

import copy

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.dashboard.core.state import (
    BucketSynced,
    Event,
    FactsChanged,
    InventoryChanged,
    PodFoundInvalid,
    PodGone,
    PodQueued,
    PodRejected,
    RecordChanged,
    State,
    StatsChanged,
    node_key_problem,
    node_names,
    record_key_problem,
    reduce,
    reduce_all,
    stats_key_problem,
)
from services.dashboard.core.views import ViewPolicy, cluster_view, pending_view
from shared import subjects
from shared.messages.assignments import AssignmentRecord, AssignmentState
from shared.messages.placement import PodInvalid
from shared.messages.pods import PodPending
from tests.dashboard.builders import (
    NOW,
    deleted,
    facts,
    gpu,
    inventory,
    record,
    rejection,
    share,
    stats,
)


def put(value: AssignmentRecord) -> RecordChanged:
    return RecordChanged(key=subjects.assignment_key(value.node, value.pod_uid), record=value)


def drop(node: str, uid: str) -> RecordChanged:
    return RecordChanged(key=subjects.assignment_key(node, uid), record=None)


def rejected(uid: str, at: float = NOW) -> PodRejected:
    return PodRejected(rejection=rejection(uid, decided_at=at))


def pending_of(state: State) -> set[str]:
    return set(state.pending)


# --- the Pending table ----------------------------------------------------------------------

PENDING_CASES: list[tuple[str, list[Event], set[str]]] = [
    ("a rejection makes a pod Pending", [rejected("p")], {"p"}),
    (
        "a reserved record takes it out",
        [rejected("p"), put(record("n1", "p", share("G"), state="reserved", decided_at=NOW + 1))],
        set(),
    ),
    (
        "so does a bound or allocated one",
        [rejected("p"), put(record("n1", "p", share("G"), state="bound", decided_at=NOW + 1))],
        set(),
    ),
    (
        "a released record does not",
        [rejected("p", NOW + 5), put(record("n1", "p", share("G"), state="released"))],
        {"p"},
    ),
    (
        "a rejection older than the pod's record is stale",
        [put(record("n1", "p", share("G"), state="released", decided_at=NOW)), rejected("p")],
        set(),
    ),
    (
        "a newer rejection after a released record brings it back",
        [
            rejected("p", NOW - 10),
            put(record("n1", "p", share("G"), state="reserved")),
            put(record("n1", "p", share("G"), state="released")),
            rejected("p", NOW + 10),
        ],
        {"p"},
    ),
    (
        "a rejection while a record is live is ignored",
        [put(record("n1", "p")), rejected("p")],
        set(),
    ),
    ("a deletion takes it out", [rejected("p"), PodGone(deleted=deleted("p"))], set()),
    (
        "a rejection after the deletion is ignored",
        [PodGone(deleted=deleted("p")), rejected("p", NOW + 100)],
        set(),
    ),
    (
        "deleting the record key does not make it Pending again",
        [rejected("p"), put(record("n1", "p", state="reserved")), drop("n1", "p")],
        set(),
    ),
    ("other pods stay", [rejected("p"), rejected("q"), PodGone(deleted=deleted("q"))], {"p"}),
]


@pytest.mark.parametrize(
    ("events", "expected"), [c[1:] for c in PENDING_CASES], ids=[c[0] for c in PENDING_CASES]
)
def test_pending_table(events: list[Event], expected: set[str]) -> None:
    assert pending_of(reduce_all(State(), events)) == expected


def test_repeated_rejections_are_counted_and_keep_the_first_time() -> None:
    state = reduce_all(
        State(), [rejected("p", NOW), rejected("p", NOW + 30), rejected("p", NOW + 60)]
    )
    entry = state.pending["p"]
    assert entry.rejections == 3
    assert entry.first_rejected_at == NOW
    assert entry.rejection.decided_at == NOW + 60


def test_a_redelivered_rejection_is_not_counted_twice() -> None:
    once = reduce(State(), rejected("p"))
    assert reduce(once, rejected("p")) is once


def test_a_late_older_rejection_keeps_the_newest_reasons() -> None:
    newer = PodRejected(rejection=rejection("p", ("unhealthy GPU", 2), decided_at=NOW + 10))
    state = reduce_all(State(), [newer, rejected("p", NOW)])
    entry = state.pending["p"]
    assert entry.rejection == newer.rejection
    assert entry.first_rejected_at == NOW
    assert entry.rejections == 2


# --- nodes, records, stats ------------------------------------------------------------------


def test_a_node_is_shown_while_anything_knows_it() -> None:
    state = reduce_all(
        State(),
        [
            InventoryChanged(node="a", inventory=inventory("a", gpu("G-a"))),
            FactsChanged(node="b", facts=facts("b")),
            put(record("c", "u1", share("G-c"), state="bound")),
            put(record("d", "u2", share("G-d"), state="released")),
        ],
    )
    assert node_names(state) == {"a", "b", "c"}
    state = reduce_all(
        state,
        [
            InventoryChanged(node="a", inventory=None),
            FactsChanged(node="b", facts=msgspec.structs.replace(facts("b"), deleted=True)),
            drop("c", "u1"),
        ],
    )
    assert node_names(state) == set()
    assert state.record_keys_by_uid == {"u2": frozenset({subjects.assignment_key("d", "u2")})}


def test_only_the_touched_node_changes_version() -> None:
    state = reduce_all(
        State(),
        [
            InventoryChanged(node="a", inventory=inventory("a", gpu("G-a"))),
            InventoryChanged(node="b", inventory=inventory("b", gpu("G-b"))),
        ],
    )
    after = reduce(state, put(record("a", "u1", share("G-a"))))
    assert after.node_versions["a"] == state.node_versions["a"] + 1
    assert after.node_versions["b"] == state.node_versions["b"]
    # The same value again changes nothing at all.
    assert reduce(after, put(record("a", "u1", share("G-a")))) is after


def test_reduce_never_changes_the_state_it_was_given() -> None:
    state = reduce_all(
        State(),
        [
            InventoryChanged(node="a", inventory=inventory("a", gpu("G-a"))),
            put(record("a", "u1", share("G-a"), state="reserved")),
            rejected("p"),
        ],
    )
    frozen = copy.deepcopy(state)
    reduce_all(
        state,
        [
            put(record("a", "u1", share("G-a"), state="allocated")),
            put(record("a", "p", share("G-a"))),
            PodGone(deleted=deleted("x")),
            InventoryChanged(node="a", inventory=None),
            BucketSynced(bucket="assignments", keys=frozenset()),
        ],
    )
    assert state == frozen


@pytest.mark.parametrize(
    ("bucket", "event", "gone"),
    [
        (
            "inventory",
            InventoryChanged(node="a.b", inventory=inventory("a.b", gpu("G"))),
            "inventory",
        ),
        ("nodes", FactsChanged(node="a.b", facts=facts("a.b")), "facts"),
        ("assignments", put(record("a.b", "u1", share("G"))), "records"),
        ("stats", StatsChanged(key="placer-0", stats=stats()), "stats"),
    ],
)
def test_a_resync_drops_keys_deleted_while_nobody_watched(
    bucket: str, event: Event, gone: str
) -> None:
    state = reduce(State(), event)
    assert getattr(state, gone)
    kept = reduce(state, BucketSynced(bucket=bucket, keys=frozenset({"a_b", "a_b.u1", "placer-0"})))  # type: ignore[arg-type]
    assert getattr(kept, gone) == getattr(state, gone)
    assert not getattr(reduce(state, BucketSynced(bucket=bucket, keys=frozenset())), gone)  # type: ignore[arg-type]


def test_stats_bump_the_nodes_whose_fragmentation_changed() -> None:
    state = reduce_all(
        State(),
        [
            InventoryChanged(node="n1", inventory=inventory("n1", gpu("G1"))),
            InventoryChanged(node="n2", inventory=inventory("n2", gpu("G2"))),
        ],
    )
    after = reduce(state, StatsChanged(key="placer-0", stats=stats(pct=3.0)))
    assert after.node_versions["n1"] == state.node_versions["n1"] + 1
    assert after.node_versions["n2"] == state.node_versions["n2"]
    assert after.stats_version == state.stats_version + 1


def test_key_checks() -> None:
    good = record("node.a", "u1")
    assert record_key_problem("node_a.u1", good) is None
    assert "expected 'node_a.u1'" in (record_key_problem("node_a.u2", good) or "")
    assert node_key_problem("node_a", "node.a") is None
    assert "stored under key 'other'" in (node_key_problem("other", "node.a") or "")
    assert "names no node" in (node_key_problem("x", "") or "")
    assert stats_key_problem("placer-0", stats("placer-0")) is None
    assert "placer-1" in (stats_key_problem("placer-0", stats("placer-1")) or "")


# --- invariants over any sequence -----------------------------------------------------------

UIDS = ("u1", "u2", "u3")
NODES = ("n1", "n2")
STATES: tuple[AssignmentState, ...] = ("reserved", "bound", "allocated", "released")

record_events = st.builds(
    lambda node, uid, state, at: put(
        record(node, uid, share(f"G-{node}", memory=1024, cores=10), state=state, decided_at=at)
    ),
    st.sampled_from(NODES),
    st.sampled_from(UIDS),
    st.sampled_from(STATES),
    st.floats(NOW - 100, NOW + 100),
)
any_event = st.one_of(
    record_events,
    st.builds(drop, st.sampled_from(NODES), st.sampled_from(UIDS)),
    st.builds(rejected, st.sampled_from(UIDS), st.floats(NOW - 100, NOW + 100)),
    st.builds(lambda uid: PodGone(deleted=deleted(uid)), st.sampled_from(UIDS)),
    st.builds(
        lambda node: InventoryChanged(node=node, inventory=inventory(node, gpu(f"G-{node}"))),
        st.sampled_from(NODES),
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(any_event, max_size=25))
def test_no_pending_pod_is_placed_or_deleted(events: list[Event]) -> None:
    state = State()
    gone: set[str] = set()
    for event in events:
        state = reduce(state, event)
        if isinstance(event, PodGone):
            gone.add(event.deleted.uid)
        live = {
            r.pod_uid for rs in state.records.values() for r in rs.values() if r.state != "released"
        }
        assert not (pending_of(state) & live)
        assert not (pending_of(state) & gone)


@settings(max_examples=100, deadline=None)
@given(st.lists(record_events, max_size=20), st.randoms(use_true_random=False))
def test_every_live_slice_is_counted_once_whatever_the_order_across_keys(
    events: list[RecordChanged], rng: object
) -> None:
    """KV watches keep order per key only: interleaving keys differently gives the same view."""
    inventories: list[Event] = [
        InventoryChanged(node=n, inventory=inventory(n, gpu(f"G-{n}"))) for n in NODES
    ]
    in_order = reduce_all(State(), [*inventories, *events])
    by_key: dict[str, list[RecordChanged]] = {}
    for event in events:
        by_key.setdefault(event.key, []).append(event)
    shuffled: list[Event] = list(inventories)
    queues = list(by_key.values())
    while queues:
        queue = rng.choice(queues)  # type: ignore[attr-defined]
        shuffled.append(queue.pop(0))
        queues = [q for q in queues if q]
    other = reduce_all(State(), shuffled)
    policy = ViewPolicy()
    view = cluster_view(in_order, now=NOW, policy=policy)
    assert cluster_view(other, now=NOW, policy=policy) == view
    latest = {e.key: e.record for e in events}
    live_memory = sum(1024 for r in latest.values() if r is not None and r.state != "released")
    assert view.totals.gpu_memory_allocated_mib == live_memory


def test_pods_not_decided_yet_and_invalid_pods_are_pending_too() -> None:
    """A pod handed to the placers is Pending until one decides or rejects it (no placer may be
    running at all); a pod the binder found invalid is Pending until it is deleted."""

    def queued(uid: str) -> PodQueued:
        return PodQueued(
            pending=PodPending(
                uid=uid, namespace="ml", name=f"pod-{uid}", containers=(), created_at=NOW - 5
            )
        )

    invalid = PodFoundInvalid(
        invalid=PodInvalid(pod_uid="bad", namespace="ml", name="bad", message="line", at=NOW)
    )
    state = reduce_all(State(), [queued("q"), queued("placed"), queued("rejected"), invalid])
    assert {uid: p.kind for uid, p in state.pending.items()} == {
        "q": "queued", "placed": "queued", "rejected": "queued", "bad": "invalid",
    }  # fmt: skip
    state = reduce_all(
        state,
        [
            RecordChanged(
                key=subjects.assignment_key("n1", "placed"),
                record=record("n1", "placed", share("G0"), decided_at=NOW),
            ),
            PodRejected(rejection=rejection("rejected", ("insufficient GPU memory", 2))),
            queued("rejected"),  # published again (a new binder leader): changes nothing
            queued("placed"),
        ],
    )
    view = pending_view(state, now=NOW + 10)
    assert {p.pod_uid: p.kind for p in view.pods} == {
        "q": "queued", "rejected": "rejected", "bad": "invalid",
    }  # fmt: skip
    assert {r.reason: r.pods for r in view.reasons} == {
        "not decided by a placer yet": 1, "insufficient GPU memory": 1, "invalid request": 1,
    }  # fmt: skip
    (bad,) = [p for p in view.pods if p.pod_uid == "bad"]
    assert (bad.message, bad.unresolvable) == ("line", True)
    state = reduce_all(state, [PodGone(deleted=deleted("bad")), PodGone(deleted=deleted("q"))])
    assert set(state.pending) == {"rejected"}
