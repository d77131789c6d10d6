"""Helpers for driving the inventory service in tests: an inbox on the bus and fake-clock ticks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from services.inventory.reader import GpuReader
from services.inventory.service import InventoryMetrics, InventoryService
from services.inventory.snapshot import Deadbands, Policy
from shared import codec, subjects
from shared.messages.inventory import NodeInventory
from shared.runtime.bus import Bus, Delivery
from shared.runtime.health import Readiness
from shared.runtime.nats import NatsBus
from tests.harness.clock import FakeClock
from tests.harness.wait import eventually as shared_eventually

NODE = "gpu-node-1.example"
_MARKER = b"--marker--"


class Inbox:
    """Inventories published on one node's subject, seen through the service's own connection.

    Messages of one NATS connection arrive in the order they were published, so a marker
    published on the same subject after an action shows that everything the action published
    has arrived: :meth:`settle` returns exactly what was published, even when that is nothing.
    """

    def __init__(self, bus: NatsBus, node: str) -> None:
        self._bus = bus
        self._subject = subjects.inventory(node)
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def start(self) -> Inbox:
        async def handler(delivery: Delivery) -> None:
            await self._queue.put(delivery.data)

        await self._bus.subscribe(self._subject, handler)
        return self

    async def next(self, timeout: float = 5.0) -> NodeInventory:
        """The next published inventory."""
        data = await asyncio.wait_for(self._queue.get(), timeout)
        assert data != _MARKER, "expected an inventory, got only the marker"
        return codec.decode(data, NodeInventory)

    async def settle(self, timeout: float = 5.0) -> list[NodeInventory]:
        """Everything published so far and not yet taken."""
        await self._bus.publish(self._subject, _MARKER)
        received: list[NodeInventory] = []
        while (data := await asyncio.wait_for(self._queue.get(), timeout)) != _MARKER:
            received.append(codec.decode(data, NodeInventory))
        return received


@dataclass
class Harness:
    service: InventoryService
    registry: CollectorRegistry
    readiness: Readiness
    clock: FakeClock

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    task: asyncio.Task[None] | None = None

    async def tick(self, seconds: float) -> None:
        """Advance the fake clock and wait until the poll loop is asleep again."""
        await self.clock.advance(seconds)
        await asleep(self.clock, task=self.task)


eventually = functools.partial(shared_eventually, timeout=5.0, interval=0.005)
"""Wait (real time) until ``check()`` holds, for work done on other threads."""


async def asleep(
    clock: FakeClock, *, task: asyncio.Task[None] | None = None, timeout: float = 5.0
) -> None:
    """Wait (real time) until one task sleeps on ``clock``: the poll loop finished its turn.

    When ``task`` (the service) ends meanwhile, its error is raised here instead of a timeout.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    while clock.sleepers < 1:
        if task is not None and task.done():
            task.result()
            raise AssertionError("the service stopped by itself")
        assert asyncio.get_running_loop().time() < deadline, "the poll loop never slept again"
        await asyncio.sleep(0.005)


POLICY = Policy(
    heartbeat_s=300.0,
    probe_after_s=60.0,
    deadbands=Deadbands(memory_mib=256, utilization_pct=5, temperature_c=3, power_w=15.0),
)


def harness(
    *,
    reader: GpuReader,
    bus: Bus,
    clock: FakeClock,
    policy: Policy = POLICY,
    poll_interval_s: float = 10.0,
    event_wait_timeout_s: float = 0.2,
) -> Harness:
    registry = CollectorRegistry()
    readiness = Readiness()
    service = InventoryService(
        reader=reader,
        bus=bus,
        clock=clock,
        node=NODE,
        policy=policy,
        poll_interval_s=poll_interval_s,
        event_wait_timeout_s=event_wait_timeout_s,
        metrics=InventoryMetrics.create(registry),
        readiness=readiness,
    )
    return Harness(service=service, registry=registry, readiness=readiness, clock=clock)


@contextlib.asynccontextmanager
async def running(rig: Harness) -> AsyncIterator[Harness]:
    """Run the service's loops; on exit cancel them as SIGTERM would."""
    task = rig.task = asyncio.create_task(rig.service.run())
    try:
        await asleep(rig.clock, task=task)
        yield rig
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
