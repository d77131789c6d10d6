"""The device plugin's shell: gathers records and inventory, calls the pure cores, carries out.

Inputs, both kept in memory and fed from NATS:

- the assignment records of this node, from a KV watch on ``tessera-assignments`` (keys
  ``<node>.*``); a record that does not decode is dead-lettered and ignored;
- this node's inventory, from the ``tessera-inventory`` KV entry (key: the node token) and the
  ``tessera.inventory.<node>`` subject, the newer winning; decoded at the edge (malformed -> dead
  letter, never a crash).

Allocate (one container at a time, serialized in this process): plan with
:func:`allocate.plan_allocation`, commit the next record state by compare-and-set on the revision
it was read at, answer the kubelet and publish the :class:`AllocationEvent` to
``tessera.allocations.<node>`` beside the answer (retried until JetStream acknowledges it, and
waited for at shutdown). A lost compare-and-set means another writer (a second plugin
process, the binder) moved the record: re-read it and plan again, so no record is ever claimed
twice. When no record matches yet, Allocate waits up to ``record_wait_s`` for the binder's write to
arrive before refusing. The record in the KV bucket is the source of truth, so the kubelet never
waits for the event, and a publish that fails never fails an Allocate already committed.

All state lives here, not in the gRPC server, so a kubelet restart (new socket, new registration)
loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Sequence

from services.deviceplugin import allocate, devices, preferred
from services.deviceplugin.allocate import ContainerGrant, RecordView, Refusal
from services.deviceplugin.config import PluginConfig
from services.deviceplugin.devices import Device
from services.deviceplugin.kubelet import KubeletLink
from services.deviceplugin.metrics import PluginMetrics
from services.deviceplugin.server import (
    GrpcPluginServer,
    PluginOptions,
    PreferenceRequest,
    register,
)
from shared import codec, subjects
from shared.clock import Clock
from shared.messages.allocations import AllocationEvent
from shared.messages.assignments import AssignmentRecord
from shared.messages.inventory import GpuTelemetry, NodeInventory
from shared.runtime.bus import Bus, Delivery, KvEntry
from shared.runtime.edge import Edge
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import ServiceContext

log = logging.getLogger(__name__)

WATCH_RETRY_S = 1.0
"""Pause before watching a KV bucket again after the server ended a watch."""

EVENT_FLUSH_S = 5.0
"""How long a stopping plugin waits for allocation events still being published."""

MAX_CLAIM_ATTEMPTS = 16
"""Lost compare-and-sets in a row before Allocate gives up (each loss means progress elsewhere)."""


class _Versioned:
    """A change counter tasks can wait on (several waiters, no lost wake-ups)."""

    def __init__(self) -> None:
        self.version = 0
        self._changed = asyncio.Condition()

    async def bump(self) -> None:
        async with self._changed:
            self.version += 1
            self._changed.notify_all()

    async def wait_past(self, version: int, timeout: float | None = None) -> bool:
        """True once the version moved past ``version``; False when ``timeout`` ran out."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.version != version), timeout
                )
            except TimeoutError:
                return False
        return True


class DevicePluginService:
    """The plugin's state and behaviour (implements ``server.PluginCore``)."""

    def __init__(
        self,
        *,
        config: PluginConfig,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        metrics: PluginMetrics,
        readiness: Readiness,
    ) -> None:
        self._config = config
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self._metrics = metrics
        self._readiness = readiness
        self._records: dict[str, RecordView] = {}
        self._records_changed = _Versioned()
        self._inventory: NodeInventory | None = None
        self._gpus: dict[str, GpuTelemetry] = {}
        self._devices: tuple[Device, ...] = ()
        self._gpu_of: dict[str, str] = {}
        self._advertised: set[str] = set()
        self._devices_changed = _Versioned()
        self._allocate_lock = asyncio.Lock()
        self._publishing: set[asyncio.Task[None]] = set()
        readiness.set("inventory", False, f"no inventory received for node {config.node} yet")
        readiness.set("records", False, "loading assignment records")

    # --- what the gRPC server asks -------------------------------------------------------------

    @property
    def options(self) -> PluginOptions:
        return PluginOptions(pre_start_required=self._config.pre_start)

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._devices

    async def device_lists(self) -> AsyncIterator[tuple[Device, ...]]:
        while True:
            version = self._devices_changed.version
            yield self._devices
            await self._devices_changed.wait_past(version)

    def preferred(self, requests: Sequence[PreferenceRequest]) -> list[tuple[str, ...]]:
        answers = []
        for request in requests:
            view = allocate.pick_record(
                self._records.values(), count=request.size, resource=self._config.resource
            )
            container = (
                allocate.next_container(view.record, self._config.resource) if view else None
            )
            decided = tuple(s.uuid for s in container.gpus) if container else ()
            answers.append(
                preferred.prefer(
                    request.available,
                    request.must_include,
                    request.size,
                    decided_gpus=decided,
                    gpu_of=self._gpu_of,
                )
            )
        return answers

    async def allocate(self, requests: Sequence[tuple[str, ...]]) -> list[ContainerGrant] | Refusal:
        started = self._clock.monotonic()
        try:
            async with self._allocate_lock:
                return await self._allocate_all(requests)
        finally:
            self._metrics.allocate_seconds.observe(self._clock.monotonic() - started)

    async def _allocate_all(
        self, requests: Sequence[tuple[str, ...]]
    ) -> list[ContainerGrant] | Refusal:
        # The kubelet sends one container per call in practice; several are answered in order.
        grants: list[ContainerGrant] = []
        for device_ids in requests:
            result = await self._allocate_container(device_ids)
            outcome = "granted" if isinstance(result, ContainerGrant) else result.kind
            self._metrics.allocations.labels(outcome=outcome).inc()
            if isinstance(result, Refusal):
                log.warning(
                    "Allocate refused",
                    extra={"reason": result.message, "device_ids": list(device_ids)[:8]},
                )
                return result
            grants.append(result)
        return grants

    async def pre_start(self, device_ids: tuple[str, ...]) -> Refusal | None:
        return allocate.pre_start_check(device_ids, self._records.values(), gpus=self._gpus)

    # --- Allocate, one container -------------------------------------------------------------

    async def _allocate_container(self, device_ids: tuple[str, ...]) -> ContainerGrant | Refusal:
        deadline = self._clock.monotonic() + self._config.record_wait_s
        conflicts = 0
        while True:
            seen = self._records_changed.version
            plan = allocate.plan_allocation(
                device_ids,
                self._records.values(),
                node=self._config.node,
                resource=self._config.resource,
                advertised=self._advertised,
                gpus=self._gpus,
                options=self._config.response,
                now=self._clock.now(),
                plugin_id=self._config.plugin_id,
            )
            if isinstance(plan, Refusal):
                remaining = deadline - self._clock.monotonic()
                # Only a missing record can still arrive (the binder's write may trail the
                # kubelet's call); anything else is final.
                if plan.kind != "no_record" or remaining <= 0:
                    return plan
                if not await self._records_changed.wait_past(seen, timeout=remaining):
                    return plan
                continue
            try:
                revision = await self._bus.kv_update(
                    subjects.KV_ASSIGNMENTS,
                    plan.claimed.key,
                    codec.encode(plan.record),
                    revision=plan.claimed.revision,
                )
                if revision is None:
                    conflicts += 1
                    self._metrics.cas_conflicts.inc()
                    if conflicts >= MAX_CLAIM_ATTEMPTS:
                        return Refusal(
                            kind="conflict",
                            message=f"the assignment record {plan.claimed.key} kept changing "
                            f"under {conflicts} claims in a row; nothing was claimed",
                        )
                    await self._reread(plan.claimed.key)
                    continue
            except Exception as error:  # the bus is down or timed out: refuse, never crash
                return Refusal(
                    kind="unavailable",
                    message=f"cannot claim the assignment record {plan.claimed.key}: NATS "
                    f"failed ({type(error).__name__}: {error})",
                )
            await self._remember(
                RecordView(key=plan.claimed.key, revision=revision, record=plan.record)
            )
            self._publish(plan.event)
            log.info(
                "allocated",
                extra={
                    "pod": f"{plan.record.namespace}/{plan.record.name}",
                    "container": plan.container.container,
                    "gpus": list(plan.event.gpu_uuids),
                    "complete": plan.complete,
                },
            )
            return plan.grant

    async def _reread(self, key: str) -> None:
        entry = await self._bus.kv_get(subjects.KV_ASSIGNMENTS, key)
        if entry is None:
            await self._forget(key)
            return
        await self._apply_record_entry(entry)

    def _publish(self, event: AllocationEvent) -> None:
        """Publish ``event`` beside the answer: the record is already committed, so the kubelet
        need not wait for JetStream's acknowledgement; failures are retried until it comes."""
        task = asyncio.create_task(self._publish_until_done(event))
        self._publishing.add(task)
        self._metrics.events_unpublished.set(len(self._publishing))
        task.add_done_callback(self._published)

    def _published(self, task: asyncio.Task[None]) -> None:
        self._publishing.discard(task)
        self._metrics.events_unpublished.set(len(self._publishing))

    async def _publish_until_done(self, event: AllocationEvent) -> None:
        delay = 0.5
        while True:
            try:
                await self._bus.js_publish(
                    subjects.allocations(self._config.node),
                    codec.encode(event),
                    msg_id=allocate.allocation_message_id(event),
                )
                return
            except Exception as error:  # keep trying: the binder waits for this event
                log.warning(
                    "allocation event not published yet; retrying",
                    extra={
                        "pod_uid": event.pod_uid,
                        "error": f"{type(error).__name__}: {error}",
                        "retry_s": delay,
                    },
                )
            await self._clock.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` for events still being published; how many remain."""
        pending = set(self._publishing)
        if pending:
            _, still = await asyncio.wait(pending, timeout=timeout)
            pending = set(still)
            for task in pending:
                task.cancel()
            if pending:
                log.error("allocation events lost at shutdown", extra={"events": len(pending)})
        return len(pending)

    # --- assignment records --------------------------------------------------------------------

    async def follow_records(self) -> None:
        """Mirror this node's assignment records from the KV bucket, forever."""
        while True:
            await self._watch_records()
            # The watch ended without an error (the server dropped it): start a new one, whose
            # initial values also settle whatever was deleted meanwhile.
            log.warning("assignment record watch ended; watching again")
            await self._clock.sleep(WATCH_RETRY_S)

    async def _watch_records(self) -> None:
        watch = self._bus.kv_watch(
            subjects.KV_ASSIGNMENTS, subjects.assignment_keys_of(self._config.node)
        )
        initial: set[str] | None = set()
        try:
            async for entry in watch:
                if entry is None:
                    for key in set(self._records) - (initial or set()):
                        await self._forget(key)  # gone while no watch was running
                    initial = None
                    self._readiness.set("records", True)
                    log.info("assignment records loaded", extra={"records": len(self._records)})
                    continue
                if initial is not None:
                    initial.add(entry.key)
                if entry.deleted:
                    await self._forget(entry.key)
                else:
                    await self._apply_record_entry(entry)
        finally:
            with contextlib.suppress(Exception):
                await watch.aclose()  # type: ignore[attr-defined]

    async def _apply_record_entry(self, entry: KvEntry) -> None:
        delivery = Delivery(subject=f"$KV.{subjects.KV_ASSIGNMENTS}.{entry.key}", data=entry.value)
        record = await self._edge.accept(delivery, AssignmentRecord, family="assignments")
        if record is None:
            await self._forget(entry.key)
            return
        if record.node != self._config.node:
            await self._edge.reject(
                delivery,
                family="assignments",
                reason=f"record under key {entry.key} names node {record.node!r}, "
                f"not {self._config.node!r}",
                kind="validate",
            )
            return
        await self._remember(RecordView(key=entry.key, revision=entry.revision, record=record))

    async def _remember(self, view: RecordView) -> None:
        known = self._records.get(view.key)
        if known is not None and known.revision >= view.revision:
            return  # our own compare-and-set already stored this revision (or a later one)
        if view.record.state == "released":
            self._records.pop(view.key, None)
        else:
            self._records[view.key] = view
        await self._records_changed.bump()

    async def _forget(self, key: str) -> None:
        if self._records.pop(key, None) is not None:
            await self._records_changed.bump()

    # --- inventory -----------------------------------------------------------------------------

    async def follow_inventory(self) -> None:
        """Take this node's inventory from the subject and the KV bucket, forever."""
        node = self._config.node
        await self._edge.subscribe(
            subjects.inventory(node), NodeInventory, self._apply_inventory, family="inventory"
        )
        while True:
            watch = self._bus.kv_watch(subjects.KV_INVENTORY, subjects.node_token(node))
            try:
                async for entry in watch:
                    if entry is None or entry.deleted:
                        continue
                    delivery = Delivery(
                        subject=f"$KV.{subjects.KV_INVENTORY}.{entry.key}", data=entry.value
                    )
                    inventory = await self._edge.accept(delivery, NodeInventory, family="inventory")
                    if inventory is not None:
                        await self._apply_inventory(inventory)
            finally:
                with contextlib.suppress(Exception):
                    await watch.aclose()  # type: ignore[attr-defined]
            log.warning("inventory watch ended; watching again")
            await self._clock.sleep(WATCH_RETRY_S)

    async def _apply_inventory(self, inventory: NodeInventory) -> None:
        if inventory.node != self._config.node:
            log.warning(
                "ignored the inventory of another node", extra={"inventory_node": inventory.node}
            )
            return
        current = self._inventory
        if current is not None and inventory.observed_at < current.observed_at:
            return  # an older snapshot arriving late (KV and subject race)
        self._inventory = inventory
        self._gpus = {gpu.uuid: gpu for gpu in inventory.gpus}
        self._readiness.set("inventory", True)
        advertised = devices.advertise(inventory, self._config.devices)
        if advertised == self._devices:
            return
        problem = devices.list_size_problem(advertised, self._config.devices)
        if problem is not None:
            log.error(problem)
            self._readiness.set("devices", False, problem)
        else:
            self._readiness.set("devices", True)
        self._devices = advertised
        self._gpu_of = devices.gpu_of(advertised)
        self._advertised.update(self._gpu_of)
        healthy = sum(1 for d in advertised if d.healthy)
        self._metrics.count_devices(healthy, len(advertised) - healthy)
        log.info(
            "device list changed",
            extra={"devices": len(advertised), "unhealthy": len(advertised) - healthy},
        )
        await self._devices_changed.bump()


async def run_plugin(context: ServiceContext, config: PluginConfig) -> None:
    """The service body: follow records and inventory, keep the kubelet link, until cancelled."""
    metrics = PluginMetrics.create(context.registry)
    service = DevicePluginService(
        config=config,
        bus=context.bus,
        edge=context.edge,
        clock=context.clock,
        metrics=metrics,
        readiness=context.readiness,
    )

    def report(registered: bool, reason: str) -> None:
        context.readiness.set("kubelet", registered, reason)
        if registered:
            metrics.registrations.inc()

    link = KubeletLink(
        plugin_dir=config.plugin_dir,
        endpoint=config.endpoint,
        server=GrpcPluginServer(service),
        register=functools.partial(
            register, endpoint=config.endpoint, resource=config.resource, options=service.options
        ),
        clock=context.clock,
        poll_s=config.kubelet_poll_s,
        report=report,
    )
    log.info(
        "device plugin starting",
        extra={
            "node": config.node,
            "mode": config.devices.mode,
            "resource": config.resource,
            "socket": str(link.plugin_socket),
            "isolation": config.response.isolation,
        },
    )
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(service.follow_records(), name="records")
            group.create_task(service.follow_inventory(), name="inventory")
            group.create_task(link.run(), name="kubelet")
    finally:
        # Before run_service drains the bus: events of committed claims must still go out.
        await asyncio.shield(service.flush(timeout=EVENT_FLUSH_S))
