"""A running dashboard (in this process) over the test's real nats-server, and HTTP helpers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from services.dashboard.service import run_dashboard
from services.dashboard.settings import DashboardSettings
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import Connect, connect_nats
from tests.harness.nats import NatsServer
from tests.harness.wait import eventually as shared_eventually

eventually = functools.partial(shared_eventually, timeout=20.0, interval=0.05)
"""Poll ``probe`` until it returns something truthy (a loaded machine gets time)."""


@dataclass
class Dashboard:
    """A dashboard running in the test's event loop."""

    url: str
    registry: CollectorRegistry
    session: aiohttp.ClientSession
    task: asyncio.Task[int]
    stop: asyncio.Event

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(self.url + path) as response:
            return response.status, await response.json()

    async def ok(self, path: str) -> Any:
        status, body = await self.get(path)
        assert status == 200, (status, body)
        return body


@contextlib.asynccontextmanager
async def running_dashboard(
    nats_url: str, *, connect: Connect = connect_nats, wait_ready: bool = True, **settings: Any
) -> AsyncIterator[Dashboard]:
    """Start ``run_dashboard`` on a free port; stop it (and check it stopped cleanly) after."""
    readiness = Readiness()
    registry = CollectorRegistry()
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_dashboard(
            DashboardSettings(
                nats_url=nats_url,
                http_host="127.0.0.1",
                http_port=0,
                push_interval_s=0.05,
                **settings,
            ),
            connect=connect,
            stop=stop,
            registry=registry,
            readiness=readiness,
        )
    )
    port = await eventually(lambda: asyncio.sleep(0, readiness.http_port), what="HTTP port")
    async with aiohttp.ClientSession() as session:
        dashboard = Dashboard(
            url=f"http://127.0.0.1:{port}",
            registry=registry,
            session=session,
            task=task,
            stop=stop,
        )
        if wait_ready:
            await eventually(lambda: asyncio.sleep(0, readiness.ready), what="dashboard ready")
        try:
            yield dashboard
        finally:
            stop.set()
            assert await asyncio.wait_for(task, timeout=20) == 0


@pytest.fixture
async def dashboard(nats_server: NatsServer) -> AsyncIterator[Dashboard]:
    async with running_dashboard(nats_server.url) as running:
        yield running
