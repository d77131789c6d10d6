"""Fixtures shared by every test: a real nats-server and a connected bus."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import settings

from shared.runtime.bus import NatsBus
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
