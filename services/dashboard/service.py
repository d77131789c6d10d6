"""Run the dashboard: the shared service runtime with the page and API on the health port.

``run_service`` does what it does for every service (logging, HTTP at once, NATS with retries,
SIGTERM/SIGINT drain the bus and stop HTTP); the dashboard's routes are handed to it before it
starts, so the page answers before NATS is reachable and says what it is waiting for. Its
``/metrics`` carries the allocation metrics (``metrics.py``). The body
feeds the live view from NATS. ``/readyz`` is 503 until NATS is connected and every KV bucket has
delivered its initial values.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry

from services.dashboard.core.views import ViewPolicy
from services.dashboard.feed import Feed
from services.dashboard.live import LiveMetrics, LiveView
from services.dashboard.metrics import AllocationCollector
from services.dashboard.settings import DashboardSettings
from services.dashboard.web import DashboardRoutes
from shared.clock import Clock, SystemClock
from shared.runtime.health import HttpRoutes, Readiness
from shared.runtime.lifecycle import Connect, ServiceContext, run_service

log = logging.getLogger(__name__)

NAME = "dashboard"


async def run_dashboard(
    settings: DashboardSettings,
    *,
    clock: Clock | None = None,
    connect: Connect | None = None,
    stop: asyncio.Event | None = None,
    registry: CollectorRegistry | None = None,
    readiness: Readiness | None = None,
) -> int:
    """Serve the dashboard until a signal (or ``stop``); the exit code (1 when it failed).

    ``readiness.http_port`` tells where it listens once HTTP is up (for tests).
    """
    clock = clock or SystemClock()
    registry = registry or CollectorRegistry()
    readiness = readiness or Readiness()
    live = LiveView(
        clock=clock,
        policy=ViewPolicy(
            inventory_stale_s=settings.inventory_stale_s, stats_stale_s=settings.stats_stale_s
        ),
        push_interval_s=settings.push_interval_s,
        pending_limit=settings.pending_rows,
        metrics=LiveMetrics.create(registry),
    )
    readiness.probe("views", lambda: (live.synced, "" if live.synced else live.waiting_for()))
    registry.register(AllocationCollector(live, clock.now))
    routes = HttpRoutes()
    DashboardRoutes(live=live).install(routes)

    async def body(context: ServiceContext) -> None:
        bus = context.bus
        live.connected = lambda: bus.connected
        log.info("dashboard page", extra={"url": page_url(settings, context.http_port)})
        feed = Feed(
            bus=bus, edge=context.edge, clock=clock, sink=live.apply, synced=live.mark_synced
        )
        try:
            await feed.subscribe()
            async with asyncio.TaskGroup() as group:
                group.create_task(live.run(), name="dashboard-push")
                group.create_task(feed.run(), name="dashboard-feed")
        finally:
            live.close()  # open event streams end, so the HTTP server can stop

    return await run_service(
        name=NAME,
        settings=settings,
        body=body,
        clock=clock,
        connect=connect,
        stop=stop,
        registry=registry,
        readiness=readiness,
        routes=routes,
    )


def page_url(settings: DashboardSettings, port: int) -> str:
    """Where to open the page (a wildcard listen address is shown as localhost)."""
    host = settings.http_host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"
