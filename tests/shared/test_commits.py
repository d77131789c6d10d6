"""The commit rules every service shares (``shared.commits``): which records stand for a placer's
commit, and what the first record of a commit may be written over."""

from __future__ import annotations

import msgspec
import pytest

from shared.commits import RecordAction, booking_problem, placed_over, record_action, record_of
from shared.messages.assignments import AssignmentRecord, released
from shared.messages.ledger import Booking
from tests.binder.builders import record, slices
from tests.harness.commits import booking_of

REAL = record("uid-1", "real", slices("main", (0, 4096, 5)), state="bound", bound_at=1.0)


def moved(**changes: object) -> AssignmentRecord:
    return msgspec.structs.replace(REAL, **changes)


def moved_booking(**changes: object) -> Booking:
    return msgspec.structs.replace(booking_of(REAL), **changes)


@pytest.mark.parametrize(
    ("rec", "booking", "problem"),
    [
        pytest.param(REAL, booking_of(REAL), None, id="committed"),
        pytest.param(moved(commit=""), booking_of(REAL), "names no commit", id="no-commit"),
        pytest.param(REAL, None, "holds nothing", id="not-booked"),
        pytest.param(
            REAL, moved_booking(commit="older"), "holds commit older", id="booked-by-another"
        ),
        pytest.param(
            REAL, moved_booking(node="gpu-9"), "booked default/real on gpu-9", id="other-node"
        ),
        pytest.param(
            moved(containers=(slices("main", (1, 4096, 5)),)),
            booking_of(REAL),
            "are not the ones",
            id="other-slices",
        ),
    ],
)
def test_booking_problem(
    rec: AssignmentRecord, booking: Booking | None, problem: str | None
) -> None:
    found = booking_problem(rec, booking)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


def test_the_record_of_a_booking_is_the_record_the_booking_describes() -> None:
    assert record_of(booking_of(REAL), bound_at=1.0) == REAL
    assert record_of(booking_of(REAL), state="reserved").state == "reserved"


OLDER = moved(commit="older")


@pytest.mark.parametrize(
    ("current", "action"),
    [
        pytest.param(None, "write", id="empty-key"),
        pytest.param(REAL, "done", id="written"),
        pytest.param(released(REAL, now=2.0), "released", id="fenced"),
        pytest.param(released(OLDER, now=2.0), "write", id="over-an-older-commit-released"),
        pytest.param(
            msgspec.structs.replace(released(OLDER, now=2.0), fenced=(REAL.commit,)),
            "released",
            id="fenced-beside-an-older-commit",
        ),
        pytest.param(OLDER, "blocked", id="another-commit-live"),
    ],
)
def test_record_action(current: AssignmentRecord | None, action: RecordAction) -> None:
    assert record_action(current, REAL.commit) == action


def test_a_record_written_over_a_released_one_carries_its_fences() -> None:
    fence = msgspec.structs.replace(released(OLDER, now=2.0), fenced=("oldest",))
    assert placed_over(fence, REAL).fenced == ("oldest", "older")
    assert placed_over(None, REAL) == REAL
