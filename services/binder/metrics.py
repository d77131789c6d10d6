"""Prometheus metrics of the binder (registered on the service's own registry, at ``/metrics``)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class BinderMetrics:
    """Binds by outcome and their latency, API errors, watch restarts, leadership, and the
    traffic the binder publishes and explains."""

    binds: Counter
    bind_seconds: Histogram
    api_errors: Counter
    watch_restarts: Counter
    leader: Gauge
    gate_waits: Counter
    gate_ignored: Counter
    records_withdrawn: Counter
    records_settled: Counter
    records_kept: Gauge
    pods_published: Counter
    publish_failures: Counter
    invalid_pods: Counter
    explained: Counter
    node_facts: Counter
    node_facts_deferred: Counter
    events: Counter
    restores: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> BinderMetrics:
        return cls(
            binds=Counter(
                "tessera_binder_binds_total",
                "Placements handled, by outcome (bound, failed, gone, dropped).",
                ["outcome"],
                registry=registry,
            ),
            bind_seconds=Histogram(
                "tessera_binder_bind_latency_seconds",
                "From the placer's decision to the pod bound (Binding created, record bound).",
                buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0),
                registry=registry,
            ),
            api_errors=Counter(
                "tessera_binder_api_errors_total",
                "Kubernetes API calls that failed, by verb and HTTP code (or timeout/connection).",
                ["verb", "code"],
                registry=registry,
            ),
            watch_restarts=Counter(
                "tessera_binder_watch_restarts_total",
                "Watches started again, by resource and reason (closed, expired = 410 re-list, "
                "error).",
                ["resource", "reason"],
                registry=registry,
            ),
            leader=Gauge(
                "tessera_binder_leader",
                "1 while this binder holds the leader lease and writes, else 0.",
                registry=registry,
            ),
            gate_waits=Counter(
                "tessera_binder_gate_waits_total",
                "Binds held back by the ambiguity gate, by how the wait ended.",
                ["outcome"],
                registry=registry,
            ),
            gate_ignored=Counter(
                "tessera_binder_gate_ignored_total",
                "Bound records the ambiguity gate did not wait for: they match no booking in "
                "their node's ledger (a device plugin would not grant them either).",
                registry=registry,
            ),
            records_withdrawn=Counter(
                "tessera_binder_records_withdrawn_total",
                "Bound records the binder released because their pod ended before its GPUs were "
                "allocated (rejected at admission, or deleted once bound).",
                registry=registry,
            ),
            records_settled=Counter(
                "tessera_binder_records_settled_total",
                "Bound records the binder marked allocated because the kubelet admitted their pod "
                "while a device plugin served it from another record with the same slices, one "
                "whose pod ended first.",
                registry=registry,
            ),
            records_kept=Gauge(
                "tessera_binder_records_kept",
                "Bound records of pods that ended, or were admitted with another record's "
                "slices, kept bound because a waiting pod with the same slices on their node may "
                "still need them (an ended pod's PodDeleted waits with its record). Counted again "
                "on each admission or end on the node, and every 2 s.",
                registry=registry,
            ),
            pods_published=Counter(
                "tessera_binder_pods_published_total",
                "Pod messages published to the placer, by kind (pending, deleted).",
                ["kind"],
                registry=registry,
            ),
            publish_failures=Counter(
                "tessera_binder_publish_failures_total",
                "Pod messages NATS did not take (not connected, or JetStream refusing to store "
                "them: a stream full or gone, JetStream off), by kind (pending, deleted); each is "
                "tried again, and a pending pod says so in its PodScheduled condition.",
                ["kind"],
                registry=registry,
            ),
            invalid_pods=Counter(
                "tessera_binder_invalid_pods_total",
                "Tessera pods whose request is invalid (explained on the pod, never published).",
                registry=registry,
            ),
            explained=Counter(
                "tessera_binder_pending_explained_total",
                "PodScheduled=False conditions written, by cause (rejected, invalid, gated, "
                "not-queued: NATS did not store the pod's placement request).",
                ["cause"],
                registry=registry,
            ),
            node_facts=Counter(
                "tessera_binder_node_facts_published_total",
                "NodeFacts published (on change).",
                registry=registry,
            ),
            node_facts_deferred=Counter(
                "tessera_binder_node_facts_deferred_total",
                "Times a node's facts were held back because only Tessera's own pods changed "
                "them (published at the node's next refresh, or with its next other change).",
                registry=registry,
            ),
            restores=Counter(
                "tessera_binder_restores_total",
                "Bound pods' placements restored into a NATS store that lost them (restored), "
                "or that could not be (refused: an unreadable or inconsistent annotation), and "
                "what checking them against the device plugins found: corrected (restored as "
                "the plugin granted, not as annotated), overcommit (not booked: it would "
                "over-commit a GPU the plugin did not grant it), overfull (booked on an "
                "over-full GPU: the plugin did not answer).",
                ["outcome"],
                registry=registry,
            ),
            events=Counter(
                "tessera_binder_events_total",
                "Kubernetes Events by outcome (created, series, dropped, failed).",
                ["outcome"],
                registry=registry,
            ),
        )

    def api_error(self, verb: str, code: str) -> None:
        self.api_errors.labels(verb=verb, code=code).inc()
