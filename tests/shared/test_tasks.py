"""Stops are never lost: cancel_and_wait waits for the cancelled task without swallowing a stop of
the caller, a loop waiting with a timeout stops however its stop arrives, and a KV watch stops
even where library code lost its cancel."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from shared import subjects
from shared.clock import SystemClock
from shared.runtime.bus import KvEntry
from shared.runtime.follow import follow
from shared.runtime.nats import NatsBus
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


async def _stop_arriving_as_the_wait_ends(wait: str) -> bool:
    """A service loop waiting for a change with a timeout (the placer's retry loop, the
    dashboard's push loop); its stop (a cancel) arrives just as the change does. True when the
    loop stopped."""
    changed = asyncio.Event()

    async def service_loop() -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                if wait == "asyncio.timeout":
                    async with asyncio.timeout(10):
                        await changed.wait()
                else:
                    await asyncio.wait_for(changed.wait(), 10)
            changed.clear()

    loop_task = asyncio.create_task(service_loop())
    await asyncio.sleep(0.01)
    changed.set()
    await asyncio.sleep(0)  # the awaited wait finishes...
    loop_task.cancel()  # ...and the stop comes before the loop has run on
    await asyncio.wait({loop_task}, timeout=1.0)
    stopped = loop_task.done()
    if not stopped:
        await cancel_and_wait(loop_task)
    return stopped


async def test_a_stop_arriving_as_the_wait_ends_stops_a_loop_waiting_with_asyncio_timeout() -> None:
    assert await _stop_arriving_as_the_wait_ends("asyncio.timeout")


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 rewrote wait_for")
async def test_wait_for_loses_that_stop_on_python_3_11() -> None:
    # Why ruff bans asyncio.wait_for in shared/, services/ and tessera/ (pyproject.toml). The
    # likely cause of a device plugin test's 60 s hang in its teardown (its watch loops were
    # cancelled as a KV watch finished its cleanup), and of a placer that once did not stop
    # within 30 s of SIGTERM (its retry loop waits this way for changes that come constantly).
    assert not await _stop_arriving_as_the_wait_ends("asyncio.wait_for")


class SwallowingBus:
    """The real bus, except that starting a watch first waits inside ``asyncio.wait_for`` (as
    nats-py's requests do) for a reply the test sends just as the stop comes."""

    def __init__(self, bus: NatsBus) -> None:
        self._bus = bus
        self.waiting = asyncio.Event()
        self.reply = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def kv_watch(
        self, bucket: str, keys: str = ">", *, batch_s: float = 0.0
    ) -> AsyncGenerator[KvEntry | None, None]:
        self.waiting.set()
        await asyncio.wait_for(self.reply.wait(), 10)  # the library's way
        async with contextlib.aclosing(self._bus.kv_watch(bucket, keys)) as watch:
            async for entry in watch:
                yield entry


async def test_a_kv_watch_whose_stop_a_library_swallowed_stops_anyway(bus: NatsBus) -> None:
    """A mirror's watch loop cancelled as a library call inside it returns: on Python 3.11 the
    cancel is lost there, and the watch, once started, would wait for changes forever."""
    swallowing = SwallowingBus(bus)

    async def ignore(_: KvEntry) -> None:
        return None

    follower = asyncio.create_task(
        follow(swallowing, subjects.KV_LEDGER, on_entry=ignore, clock=SystemClock())
    )
    await swallowing.waiting.wait()
    swallowing.reply.set()
    await asyncio.sleep(0)  # the library's wait finishes...
    follower.cancel()  # ...and the stop comes before the loop has run on
    await asyncio.wait({follower}, timeout=5.0)
    assert follower.done(), "the watch ran on after its stop"
    assert follower.cancelled()
