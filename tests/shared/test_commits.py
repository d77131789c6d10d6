"""Which records stand for a placer's commit (``shared.commits``), and which ones the binder's
ambiguity gate must still wait for although they no longer do."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from services.placer.commit import deleted_claim, requeued_claim
from shared.commits import commit_problem, withdrawing
from shared.messages.assignments import AssignmentRecord
from shared.messages.ledger import Booking, PodClaim
from tests.binder.builders import record, slices
from tests.harness.commits import booking_of, claim_of

REAL = record("uid-1", "real", slices("main", (0, 4096, 5)), state="bound", bound_at=1.0)


def moved(**changes: object) -> AssignmentRecord:
    return msgspec.structs.replace(REAL, **changes)


def moved_booking(**changes: object) -> Booking:
    return msgspec.structs.replace(booking_of(REAL), **changes)


DELETED = deleted_claim(REAL.pod_uid, claim_of(REAL), reason="gone", now=2.0)
"""REAL's claim once its pod was deleted (its booking still named)."""

Case = tuple[AssignmentRecord, PodClaim | None, Booking | None]
CASES: dict[str, tuple[Callable[[], Case], str | None, bool]] = {
    # name: (record, claim, booking), the problem found (a fragment), withdrawing
    "committed": (lambda: (REAL, claim_of(REAL), booking_of(REAL)), None, False),
    "no commit named": (
        lambda: (moved(commit=""), claim_of(REAL), booking_of(REAL)),
        "names no commit",
        False,
    ),
    "no claim": (lambda: (REAL, None, booking_of(REAL)), "it has no claim", False),
    "claim of another commit": (
        lambda: (moved(commit="forged"), claim_of(REAL), booking_of(REAL)),
        "names commit commit-uid-1, the record forged",
        False,
    ),
    "not booked": (
        lambda: (REAL, claim_of(REAL), None),
        "holds nothing",
        False,
    ),
    "booked by another commit": (
        lambda: (REAL, claim_of(REAL), moved_booking(commit="older")),
        "holds commit older",
        False,
    ),
    "booked for another node": (
        lambda: (REAL, claim_of(REAL), moved_booking(node="gpu-9")),
        "booked default/real on gpu-9",
        False,
    ),
    "other slices than booked": (
        lambda: (
            moved(containers=(slices("main", (1, 4096, 5)),)),
            claim_of(REAL),
            booking_of(REAL),
        ),
        "are not the ones",
        False,
    ),
    # The pod was deleted: the claim turned deleted, the record is not fenced yet.
    "pod deleted, record not yet fenced": (
        lambda: (
            REAL,
            DELETED,
            booking_of(REAL),
        ),
        "is deleted, not placed",
        True,
    ),
    "requeued": (
        lambda: (REAL, requeued_claim(claim_of(REAL), reason="failed", now=2.0), None),
        "is requeued, not placed",
        True,
    ),
    # The same commit's claim, deleted, does not vouch for a copy of the record on another node.
    "deleted claim, record copied to another node": (
        lambda: (
            moved(node="gpu-9"),
            DELETED,
            None,
        ),
        "is deleted, not placed",
        False,
    ),
    "deleted claim of another commit": (
        lambda: (
            moved(commit="forged"),
            DELETED,
            None,
        ),
        "is deleted, not placed",
        False,
    ),
    "deleted before any booking": (
        lambda: (REAL, deleted_claim(REAL.pod_uid, None, reason="gone", now=2.0), None),
        "is deleted, not placed",
        False,
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_commit_problem_and_withdrawing(name: str) -> None:
    build, problem, withdrawn = CASES[name]
    rec, claim, booking = build()
    found = commit_problem(rec, claim=claim, booking=booking)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found
    assert withdrawing(rec, claim=claim) is withdrawn
