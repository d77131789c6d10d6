"""Following this node's inventory and the device list the plugin advertises from it.

The inventory comes from the ``tessera-inventory`` KV entry (key: the node token) and the
``tessera.inventory.<node>`` subject; decoded at the edge and judged by the one inventory rule
of ``shared.validation.take_inventory`` (malformed, another node's, dated ahead of this clock,
absurd values -> dead letter, never a crash; the same producer's next sequence or else the
fresher snapshot wins, so no forged snapshot outlives the inventory's next heartbeat). A
device list too large for the kubelet is refused before it is built. Each inventory taken is
handed to ``on_inventory`` first (the records it makes impossible are refused), then the device
list is built again (:mod:`~services.deviceplugin.rules.devices`) and, when it changed,
``devices_changed`` bumps for ListAndWatch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec

from services.deviceplugin.metrics import PluginMetrics
from services.deviceplugin.rules import devices
from services.deviceplugin.rules.devices import Device, DeviceConfig
from shared import subjects, validation
from shared.clock import Clock
from shared.messages.inventory import GpuTelemetry, NodeInventory
from shared.runtime.bus import Bus, Delivery, KvEntry
from shared.runtime.edge import Edge
from shared.runtime.follow import follow
from shared.runtime.health import Readiness
from shared.runtime.tasks import ChangeCounter

log = logging.getLogger(__name__)

SAME_NODE_LIMITS = validation.InventoryLimits(max_future_s=60.0)
"""The inventory is produced on this node, by this node's clock: a minute ahead is already a lie."""


class InventoryFollower:
    """This node's inventory in use, its GPUs, and the devices advertised from it."""

    def __init__(
        self,
        *,
        node: str,
        config: DeviceConfig,
        bus: Bus,
        edge: Edge,
        clock: Clock,
        metrics: PluginMetrics,
        readiness: Readiness,
        on_inventory: Callable[[NodeInventory], Awaitable[None]],
    ) -> None:
        self._node = node
        self._config = config
        self._bus = bus
        self._edge = edge
        self._clock = clock
        self._metrics = metrics
        self._readiness = readiness
        self._on_inventory_taken = on_inventory
        self.inventory: NodeInventory | None = None
        """The inventory in use."""
        self.gpus: dict[str, GpuTelemetry] = {}
        self.devices: tuple[Device, ...] = ()
        self.gpu_of: dict[str, str] = {}
        self.advertised: set[str] = set()
        self._memory_unit: int | None = None
        """Memory-units mode with the unit unset: the unit chosen on the first inventory."""
        self._device_problem: str | None = None
        """Why the inventory's devices cannot be advertised (logged once per new reason)."""
        self.retired: set[str] = set()
        """Device IDs advertised before and no longer (their GPU left the inventory)."""
        self.devices_changed = ChangeCounter()
        readiness.set("inventory", False, f"no inventory received for node {node} yet")

    async def device_lists(self) -> AsyncIterator[tuple[Device, ...]]:
        while True:
            version = self.devices_changed.version
            yield self.devices
            await self.devices_changed.wait_past(version)

    def age(self) -> float:
        inventory = self.inventory
        return self._clock.now() - inventory.observed_at if inventory else math.nan

    async def follow(self) -> None:
        """Take this node's inventory from the subject and the KV bucket, forever."""
        node = self._node
        await self._bus.subscribe(subjects.inventory(node), self._on_inventory)

        async def on_entry(entry: KvEntry) -> None:
            if not entry.deleted:
                subject = f"$KV.{subjects.KV_INVENTORY}.{entry.key}"
                await self._on_inventory(Delivery(subject=subject, data=entry.value))

        await follow(
            self._bus,
            subjects.KV_INVENTORY,
            keys=subjects.node_token(node),
            on_entry=on_entry,
            clock=self._clock,
            what="inventory",
        )

    async def _on_inventory(self, delivery: Delivery) -> None:
        inventory = await self._edge.accept(delivery, NodeInventory, family="inventory")
        if inventory is None:
            return
        verdict = validation.take_inventory(
            inventory,
            self.inventory,
            node=self._node,
            now=self._clock.now(),
            limits=SAME_NODE_LIMITS,
        )
        if verdict.problem:
            await self._edge.reject(
                delivery, family="inventory", reason=verdict.problem, kind="validate"
            )
            if self.inventory is None:
                self._readiness.set("inventory", False, f"inventory rejected: {verdict.problem}")
            return
        if verdict.take is not None:  # else older than what is held (KV and subject race)
            await self._apply(verdict.take)

    async def _apply(self, inventory: NodeInventory) -> None:
        self.inventory = inventory
        self.gpus = {gpu.uuid: gpu for gpu in inventory.gpus}
        self._readiness.set("inventory", True)
        await self._on_inventory_taken(inventory)
        config = self._device_config(inventory)
        problem = devices.inventory_size_problem(inventory, config)
        advertised = () if problem else devices.advertise(inventory, config)
        if advertised == self.devices and problem == self._device_problem:
            return
        if problem is not None and problem != self._device_problem:
            log.error(problem)
        self._device_problem = problem
        unit = f" of {config.memory_unit_mib} MiB" if config.mode == "memory-units" else ""
        self._readiness.set(
            "devices", problem is None, problem or f"{len(advertised)} devices{unit}"
        )
        self.devices = advertised
        self.gpu_of = devices.gpu_of(advertised)
        current = set(self.gpu_of)
        self.retired = (self.retired | self.advertised) - current
        self.advertised = current
        healthy = sum(1 for d in advertised if d.healthy)
        self._metrics.count_devices(healthy, len(advertised) - healthy)
        log.info(
            "device list changed",
            extra={"devices": len(advertised), "unhealthy": len(advertised) - healthy},
        )
        await self.devices_changed.bump()

    def _device_config(self, inventory: NodeInventory) -> DeviceConfig:
        """The device configuration, with the memory unit chosen when it is unset: on the
        first inventory, then kept (the kubelet's accounting must not change under running
        pods). Which unit, and what it means, is logged."""
        config = self._config
        if config.mode != "memory-units" or config.memory_unit_mib != devices.AUTO_UNIT:
            return config
        if self._memory_unit is None:
            self._memory_unit = unit = devices.choose_memory_unit(inventory, config)
            total = sum(gpu.memory_total_mib for gpu in inventory.gpus)
            if unit == 1:
                log.info(
                    "memory unit 1 MiB: one device per MiB of GPU memory",
                    extra={"memory_unit_mib": 1, "gpu_memory_mib": total},
                )
            else:
                log.warning(
                    f"memory unit {unit} MiB chosen: {total} MiB of GPU memory in 1-MiB devices "
                    "would not fit the kubelet's 4 MiB ListAndWatch message. Pods still ask "
                    "tessera.dev/gpu-memory in MiB and the kubelet hands one device per MiB "
                    f"asked, so this node offers {total // unit} MiB of its GPU memory; use "
                    "logical mode to offer all of it",
                    extra={"memory_unit_mib": unit, "gpu_memory_mib": total},
                )
        return msgspec.structs.replace(config, memory_unit_mib=self._memory_unit)
