"""The webhook's one NATS job: follow the inventories into a :class:`ClusterGpus`, read-only.

Admission never waits on it. Until NATS answers and every inventory has been read, the webhook
judges nothing against the cluster (it still refuses what ``shared.podspec`` refuses); when the
watch breaks, it is opened again (every value delivered anew) on the same connection, which
reconnects by itself. An inventory that does not decode or is not believed is ignored with a log
line and counted; the node keeps what it had.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.webhook.capacity import ClusterGpus
from shared import subjects
from shared.config import NatsSecurity, Settings, redact_url
from shared.runtime.bus import Bus
from shared.runtime.lifecycle import bus_identity, connect_nats
from shared.runtime.nats import NatsRefusedError, unreachable_reason

log = logging.getLogger(__name__)

ROLE: Final = "webhook"
RETRY_S: Final = 2.0
"""After a failed connection or a broken watch, how long before trying again."""


@dataclass(frozen=True)
class InventoryMetrics:
    nodes: Gauge
    ignored: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> InventoryMetrics:
        return cls(
            nodes=Gauge(
                "tessera_webhook_cluster_nodes",
                "Nodes whose GPUs the webhook knows from their inventories (0: it judges no pod "
                "against the cluster, only against what any cluster could hold).",
                registry=registry,
            ),
            ignored=Counter(
                "tessera_webhook_inventories_ignored_total",
                "Inventory entries the webhook ignored: not decodable or not believable.",
                registry=registry,
            ),
        )


async def follow_inventories(
    settings: Settings,
    security: NatsSecurity,
    cluster: ClusterGpus,
    metrics: InventoryMetrics,
) -> None:
    """Keep ``cluster`` up to date from NATS until cancelled (see the module docstring)."""
    bus: Bus | None = None
    try:
        while bus is None:
            try:
                bus = await connect_nats(
                    settings.nats_url,
                    "tessera-webhook",
                    security,
                    replicas=settings.nats_replicas,
                    identity=bus_identity(ROLE, settings),
                )
            except NatsRefusedError as error:
                log.error(
                    "NATS refused the webhook's credentials; it judges no pod against the "
                    "cluster until they are fixed",
                    extra={"url": redact_url(settings.nats_url), "error": str(error)},
                )
                await asyncio.sleep(RETRY_S * 15)
            except Exception as error:  # unreachable: admission goes on without the cluster
                log.warning(
                    "cannot reach NATS for the inventories; retrying",
                    extra={"cause": unreachable_reason(error, settings.nats_url)},
                )
                await asyncio.sleep(RETRY_S)
        log.info("following the inventories", extra={"url": redact_url(settings.nats_url)})
        while True:
            try:
                await _watch(bus, cluster, metrics)
            except Exception as error:  # NATS trouble: watch again, every value anew
                log.warning(
                    "the inventory watch broke; watching again",
                    extra={"error": f"{type(error).__name__}: {error}"},
                )
            cluster.restart()
            metrics.nodes.set(0)
            await asyncio.sleep(RETRY_S)
    finally:
        if bus is not None:
            with contextlib.suppress(Exception):
                await bus.drain()


async def _watch(bus: Bus, cluster: ClusterGpus, metrics: InventoryMetrics) -> None:
    watch = bus.kv_watch(subjects.KV_INVENTORY)
    try:
        async for entry in watch:
            if entry is None:
                cluster.synced = True
                log.info("the cluster's GPUs are known", extra={"nodes": len(cluster)})
            else:
                problem = cluster.apply(
                    entry.key, None if entry.deleted else entry.value, now=time.time()
                )
                if problem:
                    metrics.ignored.inc()
                    log.warning("inventory ignored", extra={"reason": problem})
            metrics.nodes.set(len(cluster) if cluster.synced else 0)
    finally:
        await watch.aclose()
