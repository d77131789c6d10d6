"""The device plugin's shell: its parts wired together, and the process body (:func:`run_plugin`).

Each job has its own module, all fed from NATS and kept in memory:

- :mod:`~services.deviceplugin.records`: this node's assignment records (the shared
  :class:`~shared.runtime.records.RecordMirror` with the plugin's checks);
- :mod:`~services.deviceplugin.inventory`: this node's inventory and the devices advertised;
- :mod:`~services.deviceplugin.commits`: this node's bookings (only what a placer committed is
  granted);
- :mod:`~services.deviceplugin.allocating`: Allocate, moving records ``bound -> allocated`` by
  compare-and-set (the binder sees ``allocated`` in the record);
- :mod:`~services.deviceplugin.grants`: what it granted, kept across its restarts;
- :mod:`~services.deviceplugin.server` and :mod:`~services.deviceplugin.kubelet`: the gRPC
  server and the kubelet link (registration, health), wired in :func:`run_plugin`.

The pure rules (no I/O) are :mod:`~services.deviceplugin.rules.allocate`,
:mod:`~services.deviceplugin.rules.devices` and :mod:`~services.deviceplugin.rules.preferred`.

All state lives here, not in the gRPC server, so a kubelet restart (new socket, new registration)
loses nothing; the grants file, loaded before any record is taken, means that after a restart of
the plugin itself a record moved backwards (``allocated -> bound``) is refused rather than granted
twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from services.deviceplugin.allocating import Allocator
from services.deviceplugin.commits import CommitMirror
from services.deviceplugin.config import PluginConfig
from services.deviceplugin.draplugin import DraNodePlugin
from services.deviceplugin.draserver import GrpcDraServer
from services.deviceplugin.grants import GrantBook, GrantFile, state_file
from services.deviceplugin.inventory import InventoryFollower
from services.deviceplugin.kubelet import KubeletLink
from services.deviceplugin.metrics import PluginMetrics
from services.deviceplugin.records import NodeRecords
from services.deviceplugin.rules import allocate, preferred
from services.deviceplugin.rules.allocate import ContainerGrant, Refusal
from services.deviceplugin.rules.devices import Device
from services.deviceplugin.server import (
    GrpcPluginServer,
    PluginOptions,
    PreferenceRequest,
    register,
)
from shared import codec, subjects
from shared.clock import Clock
from shared.dra.devices import DRIVER
from shared.messages.assignments import AssignmentRecord, RecordView
from shared.messages.inventory import GpuTelemetry, NodeInventory
from shared.messages.ledger import Booking
from shared.runtime.bus import Bus, BusUnavailableError, Delivery, OutcomeUnknownError
from shared.runtime.edge import Edge
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import ServiceContext
from shared.runtime.tasks import ChangeCounter, finish

log = logging.getLogger(__name__)


class DevicePluginService:
    """The plugin's parts and what the gRPC server asks of them (implements
    ``server.PluginCore``)."""

    def __init__(
        self,
        *,
        config: PluginConfig,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        metrics: PluginMetrics,
        readiness: Readiness,
        grants: GrantFile,
    ) -> None:
        self._config = config
        self._bus = bus
        self._clock = clock
        node = config.node
        changed = ChangeCounter()
        """Bumped by every change to the records or the commits an Allocate waits on."""
        self._inventory = InventoryFollower(
            node=node,
            config=config.devices,
            bus=bus,
            edge=edge,
            clock=clock,
            metrics=metrics,
            readiness=readiness,
            on_inventory=self._inventory_taken,
        )
        self._grants = GrantBook(grants, clock=clock, failed=metrics.grant_file_failures.inc)
        self._commits = CommitMirror(
            node=node, bus=bus, edge=edge, clock=clock, readiness=readiness, changed=changed
        )
        self._records = NodeRecords(
            node=node,
            bus=bus,
            edge=edge,
            clock=clock,
            metrics=metrics,
            readiness=readiness,
            changed=changed,
            grants=self._grants,
            commits=self._commits,
            inventory=self._inventory,
        )
        self._allocator = Allocator(
            config=config,
            bus=bus,
            clock=clock,
            metrics=metrics,
            records=self._records,
            commits=self._commits,
            inventory=self._inventory,
            grants=self._grants,
        )
        metrics.inventory_age_seconds.set_function(self._inventory.age)
        metrics.count_records_with(lambda: [v.record.state for v in self._records.mirror.views()])

    async def _inventory_taken(self, inventory: NodeInventory) -> None:
        await self._records.revalidate(inventory)

    # --- what the DRA side reads (``draplugin.NodeState``) ----------------------------------------

    def record_views(self) -> list[RecordView]:
        return self._records.mirror.views()

    @property
    def bookings(self) -> Mapping[str, Booking]:
        return self._commits.bookings

    async def advance(self, view: RecordView, record: AssignmentRecord) -> bool:
        """``draplugin.RecordWriter``: ``record`` over ``view``, its outcome read from the
        records watch (``RecordMirror.write``)."""
        try:
            written = await self._records.mirror.write(
                view.key,
                codec.encode(record),
                revision=view.revision,
                seen_s=self._config.record_wait_s,
            )
        except (BusUnavailableError, OutcomeUnknownError):
            return False  # the binder settles it; a write that did land is seen in the mirror
        return written is not None

    @property
    def gpus(self) -> Mapping[str, GpuTelemetry]:
        return self._inventory.gpus

    # --- what the gRPC server asks -------------------------------------------------------------

    @property
    def options(self) -> PluginOptions:
        return PluginOptions(pre_start_required=self._config.pre_start)

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._inventory.devices

    @property
    def inventory(self) -> NodeInventory | None:
        """The inventory in use (for tests and debugging)."""
        return self._inventory.inventory

    @property
    def held_records(self) -> tuple[RecordView, ...]:
        """The records Allocate may serve (for tests and debugging)."""
        return tuple(self._records.mirror.views())

    @property
    def servable_records(self) -> list[RecordView]:
        """The held records whose commit is confirmed (their booking seen): those an Allocate
        may serve now."""
        return allocate.committed(self._records.mirror.views(), bookings=self._commits.bookings)

    def device_lists(self) -> AsyncIterator[tuple[Device, ...]]:
        return self._inventory.device_lists()

    def preferred(self, requests: Sequence[PreferenceRequest]) -> list[tuple[str, ...]]:
        answers = []
        servable = self.servable_records
        for request in requests:
            view = allocate.pick_record(
                servable, count=request.size, resource=self._config.resource
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
                    gpu_of=self._inventory.gpu_of,
                )
            )
        return answers

    async def allocate(self, requests: Sequence[tuple[str, ...]]) -> list[ContainerGrant] | Refusal:
        return await self._allocator.allocate(requests)

    async def pre_start(self, device_ids: tuple[str, ...]) -> Refusal | None:
        return allocate.pre_start_check(
            device_ids, self._records.mirror.views(), gpus=self._inventory.gpus
        )

    # --- the tasks that feed it, and its stop ----------------------------------------------------

    async def follow_records(self) -> None:
        """Mirror this node's assignment records from the KV bucket, forever."""
        await self._records.mirror.run()

    async def follow_inventory(self) -> None:
        """Take this node's inventory from the subject and the KV bucket, forever."""
        await self._inventory.follow()

    async def follow_commits(self) -> None:
        """Mirror this node's bookings."""
        await self._commits.follow()

    async def answer_grants(self) -> None:
        """Answer the binder's question of what this node granted (before it restores a lost
        store), until cancelled."""
        node = self._config.node
        while True:
            try:  # nats-py keeps a subscription across reconnects; only the first can fail
                subscription = await self._bus.subscribe(
                    subjects.grants(node), self._on_grants_request
                )
                break
            except Exception as error:
                log.warning("cannot answer what this node granted yet", extra={"error": str(error)})
                await self._clock.sleep(1.0)
        try:
            await asyncio.Event().wait()
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _on_grants_request(self, delivery: Delivery) -> None:
        if not delivery.reply:
            return
        answer = self._grants.answer(self._config.node, self._inventory.inventory)
        with contextlib.suppress(Exception):  # the asker gave up, or NATS is away
            await self._bus.publish(delivery.reply, codec.encode(answer))

    async def keep_grants(self) -> None:
        """Keep the state file of grants written, forever."""
        await self._grants.keep()

    async def write_grants(self) -> None:
        """At stop: write what is not written yet."""
        await self._grants.write()


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
        grants=GrantFile(state_file(config.plugin_dir, config.endpoint)),
    )

    def report(registered: bool, reason: str) -> None:
        context.readiness.set("kubelet", registered, reason)
        metrics.registered.set(1 if registered else 0)
        if registered:
            metrics.registrations.inc()

    # Not ready until registered: without this check the other checks could pass before the
    # link first reports, and /readyz would say ready before the plugin socket is served.
    report(False, "not registered with the kubelet yet")

    if config.api == "dra":
        await _serve_dra(service, config, report, bus=context.bus, clock=context.clock)
        return
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
            group.create_task(service.follow_commits(), name="commits")
            group.create_task(service.keep_grants(), name="grants")
            group.create_task(service.answer_grants(), name="grants-answers")
            group.create_task(link.run(), name="kubelet")
    finally:
        await finish(service.write_grants())


async def _serve_dra(
    service: DevicePluginService,
    config: PluginConfig,
    report: Callable[[bool, str], None],
    *,
    bus: Bus,
    clock: Clock,
) -> None:
    """The DRA side (docs/design.md §14): ``DRAPlugin`` v1 on ``<plugin dir>/<driver>/dra.sock``,
    registered through the kubelet's plugin registry; claims prepared from the records."""
    server = GrpcDraServer(
        DraNodePlugin(
            node=config.node,
            state=service,
            records=service,
            clock=clock,
            cdi_dir=config.cdi_dir,
            options=config.response,
        ),
        driver=DRIVER,
        endpoint=config.dra_plugin_dir / DRIVER / "dra.sock",
        registration_socket=config.registry_dir / f"{DRIVER}-reg.sock",
        on_registration=report,
    )
    log.info("DRA node plugin starting", extra={"node": config.node, "cdi": str(config.cdi_dir)})
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(service.follow_records(), name="records")
            group.create_task(service.follow_inventory(), name="inventory")
            group.create_task(service.follow_commits(), name="commits")
            await server.start()
    finally:
        await finish(server.stop())
