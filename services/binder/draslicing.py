"""The leader's ResourceSlice publishing for the nodes in DRA mode (docs/design.md §14): each
node's inventory (``tessera-inventory``) and its ``tessera.dev/gpu-api=dra`` label (the node
informer) -> ``slicing.SlicePublisher``.

A node's slices are written again only when the devices planned from its inventory change (a
GPU added, gone, or its health changed; the inventory's heartbeats change nothing), or when
the node enters DRA mode; a node that leaves it, or whose inventory is gone, has its slices
deleted. A failed write, or a node the node informer does not know yet, is tried again
``RETRY_S`` later; every node is looked at again each ``RECHECK_S`` (its label may change).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from services.binder.gateway import ApiUnavailableError
from services.binder.rules.draslices import Body, dra_node, planned_devices
from services.binder.rules.objects import Node
from services.binder.slicing import SlicePublisher
from shared import codec, subjects
from shared.clock import Clock
from shared.dra.devices import DEFAULT_POLICY, MemoryPolicy
from shared.messages.inventory import NodeInventory
from shared.runtime.bus import Bus, KvEntry
from shared.runtime.follow import follow

log = logging.getLogger(__name__)

RETRY_S: Final = 2.0
RECHECK_S: Final = 10.0
"""How often every node is looked at again (a node's label may have changed)."""


class SliceFollower:
    """Keeps the DRA nodes' slices what their inventories say (leader only)."""

    def __init__(
        self,
        *,
        bus: Bus,
        clock: Clock,
        publisher: SlicePublisher,
        node_of: Callable[[str], Node | None],
        policy: MemoryPolicy = DEFAULT_POLICY,
    ) -> None:
        self._bus = bus
        self._clock = clock
        self._publisher = publisher
        self._node_of = node_of
        self._policy = policy
        self._inventories: dict[str, NodeInventory] = {}
        self._written: dict[str, list[Body] | None] = {}
        """Node -> the devices last written (None: its slices deleted)."""
        self._dirty: set[str] = set()
        self._woken = asyncio.Event()

    def node_changed(self, name: str) -> None:
        self._dirty.add(name)
        self._woken.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(
                follow(
                    self._bus,
                    subjects.KV_INVENTORY,
                    on_entry=self._on_entry,
                    clock=self._clock,
                    what="inventory (slices)",
                )
            )
            group.create_task(self._publish_forever())
            group.create_task(self._recheck())

    async def _recheck(self) -> None:
        while True:
            await self._clock.sleep(RECHECK_S)
            for name in list(self._inventories):
                self.node_changed(name)

    async def _on_entry(self, entry: KvEntry) -> None:
        inventory = None
        if not entry.deleted:
            try:
                inventory = codec.decode(entry.value, NodeInventory)
            except codec.DecodeError:
                return  # the placer and device plugins dead-letter it; slices wait for a good one
        if inventory is None:
            node = next((n for n in self._inventories if subjects.node_token(n) == entry.key), None)
            if node is not None:
                self._inventories.pop(node, None)
                self.node_changed(node)
            return
        self._inventories[inventory.node] = inventory
        self.node_changed(inventory.node)

    def _wanted(self, name: str) -> list[Body] | None:
        node = self._node_of(name)
        inventory = self._inventories.get(name)
        if node is None or inventory is None or not dra_node(node.metadata.labels or {}):
            return None
        return planned_devices(inventory, self._policy)

    async def _publish_forever(self) -> None:
        while True:
            await self._woken.wait()
            self._woken.clear()
            dirty, self._dirty = self._dirty, set()
            failed = set()
            for name in sorted(dirty):
                if name in self._inventories and self._node_of(name) is None:
                    failed.add(name)  # the node informer has not seen it yet
                    continue
                wanted = self._wanted(name)
                if name in self._written and self._written[name] == wanted:
                    continue
                if wanted is None and name not in self._written:
                    continue  # never a DRA node here: nothing of it to delete
                try:
                    answer = await self._publisher.publish(
                        name, self._inventories.get(name) if wanted is not None else None
                    )
                except ApiUnavailableError as error:
                    log.warning("cannot publish slices", extra={"node": name, "error": str(error)})
                    failed.add(name)
                    continue
                if answer.ok:
                    self._written[name] = wanted
                else:
                    failed.add(name)
            if failed:
                await self._clock.sleep(RETRY_S)
                self._dirty |= failed
                self._woken.set()
