"""Fixtures for placer service tests: a placer body running over the test's nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from services.placer.command import PlacerSettings, build_config
from services.placer.service import PlacerService, run_placer
from shared import codec, subjects
from shared.messages.placement import PlacementRejected
from shared.runtime.bus import Bus
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import ServiceContext, run_service
from shared.runtime.nats import NatsBus
from tests.harness.nats import NatsServer
from tests.harness.store import mark_restored
from tests.harness.wait import eventually

until = functools.partial(eventually, timeout=20.0, interval=0.01)
"""Wait (polling) until ``condition()`` holds."""


@dataclass
class RunningPlacer:
    readiness: Readiness
    registry: CollectorRegistry
    stop: asyncio.Event
    task: asyncio.Task[int]
    service: PlacerService | None = None

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


PlacerFactory = Callable[..., contextlib.AbstractAsyncContextManager[RunningPlacer]]


@pytest.fixture
def start_placer(nats_server: NatsServer) -> PlacerFactory:
    """``async with start_placer(placer_id="a", ...) as placer:`` runs the placer service body
    (run_service + run_placer) against the test's nats-server, ready on entry. No binder runs
    here: the fixture says, as the binder would, that the store holds every bound placement
    (``restored=False`` leaves the placer waiting for it)."""

    @contextlib.asynccontextmanager
    async def running(
        *,
        wait_ready: bool = True,
        restored: bool = True,
        tuning: dict[str, Any] | None = None,
        wrap_bus: Callable[[Bus], Bus] | None = None,
        **overrides: Any,
    ) -> AsyncIterator[RunningPlacer]:
        fields: dict[str, Any] = {
            "nats_url": nats_server.url,
            "http_host": "127.0.0.1",
            "http_port": 0,
            "log_format": "text",
            "placer_id": "placer-test",
            "ack_wait_s": 5.0,
            "reconcile_interval_s": 2.0,
        }
        settings = PlacerSettings(**(fields | overrides))
        if restored:
            marker = await NatsBus.connect(
                settings.nats_url, name="tessera-test", replicas=settings.nats_replicas
            )
            try:
                await mark_restored(marker)
            finally:
                await marker.drain()
        config = dataclasses.replace(build_config(settings), **(tuning or {}))
        readiness = Readiness()
        registry = CollectorRegistry()
        stop = asyncio.Event()
        holder: dict[str, PlacerService] = {}

        async def body(context: ServiceContext) -> None:
            if wrap_bus is not None:
                context = dataclasses.replace(context, bus=wrap_bus(context.bus))
            await run_placer(
                context, config, started=lambda service: holder.update(service=service)
            )

        task = asyncio.create_task(
            run_service(
                name="placer",
                settings=settings,
                body=body,
                stop=stop,
                readiness=readiness,
                registry=registry,
            )
        )
        placer = RunningPlacer(readiness=readiness, registry=registry, stop=stop, task=task)
        try:
            if wait_ready:
                # The service registers its own readiness check when it is built: until then
                # /readyz has only the NATS check, which may already pass.
                await until(
                    lambda: ("service" in holder and readiness.ready) or task.done(),
                    what=f"placer readiness {readiness.report()}",
                )
                assert not task.done(), "the placer stopped while starting"
            placer.service = holder.get("service")
            yield placer
        finally:
            stop.set()
            assert await asyncio.wait_for(task, timeout=15) == 0

    return running


async def stream_messages(bus: NatsBus, stream: str, subject: str) -> list[bytes]:
    """Every message on ``subject`` in ``stream`` so far (read by a fresh durable consumer)."""
    consumer = await bus.pull_consumer(
        stream=stream, durable=f"test-{uuid.uuid4().hex[:8]}", subject=subject
    )
    found: list[bytes] = []
    try:
        while True:
            try:
                batch = await consumer.fetch(256, 0.5)
            except TimeoutError:  # nats-py sometimes raises the plain asyncio one: none left
                break
            if not batch:
                break
            found.extend(d.data for d in batch)
            for delivery in batch:
                await delivery.ack()
    finally:
        await consumer.close()
    return found


async def rejections(bus: NatsBus) -> list[PlacementRejected]:
    """Every PlacementRejected published so far."""
    raw = await stream_messages(bus, subjects.STREAM_PLACEMENTS, subjects.PLACEMENTS_REJECTED)
    return [codec.decode(data, PlacementRejected) for data in raw]


async def http_get(port: int, path: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.json()
