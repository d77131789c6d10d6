"""Fixtures shared by every test: a real nats-server and a connected bus; and for every async
test, a bounded end (no task it left behind may hang the run)."""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import settings

from shared.runtime.nats import NatsBus
from tests.harness.clock import FakeClock
from tests.harness.nats import NatsServer

# aiohttp-based clients trust proxy variables; tests only talk to loopback.
os.environ["NO_PROXY"] = "127.0.0.1,localhost"
os.environ.pop("http_proxy", None)
os.environ.pop("HTTP_PROXY", None)

# Property tests are reproducible by default: the same examples on every run, so a red CI is a
# change in the code, never a lucky draw. `scripts/fuzz` explores random seeds for longer (the
# "explore" profile) and each counterexample it finds is pinned here with `@example`.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("TESSERA_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A fresh nats-server with JetStream, on a random port, stopped after the test."""
    with NatsServer() as server:
        yield server


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[NatsBus]:
    """A NatsBus connected to ``nats_server`` with Tessera's streams and buckets created."""
    connected = await NatsBus.connect(nats_server.url, name="tessera-test")
    try:
        yield connected
    finally:
        await connected.drain()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


REAP_S = float(os.environ.get("TESSERA_TEST_REAP_S", "20"))
"""How long the tasks an async test left running get to end once cancelled again and again."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if pytest_asyncio.is_async_test(item):
            # First, so that it is torn down last: after every other fixture has stopped what it
            # started (a server, a bus), in the test's event loop.
            item.fixturenames.insert(0, "_reap_leftover_tasks")


@pytest.fixture
async def _reap_leftover_tasks() -> AsyncIterator[None]:
    """After an async test, cancel what it left running until it ends (a task may lose one
    cancel on Python 3.11, and the event loop's close cancels only once, then waits forever: a
    timed-out test once hung the whole run for 34 minutes). A task still running after
    ``REAP_S`` fails this test, naming where it is stuck, and is marked done so that the loop
    closes and the run goes on."""
    yield
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    deadline = loop.time() + REAP_S
    while left := [t for t in asyncio.all_tasks() if t is not me and not t.done()]:
        if loop.time() > deadline:
            stacks = io.StringIO()
            for task in left:
                task.print_stack(limit=6, file=stacks)
                _abandon(task)
            pytest.fail(
                f"{len(left)} task(s) still running {REAP_S:g} s after the test, cancelled "
                f"every 0.1 s:\n{stacks.getvalue()}",
                pytrace=False,
            )
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=0.1)


def _abandon(task: asyncio.Task[Any]) -> None:
    """Mark a task that ignores every cancel as cancelled without running it again: the event
    loop's close waits for every task, and this one would never end."""
    asyncio.Future.cancel(task)
