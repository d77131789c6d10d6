"""The tests' one polling wait: sync and async conditions, the value returned, a named timeout."""

from __future__ import annotations

import pytest

from tests.harness.wait import eventually


async def test_returns_the_first_truthy_value_of_a_sync_condition() -> None:
    values = iter([0, None, "", 7])
    assert await eventually(lambda: next(values), interval=0) == 7


async def test_awaits_an_async_condition() -> None:
    calls = 0

    async def third_time() -> str:
        nonlocal calls
        calls += 1
        return "ready" if calls == 3 else ""

    assert await eventually(third_time, interval=0) == "ready"
    assert calls == 3


async def test_times_out_naming_what_it_waited_for_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the node; last: \[\]"):
        await eventually(lambda: [], timeout=0.05, what="the node", interval=0.01)
