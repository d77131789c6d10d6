"""The plugin's book of grants: a grant whose record the store lost is kept unrecorded (not
checked against records, answered to a restore) for a day; a release forgets it at once."""

from __future__ import annotations

from pathlib import Path

from services.deviceplugin.grants import UNRECORDED_KEEP_S, GrantBook, GrantFile
from services.deviceplugin.rules.allocate import Granted
from tests.deviceplugin.builders import container, share
from tests.harness.clock import FakeClock

SLICES = (container("main", share(0)),)


async def test_unrecorded_grants_are_answered_not_checked_and_expire() -> None:
    clock = FakeClock()
    book = GrantBook(GrantFile(Path("/nonexistent/grants.json")), clock=clock, failed=lambda: None)
    book.grant("n.a", Granted(commit="c-a", containers=("main",), slices=SLICES))
    book.grant("n.b", Granted(commit="c-b", containers=("main",), slices=SLICES))
    book.unrecord({"n.a", "n.gone"})
    assert book.get("n.a") is None, "no longer checked against a record"
    assert book.get("n.b") is not None
    answered = book.answer("n", None).granted
    assert [(g.pod_uid, g.commit, g.containers) for g in answered] == [
        ("a", "c-a", SLICES),
        ("b", "c-b", SLICES),
    ]
    await clock.advance(UNRECORDED_KEEP_S + 1)
    book.unrecord(set())
    assert [g.pod_uid for g in book.answer("n", None).granted] == ["b"]
    book.forget({"n.b"})
    assert book.answer("n", None).granted == ()
