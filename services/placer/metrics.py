"""The placer's Prometheus metrics (one registry per process, passed in)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)


@dataclass(frozen=True)
class PlacerMetrics:
    decisions: Counter
    tries: Counter
    latency: Histogram
    conflicts: Counter
    retries: Counter
    commit_failures: Counter
    queue_depth: Gauge
    pending: Gauge
    releases: Counter
    repairs: Counter
    purged: Counter
    nodes: Gauge
    tenancy_reloads: Counter
    profile_builds: Counter
    waiting_scans: Counter
    restores: Counter
    unknown_outcomes: Counter
    extender_requests: Counter
    extender_seconds: Histogram
    extender_judgements: Counter
    extender_background_judgements: Counter
    placed_ahead: Counter
    pools_held: Gauge
    pool_fallbacks: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> PlacerMetrics:
        return cls(
            decisions=Counter(
                "tessera_placer_decisions_total",
                "Pods decided, by outcome: placed, rejected (waits), unresolvable, duplicate "
                "(already placed: the decision was published again).",
                ["outcome"],
                registry=registry,
            ),
            tries=Counter(
                "tessera_placer_tries_total",
                "Times a pod was decided: first tries, retries after a conflict, and waiting "
                "pods tried again after a change.",
                registry=registry,
            ),
            latency=Histogram(
                "tessera_placer_decision_seconds",
                "Pod message received to decision (or rejection) published.",
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            conflicts=Counter(
                "tessera_placer_commit_conflicts_total",
                "Compare-and-set or create-only writes another writer won, by KV entry kind.",
                ["entry"],
                registry=registry,
            ),
            retries=Counter(
                "tessera_placer_commit_retries_total",
                "Pods decided again after their node changed under the commit.",
                registry=registry,
            ),
            commit_failures=Counter(
                "tessera_placer_commit_failures_total",
                "Pods whose commit gave up (retries exhausted or NATS failed); tried again later.",
                ["cause"],
                registry=registry,
            ),
            queue_depth=Gauge(
                "tessera_placer_queue_depth",
                "Pods this replica holds: being decided or committed, and waiting to fit.",
                ["stage"],
                registry=registry,
            ),
            pending=Gauge(
                "tessera_placer_pending_pods",
                "Pods waiting to fit in this replica, by their most common reason.",
                ["reason"],
                registry=registry,
            ),
            releases=Counter(
                "tessera_placer_releases_total",
                "Placements given back, by cause: deleted, gone, failed, timeout.",
                ["cause"],
                registry=registry,
            ),
            repairs=Counter(
                "tessera_placer_repairs_total",
                "Half-done commits and releases repaired by reconciliation, by kind.",
                ["kind"],
                registry=registry,
            ),
            purged=Counter(
                "tessera_placer_purged_total",
                "Released records and deleted-pod claims removed after the retention period.",
                ["entry"],
                registry=registry,
            ),
            pools_held=Gauge(
                "tessera_placer_pools_held",
                "Node pools this replica holds (--pools above 1).",
                registry=registry,
            ),
            pool_fallbacks=Counter(
                "tessera_placer_pool_fallbacks_total",
                "Pods that fit on none of this replica's own pools' nodes and were decided on "
                "every node (--pools above 1).",
                registry=registry,
            ),
            nodes=Gauge(
                "tessera_placer_nodes",
                "Nodes in view: placeable, or not placeable by reason.",
                ["state"],
                registry=registry,
            ),
            tenancy_reloads=Counter(
                "tessera_placer_tenancy_reloads_total",
                "Tenancy file versions applied or refused.",
                ["outcome"],
                registry=registry,
            ),
            restores=Counter(
                "tessera_placer_restores_total",
                "Placements of bound pods restored from the Kubernetes API into a store that "
                "lost them, by outcome.",
                ["outcome"],
                registry=registry,
            ),
            waiting_scans=Counter(
                "tessera_placer_waiting_scans_total",
                "Passes over the waiting pods (each puts back those that may fit now).",
                registry=registry,
            ),
            profile_builds=Counter(
                "tessera_placer_profile_builds_total",
                "Profile compilations (at start and when the learned task mix moved).",
                registry=registry,
            ),
            unknown_outcomes=Counter(
                "tessera_placer_unknown_write_outcomes_total",
                "KV writes that failed without an answer (timeout) and were read back.",
                ["entry"],
                registry=registry,
            ),
            extender_requests=Counter(
                "tessera_placer_extender_requests_total",
                "kube-scheduler extender calls answered, by verb (filter, prioritize, bind) and "
                "outcome (ok, bound, refused, timeout, bad_request, not_ready, error).",
                ["verb", "outcome"],
                registry=registry,
            ),
            extender_seconds=Histogram(
                "tessera_placer_extender_seconds",
                "Time to answer a kube-scheduler extender call, by verb (bind: until the binder "
                "bound the pod).",
                ["verb"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            extender_judgements=Counter(
                "tessera_placer_extender_judgements_total",
                "Extender filter and prioritize calls for Tessera pods, by verb and by where the "
                "judgements came from: ready (judged before, in the background or by an earlier "
                "call, on every candidate's node shape) or judged (some shapes judged during the "
                "call: a request not seen before, or shapes that changed since).",
                ["verb", "source"],
                registry=registry,
            ),
            extender_background_judgements=Counter(
                "tessera_placer_extender_background_judgements_total",
                "(request, node shape) judgements the extender made in the background, ahead of "
                "kube-scheduler's calls.",
                registry=registry,
            ),
            placed_ahead=Counter(
                "tessera_placer_placed_ahead_total",
                "Waiting pods placed before a lower-ordered pod that was about to commit (seed "
                "002's order across replicas), by who held the waiting pod: here or another "
                "replica.",
                ["holder"],
                registry=registry,
            ),
        )
