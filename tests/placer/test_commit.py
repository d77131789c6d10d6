"""The commit protocol's pure rules (``services/placer/rules/commit.py``), table-driven."""

from __future__ import annotations

import msgspec
import pytest

from services.placer.rules import commit, repairs, translate
from services.placer.rules.repairs import RecordFacts, Repair
from shared import commits, validation
from shared.commits import record_of
from shared.messages.assignments import AssignmentRecord, AssignmentState, released
from shared.messages.ledger import Booking, NodeLedger, PodClaim
from tests.placer import wire
from tests.placer.test_translate import NOW, booking

A = booking("a", (0, 8192, 500))
A2 = msgspec.structs.replace(A, commit="c-a-2", node="n2")


def claim(state: str, held: object = A, request: bool = False, extender: bool = False) -> PodClaim:
    pending = msgspec.structs.replace(wire.pending("a"), extender=extender)
    return PodClaim(
        pod_uid="a",
        state=state,  # type: ignore[arg-type]
        booking=held,  # type: ignore[arg-type]
        request=pending if request else None,
        updated_at=NOW,
    )


@pytest.mark.parametrize(
    ("current", "verdict"),
    [
        pytest.param(None, "create", id="no-claim"),
        pytest.param(claim("placed"), "mine", id="this-booking"),
        pytest.param(claim("placed", A2), "lost", id="another-booking"),
        pytest.param(claim("requeued", A2), "take", id="requeued"),
        pytest.param(claim("deleted", None), "deleted", id="deleted-before-placed"),
        pytest.param(claim("deleted"), "deleted", id="deleted-after"),
    ],
)
def test_claim_verdicts(current: PodClaim | None, verdict: str) -> None:
    assert commit.claim_verdict(current, A) == verdict


def record(
    state: AssignmentState, commit_id: str = A.commit, fenced: tuple[str, ...] = ()
) -> AssignmentRecord:
    return msgspec.structs.replace(
        record_of(A, state="reserved"), state=state, commit=commit_id, fenced=fenced
    )


@pytest.mark.parametrize(
    ("current", "create", "fence"),
    [
        pytest.param(None, "write", "write", id="absent"),
        pytest.param(record("reserved"), "done", "write", id="this-commit-live"),
        pytest.param(record("bound"), "done", "write", id="this-commit-bound"),
        pytest.param(record("released"), "released", "done", id="this-commit-released"),
        pytest.param(record("released", "old"), "write", "write", id="older-released"),
        pytest.param(record("reserved", "other"), "blocked", "blocked", id="another-live"),
        # Another commit's fence that fences this commit too: never placed over, nothing to add.
        pytest.param(
            record("released", "old", (A.commit,)), "released", "done", id="fenced-beside-older"
        ),
        pytest.param(record("bound", "new", (A.commit,)), "released", "blocked", id="fenced-under"),
    ],
)
def test_record_creation_and_fencing(
    current: AssignmentRecord | None, create: str, fence: str
) -> None:
    assert commits.record_action(current, A.commit) == create
    assert commit.fence_action(current, A.commit) == fence


def test_the_fence_is_a_released_record_of_the_commit() -> None:
    fenced = commit.released_record(None, A, now=NOW + 5)
    assert (fenced.state, fenced.commit, fenced.released_at) == ("released", A.commit, NOW + 5)
    bound = record("bound")
    assert commit.released_record(bound, A, now=NOW).containers == bound.containers


def test_a_fence_over_another_commit_s_fence_joins_it_and_placements_carry_fences_on() -> None:
    older = record("released", "old")
    fence = commit.released_record(older, A, now=NOW)
    assert fence == msgspec.structs.replace(older, fenced=(A.commit,)), "old stays fenced too"
    assert commits.record_action(fence, "old") == "released"
    assert commits.record_action(fence, A.commit) == "released"
    assert validation.may_replace(fence, "new") and not validation.may_replace(fence, A.commit)
    placed = commits.placed_over(fence, msgspec.structs.replace(record("bound"), commit="new"))
    assert placed.fenced == (A.commit, "old")
    assert commits.placed_over(None, placed) == placed
    released_again = released(placed, now=NOW)
    for earlier in ("old", A.commit):
        assert commits.record_action(released_again, earlier) == "released"
        assert commit.fence_action(released_again, earlier) == "done"


def test_bookings_written_together_book_what_fits_one_after_the_other() -> None:
    inventory = wire.inventory("n1", 1)
    held = booking("held", (0, 8192, 500))
    ledger = NodeLedger(node="n1", bookings=(held,))
    state = translate.node_state("n1", inventory, wire.facts("n1"), [held], placeable=True)
    fits = booking("fits", (0, 4096, 300))
    no_room = booking("no-room", (0, 8192, 300))  # fits alone, not after "fits"
    retry = held  # already booked: nothing to do, no refusal
    twice = msgspec.structs.replace(fits, commit="c-other")
    written, refused = commit.book_all(ledger, state, [fits, no_room, retry, twice], now=NOW)
    assert written is not None
    assert [b.pod_uid for b in written.bookings] == ["held", "fits"]
    assert set(refused) == {no_room.commit, twice.commit}
    assert refused[no_room.commit] == "GPU 0: 8192 MiB asked, 4096 free"
    assert "already booked" in refused[twice.commit]
    assert commit.book_all(ledger, state, [retry], now=NOW) == (None, {})
    assert commit.book_all(ledger, None, [fits], now=NOW)[1] == {
        fits.commit: "node left the cluster"
    }


def test_one_batch_books_and_claims_the_pods_whose_claims_let_it() -> None:
    inventory = wire.inventory("n1", 1)
    state = translate.node_state("n1", inventory, wire.facts("n1"), [], placeable=True)
    fresh = booking("fresh", (0, 2048, 100))  # no claim yet: created
    again = booking("again", (0, 2048, 100))  # requeued: taken
    lost = booking("lost", (0, 2048, 100))  # another commit's claim: neither booked nor refused
    gone = booking("gone", (0, 2048, 100))  # deleted: the same
    full = booking("full", (0, 16384, 100))  # does not fit after the others: refused, unclaimed
    other = msgspec.structs.replace(lost, commit="c-other")
    claims = {
        "again": PodClaim(pod_uid="again", state="requeued", booking=again, updated_at=NOW),
        "lost": PodClaim(pod_uid="lost", state="placed", booking=other, updated_at=NOW),
        "gone": PodClaim(pod_uid="gone", state="deleted", updated_at=NOW),
    }
    pending = wire.pending("fresh")
    written, claimed, refused = commit.book_and_claim(
        None,
        state,
        [fresh, again, lost, gone, full],
        claims,
        {fresh.commit: pending},
        now=NOW,
    )
    assert written is not None and [b.pod_uid for b in written.bookings] == ["fresh", "again"]
    assert claimed == {
        "fresh": commit.placed_claim(fresh, pending, now=NOW),
        "again": commit.placed_claim(again, None, now=NOW),
    }
    assert list(refused) == [full.commit]
    # A retry after the batch landed (the answer lost): nothing left to write.
    landed = {uid: claimed[uid] for uid in ("fresh", "again")}
    assert commit.book_and_claim(written, state, [fresh, again], landed, {}, now=NOW) == (
        None,
        {},
        {},
    )


def by(placer: str, held: Booking) -> Booking:
    return msgspec.structs.replace(held, placer_id=placer)


# Another placer's booking on GPU 0 ("theirs") landed after "mine" was decided; "old", a third
# placer's, was on the node already and every decision saw it.
THEIRS = by("placer-b", booking("theirs", (0, 4096, 100)))
SAME = "commit c-theirs of placer-b booked the same GPUs after this decision"
BOTH_STARTED = "commit c-theirs of placer-b started sharing another idle GPU after this decision"


def old_on(gpu: int) -> Booking:
    return by("placer-c", booking("old", (gpu, 4096, 100)))


@pytest.mark.parametrize(
    ("mine", "seen", "old", "refused"),
    [
        pytest.param(booking("mine", (0, 4096, 100)), set(), None, SAME, id="overtaken"),
        pytest.param(booking("mine", (0, 4096, 100)), None, None, "", id="no-decision-state"),
        pytest.param(booking("mine", (0, 4096, 100)), {THEIRS.commit}, None, "", id="seen-it"),
        pytest.param(
            booking("mine", (1, 4096, 100)), set(), None, BOTH_STARTED, id="both-started-a-gpu"
        ),
        pytest.param(booking("mine", (1, 4096, 100)), set(), 0, "", id="theirs-joined-one"),
        pytest.param(booking("mine", (1, 4096, 100)), set(), 1, "", id="mine-joined-one"),
        pytest.param(
            booking("mine", (1, 16384, 1000), whole=True), set(), None, "", id="mine-whole"
        ),
        pytest.param(by("placer-b", booking("mine", (0, 4096, 100))), set(), None, "", id="own"),
    ],
)
def test_a_decision_another_placer_overtook_on_its_node_is_refused(
    mine: Booking, seen: set[str] | None, old: int | None, refused: str
) -> None:
    """It still fits, but its GPUs were chosen on a state that is gone, where that may change
    the choice: the same GPU (two spread pods on one GPU), or two GPUs each started by one
    replica (two slices a GPU apart that one GPU would hold). A GPU shared already, or taken
    whole, would have been chosen as it was."""
    held = (THEIRS,) if old is None else (old_on(old), THEIRS)
    ledger = NodeLedger(node="n1", bookings=held)
    state = translate.node_state(
        "n1", wire.inventory("n1", 2), wire.facts("n1"), list(held), placeable=True
    )
    counted = {c.commit for c in held[:-1]} | (seen or set())
    decided_on = {} if seen is None else {mine.commit: frozenset(counted)}
    written, why = commit.book_all(ledger, state, [mine], now=NOW, seen=decided_on)
    assert why == ({mine.commit: refused} if refused else {})
    assert (written is None) == bool(refused)


MINE = booking("mine", (1, 4096, 100))
BESIDE = booking("beside", (0, 4096, 100))  # this placer's, decided before "mine"
NO_ROOM = booking("no-room", (0, 16384, 100))  # more than GPU 0 has left beside THEIRS
GONE = "commit {} that this decision counted on the node is not booked"


@pytest.mark.parametrize(
    ("batch", "counted", "pending", "refused"),
    [
        pytest.param([MINE], {THEIRS.commit}, set(), {}, id="counted-and-booked"),
        pytest.param(
            [MINE], {THEIRS.commit, BESIDE.commit}, {BESIDE.commit}, {}, id="counted-still-writing"
        ),
        pytest.param(
            [BESIDE, MINE],
            {THEIRS.commit, BESIDE.commit},
            {BESIDE.commit, MINE.commit},
            {},
            id="counted-written-first",
        ),
        pytest.param(
            [MINE],
            {THEIRS.commit, BESIDE.commit},
            {MINE.commit},
            {MINE.commit: GONE.format(BESIDE.commit)},
            id="counted-given-back",
        ),
        pytest.param(
            [NO_ROOM, MINE],
            {THEIRS.commit, NO_ROOM.commit},
            {NO_ROOM.commit, MINE.commit},
            {
                NO_ROOM.commit: "GPU 0: 16384 MiB asked, 12288 free",
                MINE.commit: GONE.format(NO_ROOM.commit),
            },
            id="counted-refused-in-the-batch",
        ),
    ],
)
def test_a_decision_beside_a_booking_that_did_not_land_is_refused(
    batch: list[Booking], counted: set[str], pending: set[str], refused: dict[str, str]
) -> None:
    """This placer's decisions count its own bookings still being written; when one of those is
    refused or given back, a decision that counted it chose its GPUs beside a booking that is
    not there (slices packed beside another slice that went elsewhere)."""
    ledger = NodeLedger(node="n1", bookings=(THEIRS,))
    state = translate.node_state(
        "n1", wire.inventory("n1", 2), wire.facts("n1"), [THEIRS], placeable=True
    )
    seen = {b.commit: frozenset(counted - {b.commit}) for b in batch}
    written, why = commit.book_all(
        ledger, state, batch, now=NOW, seen=seen, pending=frozenset(pending)
    )
    assert why == refused
    booked = [b.pod_uid for b in written.bookings] if written is not None else ["theirs"]
    assert booked == ["theirs", *(b.pod_uid for b in batch if b.commit not in refused)]


def test_unbooking_takes_only_the_named_commit() -> None:
    ledger = NodeLedger(node="n1", bookings=(A, booking("b", (0, 1, 1))))
    assert commit.without_booking(ledger, "a", commit="c-other", now=NOW) is None
    left = commit.without_booking(ledger, "a", commit=A.commit, now=NOW)
    assert left is not None
    assert [b.pod_uid for b in left.bookings] == ["b"]


def facts_of(state: AssignmentState, commit_id: str = A.commit, node: str = "n1") -> RecordFacts:
    return RecordFacts(
        key=f"{node}.a",
        node=node,
        pod_uid="a",
        state=state,
        commit=commit_id,
        decided_at=NOW,
        released_at=NOW if state == "released" else None,
    )


@pytest.mark.parametrize(
    ("ledgers", "claims", "records", "expected"),
    [
        pytest.param({"n1": (A,)}, {}, [], [("roll-forward", A)], id="booked-not-claimed"),
        pytest.param(
            {"n1": (A,)}, {"a": claim("placed")}, [], [], id="placed-waits-for-its-binder"
        ),
        pytest.param(
            {"n1": (A,)},
            {"a": claim("placed")},
            [facts_of("reserved")],
            [],
            id="complete",
        ),
        pytest.param(
            {"n1": (A,)},
            {"a": claim("placed")},
            [facts_of("released")],
            [("finish-requeue", A)],
            id="record-released-claim-placed",
        ),
        pytest.param(
            {"n1": (A,)},
            {"a": claim("placed", A2)},
            [],
            [("unbook-stale", A), ("requeue-lost", A2)],
            id="lost-claim-booking-left",
        ),
        pytest.param(
            {"n1": (A,)},
            {"a": claim("deleted")},
            [facts_of("reserved")],
            [("unbook-stale", A), ("release-record", None)],
            id="deleted-half-released",
        ),
        pytest.param(
            {},
            {"a": claim("placed")},
            [facts_of("bound")],
            [("rebook", A)],
            id="record-without-booking",
        ),
        pytest.param(
            {},
            {"a": claim("requeued", A, request=True)},
            [],
            [("publish-requeue", A)],
            id="requeue-not-published",
        ),
        pytest.param(
            {},
            {"a": claim("requeued", A, request=True, extender=True)},
            [],
            [],
            id="extender-pod-requeued-left-to-kube-scheduler",
        ),
        pytest.param(
            {"n2": (A2,)},
            {"a": claim("placed", A2)},
            [facts_of("reserved", "c-a-2", "n2"), facts_of("reserved")],
            [("release-record", None)],
            id="older-generation-record-live",
        ),
    ],
)
def test_reconciliation_plans_one_repair_per_half_done_state(
    ledgers: dict[str, tuple[object, ...]],
    claims: dict[str, PodClaim],
    records: list[RecordFacts],
    expected: list[tuple[str, object]],
) -> None:
    planned = repairs.plan_repairs(ledgers, claims, records, now=NOW + 60, grace_s=10)  # type: ignore[arg-type]
    assert [(r.kind, r.booking) for r in planned] == expected


def test_reconciliation_leaves_what_may_still_be_in_flight() -> None:
    planned = repairs.plan_repairs({"n1": (A,)}, {}, [], now=NOW + 1, grace_s=10)
    assert planned == []
    assert repairs.plan_repairs({"n1": (A,)}, {}, [], now=NOW + 10, grace_s=10) == [
        Repair(kind="roll-forward", pod_uid="a", booking=A)
    ]


def forged(node: str = "n1", commit_id: str = "c-made-up", **changes: object) -> RecordFacts:
    """A live record no placer committed, first seen by this placer at ``NOW``."""
    return msgspec.structs.replace(
        facts_of("bound", commit_id, node), seen_at=NOW, bound_at=NOW, **changes
    )


@pytest.mark.parametrize(
    ("claims", "record"),
    [
        pytest.param({}, forged(), id="no-claim"),
        pytest.param({}, forged(commit_id=""), id="no-claim-no-commit"),
        pytest.param({}, forged(decided_at=NOW + 10 * 365 * 86400.0), id="dated-years-ahead"),
        pytest.param({"a": claim("placed")}, forged(commit_id=""), id="claimed-no-commit"),
        # The real commit's id, on another node than the one it booked.
        pytest.param({"a": claim("placed")}, forged("n2", A.commit), id="real-commit-moved"),
    ],
)
def test_a_live_record_no_placer_committed_is_swept_once_known_for_the_grace(
    claims: dict[str, PodClaim], record: RecordFacts
) -> None:
    """Issue 19: forged records stayed forever. The placer owns releases and holds every claim,
    so it releases a live record no claim names (on its node) once it has known it for the
    grace period, whatever date the record gives itself."""
    ledgers = {"n1": (A,)} if claims else {}
    early = repairs.plan_repairs(ledgers, claims, [record], now=NOW + 5, grace_s=10)
    assert [r.kind for r in early if r.kind == "release-record"] == []
    late = repairs.plan_repairs(ledgers, claims, [record], now=NOW + 10, grace_s=10)
    released = [r for r in late if r.kind == "release-record"]
    assert released == [Repair(kind="release-record", pod_uid="a", record_key=record.key)]


def test_the_requeue_message_id_names_the_commit() -> None:
    assert commit.requeue_msg_id(A) == f"requeue.a.{A.commit}"
