"""Run the dashboard: serve HTTP at once, connect to NATS, feed the live view, stop cleanly.

The order follows ``shared.runtime.lifecycle.run_service`` (logging, HTTP, then the bus with
retries, then the work; SIGTERM/SIGINT drain the bus and stop HTTP), with one difference that is
the reason this module exists: the dashboard's own routes are served on the same port as
``/healthz``, ``/readyz`` and ``/metrics``, so an operator opens one URL and a probe checks it.
``run_service`` builds its health server itself and cannot take extra routes.

The page answers before NATS is reachable and says what it is waiting for; ``/readyz`` is 503
until NATS is connected and every KV bucket has delivered its initial values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from prometheus_client import CollectorRegistry

from services.dashboard.core.views import ViewPolicy
from services.dashboard.feed import Feed
from services.dashboard.live import LiveMetrics, LiveView
from services.dashboard.settings import DashboardSettings
from services.dashboard.web import DashboardServer
from shared.clock import Clock, SystemClock
from shared.runtime.bus import Bus
from shared.runtime.edge import Edge
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import Connect, connect_nats
from shared.runtime.logs import configure_logging
from shared.runtime.metrics import EdgeMetrics

log = logging.getLogger(__name__)

NAME = "dashboard"
STOP_GRACE_S = 10.0


async def _connect(connect: Connect, url: str, clock: Clock) -> Bus:
    """Connect, retrying with a back-off until it works (the caller cancels on stop)."""
    delay = 0.5
    while True:
        try:
            return await connect(url, f"tessera-{NAME}")
        except Exception as error:  # any failure to reach the server is retried
            log.warning(
                "cannot reach NATS yet; retrying",
                extra={"url": url, "error": f"{type(error).__name__}: {error}", "retry_s": delay},
            )
        await clock.sleep(delay)
        delay = min(delay * 2, 10.0)


async def _serve(
    *,
    settings: DashboardSettings,
    live: LiveView,
    readiness: Readiness,
    registry: CollectorRegistry,
    clock: Clock,
    connect: Connect,
    buses: list[Bus],
) -> None:
    bus = await _connect(connect, settings.nats_url, clock)
    buses.append(bus)
    live.connected = lambda: bus.connected
    readiness.probe(
        "nats", lambda: (bus.connected, "" if bus.connected else "disconnected; reconnecting")
    )
    readiness.probe(
        "views",
        lambda: (live.synced, "" if live.synced else live.waiting_for()),
    )
    feed = Feed(
        bus=bus,
        edge=Edge(bus=bus, metrics=EdgeMetrics.create(registry), clock=clock, service=NAME),
        clock=clock,
        sink=live.apply,
        synced=live.mark_synced,
    )
    await feed.subscribe()
    async with asyncio.TaskGroup() as group:
        group.create_task(live.run(), name="dashboard-push")
        group.create_task(feed.run(), name="dashboard-feed")


async def _stop(work: asyncio.Task[None]) -> None:
    """Cancel ``work`` until it has finished: on Python 3.11 one cancel can be swallowed by a
    library's ``wait_for`` that completes at the same moment."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_GRACE_S
    while not work.done() and loop.time() < deadline:
        work.cancel()
        await asyncio.wait({work}, timeout=0.1)


async def run_dashboard(
    settings: DashboardSettings,
    *,
    clock: Clock | None = None,
    connect: Connect = connect_nats,
    stop: asyncio.Event | None = None,
    registry: CollectorRegistry | None = None,
    readiness: Readiness | None = None,
) -> int:
    """Serve the dashboard until a signal (or ``stop``); the exit code (1 when it failed).

    ``readiness.http_port`` tells where it listens once HTTP is up (for tests).
    """
    configure_logging(service=NAME, level=settings.log_level, fmt=settings.log_format)
    clock = clock or SystemClock()
    stop = stop or asyncio.Event()
    registry = registry or CollectorRegistry()
    readiness = readiness or Readiness()
    readiness.set("nats", False, "connecting")
    live = LiveView(
        clock=clock,
        policy=ViewPolicy(
            inventory_stale_s=settings.inventory_stale_s, stats_stale_s=settings.stats_stale_s
        ),
        push_interval_s=settings.push_interval_s,
        pending_limit=settings.pending_rows,
        metrics=LiveMetrics.create(registry),
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = DashboardServer(live=live, readiness=readiness, registry=registry)
    port = await server.start(settings.http_host, settings.http_port)
    readiness.http_port = port
    log.info(
        "service starting",
        extra={"http_port": port, "nats_url": settings.nats_url, "url": page_url(settings, port)},
    )
    buses: list[Bus] = []
    failed = False
    work = asyncio.create_task(
        _serve(
            settings=settings,
            live=live,
            readiness=readiness,
            registry=registry,
            clock=clock,
            connect=connect,
            buses=buses,
        ),
        name="dashboard",
    )
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            failed = True  # the work never ends by itself
            with contextlib.suppress(asyncio.CancelledError):
                error = work.exception()
                log.error("service failed", exc_info=error)
        await _stop(work)
        if not work.done():
            log.error("dashboard still running %.0f s after stop", STOP_GRACE_S)
            failed = True
    finally:
        stopped.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        live.close()
        for bus in buses:
            await bus.drain()
        await server.stop()
        log.info("service stopped")
    return 1 if failed else 0


def page_url(settings: DashboardSettings, port: int) -> str:
    """Where to open the page (a wildcard listen address is shown as localhost)."""
    host = settings.http_host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"
