"""Prometheus metrics: one registry per service process, passed down (never the global one)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter


@dataclass(frozen=True)
class EdgeMetrics:
    """Counters of what arrived at a service's edge and what it rejected."""

    received: Counter
    rejected: Counter
    deadlettered: Counter

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
        )
