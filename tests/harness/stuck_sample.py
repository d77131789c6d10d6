"""Not collected by the suite: tests/harness/test_reaper.py runs it in a pytest of its own."""

from __future__ import annotations

import asyncio

import pytest


@pytest.mark.timeout(2)
async def test_leaves_a_task_that_ignores_every_cancel() -> None:
    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    asyncio.get_running_loop().create_task(stubborn())
    await asyncio.sleep(3600)  # past its timeout


async def test_after_it() -> None:
    await asyncio.sleep(0)
