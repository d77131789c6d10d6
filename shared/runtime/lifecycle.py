"""Run a service: logging, HTTP health, the bus, the service body in one TaskGroup, clean stop.

``run_service`` is what every ``tessera <service>`` command calls after loading its settings::

    return await run_service(name="placer", settings=settings, body=placer_body)

Order of events: logging is configured; ``/healthz`` starts answering (``/readyz`` says 503
until the bus is up); the bus connects, retrying until it succeeds or a signal arrives; the body
runs. SIGTERM or SIGINT cancels the body, drains the bus (in-flight messages are finished, un-acked
JetStream messages return to the server for redelivery) and stops the HTTP server. The exit code is
0 after a signal and 1 when the body failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from shared.clock import Clock, SystemClock
from shared.config import Settings
from shared.runtime.bus import Bus, NatsBus
from shared.runtime.edge import Edge
from shared.runtime.health import HealthServer, HttpRoutes, Readiness
from shared.runtime.logs import configure_logging
from shared.runtime.metrics import EdgeMetrics

log = logging.getLogger(__name__)

Connect = Callable[[str, str], Coroutine[Any, Any, Bus]]
"""(url, client name) -> a connected Bus; raises OSError-like errors when it cannot."""


async def connect_nats(url: str, name: str) -> Bus:
    """The real connector: NATS with JetStream streams and KV buckets ensured."""
    return await NatsBus.connect(url, name=name)


@dataclass(frozen=True)
class ServiceContext:
    """What a service body gets: its ports and the shared machinery, all passed in."""

    name: str
    bus: Bus
    edge: Edge
    clock: Clock
    registry: CollectorRegistry
    readiness: Readiness
    http_port: int
    routes: HttpRoutes = field(default_factory=HttpRoutes)
    """Extra GET endpoints the body serves on ``http_port`` beside /healthz, /readyz, /metrics."""


Body = Callable[[ServiceContext], Coroutine[Any, Any, None]]


async def _connect_until_stopped(
    connect: Connect, url: str, name: str, stop: asyncio.Event, clock: Clock
) -> Bus | None:
    delay = 0.5
    while not stop.is_set():
        attempt = asyncio.create_task(connect(url, name))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({attempt, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not attempt.done():  # a stop arrived while connecting: give up the attempt
            attempt.cancel()
            with contextlib.suppress(BaseException):
                await attempt
            return None
        try:
            return attempt.result()
        except Exception as error:  # any failure to reach the server is retried
            log.warning(
                "cannot reach NATS yet; retrying",
                extra={"url": url, "error": f"{type(error).__name__}: {error}", "retry_s": delay},
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)
        delay = min(delay * 2, 10.0)
    return None


async def run_service(
    *,
    name: str,
    settings: Settings,
    body: Body,
    clock: Clock | None = None,
    connect: Connect = connect_nats,
    stop: asyncio.Event | None = None,
    registry: CollectorRegistry | None = None,
    readiness: Readiness | None = None,
) -> int:
    """Run ``body`` until it returns, fails, or a signal (or ``stop``) ends it; return exit code."""
    configure_logging(service=name, level=settings.log_level, fmt=settings.log_format)
    clock = clock or SystemClock()
    stop = stop or asyncio.Event()
    registry = registry or CollectorRegistry()
    readiness = readiness or Readiness()
    readiness.set("nats", False, "connecting")

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    routes = HttpRoutes()
    health = HealthServer(readiness=readiness, registry=registry, service=name, routes=routes)
    port = await health.start(settings.http_host, settings.http_port)
    readiness.http_port = port
    log.info("service starting", extra={"http_port": port, "nats_url": settings.nats_url})

    bus: Bus | None = None
    failed = False
    try:
        bus = await _connect_until_stopped(
            connect, settings.nats_url, f"tessera-{name}", stop, clock
        )
        if bus is None:
            return 0
        connected_bus = bus
        readiness.probe(
            "nats",
            lambda: (
                connected_bus.connected,
                "" if connected_bus.connected else "disconnected; reconnecting",
            ),
        )
        context = ServiceContext(
            name=name,
            bus=bus,
            edge=Edge(bus=bus, metrics=EdgeMetrics.create(registry), clock=clock, service=name),
            clock=clock,
            registry=registry,
            readiness=readiness,
            http_port=port,
            routes=routes,
        )
        failed = await _run_body(body, context, stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if bus is not None:
            await bus.drain()
        await health.stop()
        log.info("service stopped")
    return 1 if failed else 0


async def _run_body(
    body: Body, context: ServiceContext, stop: asyncio.Event, grace_s: float = 10.0
) -> bool:
    """Run the body in a TaskGroup beside a stop watcher; True when the body failed."""
    failed = False
    try:
        async with asyncio.TaskGroup() as group:
            work = group.create_task(body(context), name=f"{context.name}-body")
            watcher = group.create_task(
                _cancel_when_stopped(work, stop, grace_s), name=f"{context.name}-stop"
            )
            work.add_done_callback(lambda _: watcher.cancel())
    except* Exception as errors:
        for error in errors.exceptions:
            log.error("service failed", exc_info=error)
        failed = True
    return failed


class StopTimeoutError(Exception):
    """The body did not finish within the grace period after a stop was asked."""


async def _cancel_when_stopped(
    work: asyncio.Task[None], stop: asyncio.Event, grace_s: float
) -> None:
    """Cancel ``work`` once ``stop`` is set, and keep cancelling until it has finished.

    One cancel is not always enough on Python 3.11: a library's internal ``asyncio.wait_for``
    that completes at the same moment swallows the cancellation, and the body runs on.
    """
    await stop.wait()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while not work.done():
        if loop.time() > deadline:
            raise StopTimeoutError(f"service body still running {grace_s:.0f} s after stop")
        work.cancel()
        await asyncio.wait({work}, timeout=0.1)
