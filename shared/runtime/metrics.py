"""Prometheus metrics: one registry per service process, passed down (never the global one).

Every service's registry also carries, through :func:`register_runtime_metrics`, the process
metrics (CPU, memory, open files, GC) and the NATS connection's state and counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.runtime.bus import ConnectionStatus

NATS_STATES = ("connecting", "connected", "reconnecting", "authorization failed", "closed")


@dataclass(frozen=True)
class EdgeMetrics:
    """Counters of what arrived at a service's edge, what it rejected, and dead letters."""

    received: Counter
    rejected: Counter
    deadlettered: Counter
    deadletter_failures: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> EdgeMetrics:
        return cls(
            received=Counter(
                "tessera_messages_received_total",
                "Messages received, by subject family.",
                ["family"],
                registry=registry,
            ),
            rejected=Counter(
                "tessera_messages_rejected_total",
                "Messages rejected at the edge, by subject family and kind of fault.",
                ["family", "kind"],
                registry=registry,
            ),
            deadlettered=Counter(
                "tessera_deadletters_published_total",
                "Rejected messages republished to tessera.deadletter.<family>.",
                ["family"],
                registry=registry,
            ),
            deadletter_failures=Counter(
                "tessera_deadletters_failed_total",
                "Rejected messages whose dead letter could not be published (still counted as "
                "rejected; the service goes on).",
                ["family"],
                registry=registry,
            ),
        )


class NatsCollector(Collector):
    """The NATS connection, read at each scrape from ``status`` (None while connecting)."""

    def __init__(self, status: Callable[[], ConnectionStatus | None]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        state = status.state if status is not None else "connecting"
        connected = GaugeMetricFamily(
            "tessera_nats_connected", "1 while the NATS connection is up, else 0."
        )
        connected.add_metric([], 1.0 if state == "connected" else 0.0)
        yield connected
        states = GaugeMetricFamily(
            "tessera_nats_connection_state",
            "1 for the NATS connection's current state.",
            labels=["state"],
        )
        for name in NATS_STATES:
            states.add_metric([name], 1.0 if name == state else 0.0)
        yield states
        for name, documentation, value in (
            ("tessera_nats_disconnects", "Times the NATS connection was lost.", "disconnects"),
            ("tessera_nats_reconnects", "Times the NATS connection came back.", "reconnects"),
            (
                "tessera_nats_authorization_failures",
                "NATS connection attempts refused for their credentials or TLS.",
                "authorization_failures",
            ),
        ):
            counter = CounterMetricFamily(name, documentation)
            counter.add_metric([], float(getattr(status, value)) if status is not None else 0.0)
            yield counter


def register_runtime_metrics(
    registry: CollectorRegistry, status: Callable[[], ConnectionStatus | None] | None
) -> None:
    """Process (CPU, memory, file descriptors), Python GC and platform metrics, and the NATS
    connection (``status``; None for a process that uses no NATS), on the service's registry."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    if status is not None:
        registry.register(NatsCollector(status))


LOOP_LAG_INTERVAL_S = 0.25
"""How often the event loop's lag is sampled: a stop of the loop longer than this is always
seen; a shorter one is caught in proportion to its length."""


def loop_lag_histogram(registry: CollectorRegistry) -> Histogram:
    """``tessera_event_loop_lag_seconds`` on ``registry`` (see :class:`LoopLag`)."""
    return Histogram(
        "tessera_event_loop_lag_seconds",
        "How much later than due the event loop ran a timer (sampled every "
        f"{LOOP_LAG_INTERVAL_S:g} s): how long everything in the service was held up then.",
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        registry=registry,
    )


class LoopLag:
    """Samples the event loop's lag into every histogram added: every interval it sleeps and
    observes how much later than asked the loop woke it. Every message, timer and request of a
    service waits while its loop is stopped (a full garbage collection, a long computation), so
    this is how long any of them was held up. The loop's own clock measures it, whatever clock
    the service's logic runs on. The services one process hosts (``tessera.up.agents``) share
    its loop, so one sampler serves them all: 200 hosted services would otherwise wake the loop
    800 times a second to measure the same thing."""

    def __init__(self, *, interval_s: float = LOOP_LAG_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._histograms: list[Histogram] = []

    def add(self, lag: Histogram) -> None:
        self._histograms.append(lag)

    def discard(self, lag: Histogram) -> None:
        if lag in self._histograms:
            self._histograms.remove(lag)

    async def run(self) -> None:
        """Forever: sleep the interval and observe how much later than asked the loop woke."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self._interval_s
            await asyncio.sleep(self._interval_s)
            late = max(0.0, loop.time() - due)
            for lag in self._histograms:
                lag.observe(late)
