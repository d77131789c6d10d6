"""The waiting board's pure parts (``services/placer/rules/board.py``): the shared order,
revisions, and
which waiting pod goes before a pod about to commit."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from services.placer.core.model import PodRequest
from services.placer.core.queue import ReferenceNode, SharedKey
from services.placer.rules import translate
from services.placer.rules.board import WaitingBoard, first_fitting
from shared.messages.pods import PodPending
from shared.messages.waiting import WaitingPod
from tests.placer import wire


def pending(
    uid: str,
    *,
    priority: int = 0,
    label: int | None = None,
    memory_mib: int = 4096,
    shares: int = 1,
    cpu_milli: int = 1000,
    created: float = 0.0,
) -> PodPending:
    pod = wire.pending(
        uid, memory_mib=memory_mib, shares=shares, priority=priority, cpu_milli=cpu_milli
    )
    hints = msgspec.structs.replace(pod.hints, priority_label=label)
    return msgspec.structs.replace(pod, hints=hints, created_at=wire.NOW + created)


def waiting(pod: PodPending, holder: str = "placer-1") -> WaitingPod:
    return WaitingPod(pod=pod, holder=holder, since=wire.NOW, updated_at=wire.NOW)


def board_of(*pods: PodPending) -> WaitingBoard:
    board = WaitingBoard()
    for revision, pod in enumerate(pods, start=1):
        assert board.put(waiting(pod), revision)
    return board


def order(board: WaitingBoard, before: PodPending) -> list[str]:
    key = key_of(board, before)
    return [p.uid for p in board.ahead_of(key)]


def key_of(board: WaitingBoard, pod: PodPending) -> SharedKey:
    key = board.key_of(
        translate.pod_request(pod),
        priority_label=pod.hints.priority_label,
        created_at=pod.created_at,
    )
    assert key is not None
    return key


LAST = pending("zzz-last", priority=-1000)


def test_the_board_keeps_seed_002s_order_priority_label_size_arrival_uid() -> None:
    pods = [
        pending("small-late", created=5),
        pending("high", priority=100, memory_mib=1024),
        pending("labelled", label=7),
        pending("big", shares=2),
        pending("small-early", created=1),
        pending("b-tie", created=1),
        pending("a-tie", created=1),
    ]
    board = board_of(*pods)
    assert order(board, LAST) == [
        "high",
        "labelled",
        "big",
        "a-tie",
        "b-tie",
        "small-early",
        "small-late",
    ]
    assert order(board, pods[2]) == ["high"]  # strictly before
    assert order(board, pending("top", priority=10_000)) == []


def test_newer_revisions_replace_entries_and_older_ones_or_deletions_do_not() -> None:
    board = board_of(pending("a"), pending("b"))
    assert not board.put(waiting(pending("a", priority=50)), 1)
    assert order(board, LAST) == ["a", "b"]
    assert board.put(waiting(pending("b", priority=50), holder="placer-2"), 9)
    assert order(board, LAST) == ["b", "a"]
    entry = board.get("b")
    assert entry is not None and entry.waiting.holder == "placer-2"
    assert not board.remove("b", before=9)  # a deletion older than the entry held
    assert board.remove("b", before=10)
    assert not board.remove("b")
    assert order(board, LAST) == ["a"] and len(board) == 1 and board.uids() == {"a"}


def test_rekeying_measures_sizes_against_the_new_reference_node() -> None:
    board = board_of(pending("gpu"), pending("cpu", shares=0, cpu_milli=8000))
    # Against the default reference (64 cores, 8 GPUs) 8 cores weigh more than a GPU share ...
    assert order(board, LAST) == ["cpu", "gpu"]
    # ... against a node of 1,000 cores and one GPU, the share weighs more.
    board.rekey(ReferenceNode(cpu_milli=1_000_000, memory_mib=512 * 1024, gpus=1))
    assert order(board, LAST) == ["gpu", "cpu"]


def test_an_invalid_request_is_kept_but_never_ordered() -> None:
    bad = pending("bad", shares=1, memory_mib=-5)
    board = board_of(bad, pending("ok"))
    assert board.get("bad") is not None
    assert order(board, LAST) == ["ok"]
    assert board.remove("bad")


def fits_only(*uids: str, calls: list[str] | None = None) -> Callable[[PodRequest], bool]:
    def fits(request: PodRequest) -> bool:
        if calls is not None:
            calls.append(request.uid)
        return request.uid in uids

    return fits


def never(uid: str) -> bool:
    return False


@pytest.mark.parametrize(
    ("fitting", "skipped", "expected"),
    [
        pytest.param(("p2", "p3"), (), "p2", id="the-first-that-fits"),
        pytest.param((), (), None, id="none-fits-none-blocks"),
        pytest.param(("p1", "p2"), ("p1",), "p2", id="skipped-ones-passed-over"),
        pytest.param(("low",), (), None, id="only-pods-before-count"),
    ],
)
def test_the_first_waiting_pod_before_that_fits_goes_first(
    fitting: tuple[str, ...], skipped: tuple[str, ...], expected: str | None
) -> None:
    board = board_of(
        *(pending(f"p{i}", priority=100 - i) for i in range(4)), pending("low", priority=-5)
    )
    found = first_fitting(
        board,
        key_of(board, pending("me")),
        skip=lambda uid: uid in skipped,
        fits=fits_only(*fitting),
        scan=64,
        evaluations=16,
    )
    assert (found.uid if found else None) == expected


def test_the_look_is_bounded_and_decides_each_pod_shape_once() -> None:
    same_shape = [pending(f"s{i}", priority=100) for i in range(5)]  # equal requests
    other = [pending(f"o{i}", priority=50, memory_mib=1000 + i) for i in range(10)]
    board = board_of(*same_shape, *other)
    me = key_of(board, pending("me"))
    calls: list[str] = []
    assert (
        first_fitting(board, me, skip=never, fits=fits_only(calls=calls), scan=64, evaluations=16)
        is None
    )
    assert calls[0] == "s0" and not {"s1", "s2", "s3", "s4"} & set(calls)  # one per shape
    assert len(calls) == 11
    calls.clear()
    found = first_fitting(
        board, me, skip=never, fits=fits_only("o9", calls=calls), scan=64, evaluations=4
    )
    assert found is None and len(calls) == 4  # at most four decided afresh
    calls.clear()
    assert (
        first_fitting(
            board, me, skip=never, fits=fits_only("o9", calls=calls), scan=8, evaluations=16
        )
        is None
    )
    assert calls == ["s0", "o0", "o1", "o2"]  # only the first eight entries looked at
