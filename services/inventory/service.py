"""The inventory's async shell: read the GPUs, fold in health events, publish what the core decides.

Two loops run side by side in one TaskGroup:

* the **poll loop** reads every GPU through the :class:`~services.inventory.reader.GpuReader`
  every ``poll_interval_s`` (time from the Clock port, so tests drive it with a fake clock);
* the **event loop** waits for health events (XID, ECC) and applies them at once, so a GPU that
  fails is published unhealthy without waiting for the next poll.

Both hand their input to the pure core (``services.inventory.snapshot``) under one lock and carry
out its decision: publish the :class:`~shared.messages.inventory.NodeInventory` on
``tessera.inventory.<node>`` (core NATS: telemetry is latest-wins) and put it in the inventory KV
bucket under the node's key, where a placer that starts later finds it. Readiness follows the
reader: ``/readyz`` says 503 with the reason while the GPUs cannot be read.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.inventory import snapshot
from services.inventory.reader import GpuReader, HealthEvent, NodeReadError
from shared import codec, subjects
from shared.clock import Clock
from shared.messages.inventory import NodeInventory
from shared.runtime.bus import Bus
from shared.runtime.health import Readiness

log = logging.getLogger(__name__)

READINESS_CHECK = "gpus"
HEALTH_STATES = ("healthy", "unhealthy", "gone")


@dataclass(frozen=True)
class InventoryMetrics:
    """Per-GPU gauges and the inventory's counters, on the service's own registry."""

    memory_used_mib: Gauge
    memory_total_mib: Gauge
    utilization_pct: Gauge
    temperature_c: Gauge
    power_w: Gauge
    health: Gauge
    events: Counter
    publications: Counter
    read_failures: Counter
    publish_failures: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> InventoryMetrics:
        gpu = ["uuid", "index", "model"]
        return cls(
            memory_used_mib=Gauge(
                "tessera_gpu_memory_used_mib", "GPU memory in use (MiB).", gpu, registry=registry
            ),
            memory_total_mib=Gauge(
                "tessera_gpu_memory_total_mib", "GPU memory in all (MiB).", gpu, registry=registry
            ),
            utilization_pct=Gauge(
                "tessera_gpu_utilization_percent",
                "GPU compute utilisation (%).",
                gpu,
                registry=registry,
            ),
            temperature_c=Gauge(
                "tessera_gpu_temperature_celsius", "GPU temperature (C).", gpu, registry=registry
            ),
            power_w=Gauge("tessera_gpu_power_watts", "GPU power draw (W).", gpu, registry=registry),
            health=Gauge(
                "tessera_gpu_health",
                "1 for the GPU's current health state (healthy, unhealthy, gone).",
                [*gpu, "state"],
                registry=registry,
            ),
            events=Counter(
                "tessera_gpu_health_events_total",
                "Health events from the GPU backend, by kind, code and whether they "
                "marked the GPU unhealthy.",
                ["kind", "code", "outcome"],
                registry=registry,
            ),
            publications=Counter(
                "tessera_inventory_publications_total",
                "Inventory snapshots published, by reason.",
                ["reason"],
                registry=registry,
            ),
            read_failures=Counter(
                "tessera_inventory_read_failures_total",
                "Reads of the node's GPUs that failed as a whole.",
                registry=registry,
            ),
            publish_failures=Counter(
                "tessera_inventory_publish_failures_total",
                "Snapshots that could not be sent to NATS (retried at the next poll).",
                registry=registry,
            ),
        )

    _children: dict[tuple[str, str, str], tuple[Gauge, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )
    """Each GPU's gauges by its labels: looking a labelled child up costs more than setting it,
    and every poll sets eight per GPU (a quarter of an idle node's CPU went there)."""

    def show(self, inventory: NodeInventory) -> None:
        """Set every GPU's gauges from ``inventory``."""
        for gpu in inventory.gpus:
            labels = (gpu.uuid, str(gpu.index), gpu.model)
            children = self._children.get(labels)
            if children is None:
                children = self._children[labels] = (
                    self.memory_used_mib.labels(*labels),
                    self.memory_total_mib.labels(*labels),
                    self.utilization_pct.labels(*labels),
                    self.temperature_c.labels(*labels),
                    self.power_w.labels(*labels),
                    *(self.health.labels(*labels, state) for state in HEALTH_STATES),
                )
            used, total, utilization, temperature, power, *health = children
            used.set(gpu.memory_used_mib)
            total.set(gpu.memory_total_mib)
            utilization.set(gpu.utilization_pct)
            temperature.set(gpu.temperature_c)
            power.set(gpu.power_w)
            for state, gauge in zip(HEALTH_STATES, health, strict=True):
                gauge.set(1 if gpu.health == state else 0)


class InventoryService:
    """Runs the poll and event loops for one node."""

    def __init__(
        self,
        *,
        reader: GpuReader,
        bus: Bus,
        clock: Clock,
        node: str,
        policy: snapshot.Policy,
        poll_interval_s: float,
        event_wait_timeout_s: float,
        metrics: InventoryMetrics,
        readiness: Readiness,
        producer: str = "",
    ) -> None:
        self._reader = reader
        self._producer = producer
        self._bus = bus
        self._clock = clock
        self._node = node
        self._policy = policy
        self._poll_interval_s = poll_interval_s
        self._event_wait_timeout_s = event_wait_timeout_s
        self._metrics = metrics
        self._readiness = readiness
        self._state = snapshot.InventoryState()
        self._lock = asyncio.Lock()
        self._subject = subjects.inventory(node)
        self._key = subjects.node_token(node)
        readiness.set(READINESS_CHECK, False, "GPUs not read yet")

    @property
    def state(self) -> snapshot.InventoryState:
        """The core's current state (for tests and debugging)."""
        return self._state

    async def run(self) -> None:
        """Read once, then poll and wait for events until cancelled."""
        await self.poll_once()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._poll_loop(), name="inventory-poll")
            group.create_task(self._event_loop(), name="inventory-events")

    async def _poll_loop(self) -> None:
        while True:
            await self._clock.sleep(self._poll_interval_s)
            await self.poll_once()

    async def _event_loop(self) -> None:
        while True:
            event = await self._reader.wait_event(self._event_wait_timeout_s)
            if event is not None:
                await self.handle_event(event)

    async def poll_once(self) -> None:
        """Read every GPU, fold the reading into the core, publish when due."""
        try:
            reading = await self._reader.read()
        except NodeReadError as error:
            self._metrics.read_failures.inc()
            self._readiness.set(READINESS_CHECK, False, str(error))
            log.warning("cannot read GPUs", extra={"error": str(error)})
            return
        self._readiness.set(READINESS_CHECK, True)
        async with self._lock:
            self._state = snapshot.apply_reading(
                self._state, reading, now=self._clock.monotonic(), policy=self._policy
            )
            await self._publish_if_due()

    async def handle_event(self, event: HealthEvent) -> None:
        """Apply one health event; a critical one is published at once."""
        reason = snapshot.critical_reason(event)
        outcome = "ignored" if reason is None else "critical"
        self._metrics.events.labels(event.kind, str(event.code), outcome).inc()
        log.log(
            logging.WARNING if reason else logging.INFO,
            "GPU health event",
            extra={
                "uuid": event.uuid,
                "kind": event.kind,
                "code": event.code,
                "outcome": outcome,
                "reason": reason or "",
            },
        )
        async with self._lock:
            self._state = snapshot.apply_event(
                self._state, event, now=self._clock.monotonic(), policy=self._policy
            )
            await self._publish_if_due()

    async def _send(self, data: bytes) -> None:
        # The latest state first, then the news of it: whoever the subject wakes and reads
        # the KV entry finds this snapshot, not the one before.
        await self._bus.kv_put(subjects.KV_INVENTORY, self._key, data)
        await self._bus.publish(self._subject, data)

    async def _publish_if_due(self) -> None:
        publication = snapshot.next_publication(
            self._state,
            node=self._node,
            backend=self._reader.backend,
            observed_at=self._clock.now(),
            now=self._clock.monotonic(),
            policy=self._policy,
            producer=self._producer,
        )
        self._metrics.show(publication.inventory)
        if publication.reason is None:
            return
        data = codec.encode(publication.inventory)
        try:
            await self._send(data)
        except Exception as error:  # NATS down or slow: keep reading; decided again next poll
            self._metrics.publish_failures.inc()
            log.warning(
                "cannot publish the inventory", extra={"error": f"{type(error).__name__}: {error}"}
            )
            return
        self._state = publication.state
        self._metrics.publications.labels(publication.reason).inc()
        log.debug(
            "inventory published",
            extra={
                "reason": publication.reason,
                "sequence": publication.inventory.sequence,
                "gpus": len(publication.inventory.gpus),
            },
        )
