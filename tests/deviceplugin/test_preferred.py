"""Pure: GetPreferredAllocation steers the kubelet to the decided GPUs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.deviceplugin.rules.preferred import prefer

GPU_OF = {f"g{g}::{n}": f"g{g}" for g in range(3) for n in range(4)}
ALL = tuple(GPU_OF)


@pytest.mark.parametrize(
    ("available", "must", "size", "decided", "expected"),
    [
        pytest.param(ALL, (), 1, ("g2",), ("g2::0",), id="one-share-on-decided-gpu"),
        pytest.param(
            ALL, (), 2, ("g1", "g2"), ("g1::0", "g2::0"), id="one-device-on-each-decided-gpu"
        ),
        pytest.param(
            ALL, (), 3, ("g1",), ("g1::0", "g1::1", "g1::2"), id="memory-units-all-on-decided-gpu"
        ),
        pytest.param(
            ("g0::0", "g1::3"),
            (),
            2,
            ("g1",),
            ("g1::3", "g0::0"),
            id="decided-gpu-short-filled-from-others",
        ),
        pytest.param(ALL, ("g0::2",), 2, ("g2",), ("g0::2", "g2::0"), id="must-include-kept"),
        pytest.param(ALL, (), 2, (), ("g0::0", "g0::1"), id="no-record-stable-order"),
        pytest.param(("g0::0",), (), 3, ("g0",), ("g0::0",), id="not-enough-available"),
    ],
)
def test_prefer(
    available: tuple[str, ...],
    must: tuple[str, ...],
    size: int,
    decided: tuple[str, ...],
    expected: tuple[str, ...],
) -> None:
    assert prefer(available, must, size, decided_gpus=decided, gpu_of=GPU_OF) == expected


@given(
    available=st.lists(st.sampled_from(ALL), unique=True),
    must_count=st.integers(0, 3),
    size=st.integers(0, 12),
    decided=st.lists(st.sampled_from(["g0", "g1", "g2", "gone"]), max_size=3, unique=True),
)
def test_preference_is_a_valid_kubelet_answer(
    available: list[str], must_count: int, size: int, decided: list[str]
) -> None:
    must = available[:must_count]
    chosen = prefer(available, must, size, decided_gpus=decided, gpu_of=GPU_OF)
    assert len(chosen) == len(set(chosen)), "no ID twice"
    assert set(must) <= set(chosen), "every must-include ID is kept"
    assert set(chosen) <= set(available), "only available IDs"
    assert len(chosen) == max(len(set(must)), min(size, len(available)))
    # Decided GPUs come first: no other GPU's ID is taken while a decided GPU still has one free.
    extra = [i for i in chosen if i not in must]
    taken_elsewhere = any(GPU_OF[i] not in decided for i in extra)
    left_on_decided = [i for i in available if i not in chosen and GPU_OF[i] in decided]
    assert not (taken_elsewhere and left_on_decided)
