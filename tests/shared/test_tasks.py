"""cancel_and_wait: the cancelled task is waited for, and a stop of the caller is never lost."""

from __future__ import annotations

import asyncio

import pytest

from shared.runtime.tasks import cancel_and_wait


async def test_waits_until_the_task_has_finished_its_cleanup() -> None:
    cleaned = False

    async def worker() -> None:
        nonlocal cleaned
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.01)
            cleaned = True

    task = asyncio.create_task(worker())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled() and cleaned


async def test_a_task_that_already_failed_is_waited_for_without_raising() -> None:
    async def broken() -> None:
        raise ValueError("broken")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert isinstance(task.exception(), ValueError)


async def test_a_cancel_of_the_caller_while_it_waits_still_stops_the_caller() -> None:
    # With `with suppress(BaseException): await task` the caller's own cancel was swallowed and
    # it ran on (a stopping service kept watching).
    release = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await release.wait()

    inner = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    ran_on = False

    async def caller() -> None:
        nonlocal ran_on
        await cancel_and_wait(inner)
        ran_on = True

    outer = asyncio.create_task(caller())
    await asyncio.sleep(0.01)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert not ran_on
    release.set()
    await asyncio.wait({inner})
    assert inner.cancelled()
