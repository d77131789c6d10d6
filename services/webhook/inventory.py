"""The webhook's NATS jobs, read-only: follow the inventories into a :class:`ClusterGpus` and
the claims' device classes into a :class:`~.claimindex.ClaimIndex`.

Admission never waits on NATS (only, briefly, for a claim name the index does not know yet:
``server.py``). Until NATS answers and every inventory has been read, the webhook judges nothing
against the cluster (it still refuses what ``shared.podspec`` refuses); when a watch breaks, it
is opened again (every value delivered anew) on the same connection, which reconnects by itself.
An entry that does not decode or is not believed is ignored with a log line and counted; the node
(or the claim) keeps what it had.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.webhook.capacity import ClusterGpus
from services.webhook.claimindex import ClaimIndex, watch_claim_classes
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
    claim_classes: Gauge

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
                "Inventory and claim-class entries the webhook ignored: not decodable or not "
                "believable.",
                registry=registry,
            ),
            claim_classes=Gauge(
                "tessera_webhook_claim_classes",
                "ResourceClaims and ResourceClaimTemplates whose device classes the webhook "
                "knows (0 until the binder has listed them all).",
                registry=registry,
            ),
        )


async def follow_nats(
    settings: Settings,
    security: NatsSecurity,
    cluster: ClusterGpus,
    index: ClaimIndex,
    metrics: InventoryMetrics,
) -> None:
    """Keep ``cluster`` and ``index`` up to date from NATS until cancelled (see the module
    docstring)."""
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
        connected = bus

        def ignored(problem: str) -> None:
            metrics.ignored.inc()
            log.warning("claim classes ignored", extra={"reason": problem})

        def inventories_again() -> None:
            cluster.restart()
            metrics.nodes.set(0)

        def claim_classes_again() -> None:
            index.restart()
            metrics.claim_classes.set(0)

        async with asyncio.TaskGroup() as group:
            group.create_task(
                _rewatch(
                    "inventory", lambda: _watch(connected, cluster, metrics), inventories_again
                )
            )
            group.create_task(
                _rewatch(
                    "claim-class",
                    lambda: watch_claim_classes(
                        connected, index, ignored, count=metrics.claim_classes.set
                    ),
                    claim_classes_again,
                )
            )
    finally:
        if bus is not None:
            with contextlib.suppress(Exception):
                await bus.drain()


async def _rewatch(
    what: str, watch: Callable[[], Awaitable[None]], restart: Callable[[], None]
) -> None:
    """Run ``watch`` again and again: when it breaks, ``restart`` (every value comes anew)."""
    while True:
        try:
            await watch()
        except Exception as error:  # NATS trouble: watch again, every value anew
            log.warning(
                f"the {what} watch broke; watching again",
                extra={"error": f"{type(error).__name__}: {error}"},
            )
        restart()
        await asyncio.sleep(RETRY_S)


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
