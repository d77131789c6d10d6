"""The service shell over the real bus, without gRPC: record writes that lose a compare-and-set, and
device lists that are resent only when they change."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from services.deviceplugin.config import PluginConfig
from services.deviceplugin.grants import GrantFile, state_file
from services.deviceplugin.metrics import PluginMetrics
from services.deviceplugin.rules.allocate import ContainerGrant, Refusal, ResponseOptions
from services.deviceplugin.rules.devices import DeviceConfig
from services.deviceplugin.service import DevicePluginService
from shared import codec, subjects
from shared.clock import Clock, SystemClock
from shared.messages.assignments import AssignmentRecord
from shared.runtime.bus import KvEntry
from shared.runtime.edge import Edge
from shared.runtime.health import Readiness
from shared.runtime.metrics import EdgeMetrics
from shared.runtime.nats import NatsBus
from tests.deviceplugin.builders import NODE, container, gpu, inventory, record, share, uuid
from tests.deviceplugin.conftest import get_record, until
from tests.harness.kv import announce_inventory, put_committed

Competitor = Callable[[NatsBus, str, int], Awaitable[None]]


class RacingBus:
    """The real bus, except that another writer gets in just before the first compare-and-set."""

    def __init__(self, bus: NatsBus, competitor: Competitor) -> None:
        self._bus = bus
        self._competitor: Competitor | None = competitor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def kv_send(
        self,
        bucket: str,
        key: str,
        value: bytes,
        *,
        revision: int,
        create: bool = False,
        guard: str = "",
    ) -> bool:
        competitor, self._competitor = self._competitor, None
        if competitor is not None:
            await competitor(self._bus, key, revision)
        return await self._bus.kv_send(
            bucket, key, value, revision=revision, create=create, guard=guard
        )


async def rewrite_unchanged(bus: NatsBus, key: str, revision: int) -> None:
    """The binder touching the record (same content, new revision)."""
    entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
    assert entry is not None
    assert await bus.kv_update(subjects.KV_ASSIGNMENTS, key, entry.value, revision=revision)


async def allocate_first(bus: NatsBus, key: str, revision: int) -> None:
    """A second plugin process allocating the record first."""
    entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, key)
    assert entry is not None
    allocated = msgspec.structs.replace(
        codec.decode(entry.value, AssignmentRecord), state="allocated"
    )
    assert await bus.kv_update(
        subjects.KV_ASSIGNMENTS, key, codec.encode(allocated), revision=revision
    )


@contextlib.asynccontextmanager
async def service_on(
    bus: Any,
    clock: Clock | None = None,
    *,
    devices: DeviceConfig | None = None,
    readiness: Readiness | None = None,
    ready: Callable[[], bool] | None = None,
    nats_wait_s: float = 0.0,
    record_wait_s: float = 0.2,
    plugin_dir: Path | None = None,
) -> AsyncIterator[tuple[DevicePluginService, CollectorRegistry]]:
    """The service without gRPC, following records and inventory; entered once ``ready()``
    (default: every readiness check passes). ``plugin_dir`` keeps its state file (default: a
    fresh directory)."""
    with contextlib.ExitStack() as cleanup:
        if plugin_dir is None:
            plugin_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="dp-")))
        async with _service_on(
            bus,
            clock,
            devices=devices,
            readiness=readiness,
            ready=ready,
            nats_wait_s=nats_wait_s,
            record_wait_s=record_wait_s,
            plugin_dir=plugin_dir,
        ) as running:
            yield running


@contextlib.asynccontextmanager
async def _service_on(
    bus: Any,
    clock: Clock | None,
    *,
    devices: DeviceConfig | None,
    readiness: Readiness | None,
    ready: Callable[[], bool] | None,
    nats_wait_s: float,
    record_wait_s: float,
    plugin_dir: Path,
) -> AsyncIterator[tuple[DevicePluginService, CollectorRegistry]]:
    registry = CollectorRegistry()
    clock = clock or SystemClock()
    readiness = readiness or Readiness()
    service = DevicePluginService(
        config=PluginConfig(
            node=NODE,
            devices=devices or DeviceConfig(),
            response=ResponseOptions(),
            plugin_dir=plugin_dir,
            endpoint="unused.sock",
            record_wait_s=record_wait_s,
            nats_wait_s=nats_wait_s,
        ),
        bus=bus,
        edge=Edge(bus=bus, metrics=EdgeMetrics.create(registry), clock=clock, service="dp"),
        clock=clock,
        metrics=PluginMetrics.create(registry),
        readiness=readiness,
        grants=GrantFile(state_file(plugin_dir, "unused.sock")),
    )
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(service.follow_records()),
            group.create_task(service.follow_inventory()),
            group.create_task(service.follow_commits()),
            group.create_task(service.keep_grants()),
        ]
        await until(ready or (lambda: readiness.ready), what=f"service ready {readiness.report()}")
        try:
            yield service, registry
        finally:
            for task in tasks:
                task.cancel()


class SilentWatchBus:
    """The real bus, except that the first watch of the assignments bucket goes silent after its
    initial values: what a watch does on a NATS cluster when the server holding its consumer
    dies while the client's own server lives on (nats-py notices only heartbeats later)."""

    def __init__(self, bus: NatsBus) -> None:
        self._bus = bus
        self.silenced = False
        self.record_writes: list[str] = []
        """How each record write went: ``sent`` (unanswered) or ``updated`` (answered)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def kv_send(
        self,
        bucket: str,
        key: str,
        value: bytes,
        *,
        revision: int,
        create: bool = False,
        guard: str = "",
    ) -> bool:
        self.record_writes.append("sent")
        return await self._bus.kv_send(
            bucket, key, value, revision=revision, create=create, guard=guard
        )

    async def kv_update(self, bucket: str, key: str, value: bytes, *, revision: int) -> int | None:
        self.record_writes.append("updated")
        return await self._bus.kv_update(bucket, key, value, revision=revision)

    def kv_watch(
        self, bucket: str, keys: str = ">", *, batch_s: float = 0.0
    ) -> AsyncGenerator[KvEntry | None, None]:
        if bucket != subjects.KV_ASSIGNMENTS or self.silenced:
            return self._bus.kv_watch(bucket, keys, batch_s=batch_s)
        self.silenced = True
        return self._silent_after_initial_values(bucket, keys)

    async def _silent_after_initial_values(
        self, bucket: str, keys: str
    ) -> AsyncGenerator[KvEntry | None, None]:
        async with contextlib.aclosing(self._bus.kv_watch(bucket, keys)) as watch:
            async for entry in watch:
                yield entry
                if entry is None:
                    break
        await asyncio.Event().wait()


async def test_a_record_a_silent_watch_never_delivered_is_read_afresh_at_allocate(
    bus: NatsBus,
) -> None:
    await announce_inventory(bus, inventory(gpu(0)))
    silent = SilentWatchBus(bus)
    async with service_on(silent, record_wait_s=5.0) as (service, registry):
        assert silent.silenced
        await put_committed(bus, record("late", container("main", share(0))))
        result = await service.allocate([(f"{uuid(0)}::0",)])
        assert isinstance(result, list) and isinstance(result[0], ContainerGrant), result
        assert registry.get_sample_value("tessera_deviceplugin_records_reread_total") == 1
        # Answered: the silent watch would not show an unanswered write either, and the
        # Allocate would wait record_wait_s for it before reading it back.
        assert silent.record_writes == ["updated"]
    stored = await get_record(bus, "late")
    assert stored.state == "allocated"


@pytest.mark.parametrize(
    ("competitor", "granted", "state_after"),
    [
        pytest.param(rewrite_unchanged, True, "allocated", id="record-touched-then-allocated"),
        pytest.param(allocate_first, False, "allocated", id="other-plugin-won"),
    ],
)
async def test_a_lost_compare_and_set_is_reread_and_planned_again(
    bus: NatsBus, competitor: Competitor, granted: bool, state_after: str
) -> None:
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, record("raced", container("main", share(0))))
    async with service_on(RacingBus(bus, competitor)) as (service, registry):
        result = await service.allocate([(f"{uuid(0)}::0",)])
    assert registry.get_sample_value("tessera_deviceplugin_record_conflicts_total") == 1
    stored = await get_record(bus, "raced")
    assert stored.state == state_after
    if granted:
        assert isinstance(result, list) and isinstance(result[0], ContainerGrant)
        assert len(stored.allocated) == 1
    else:
        assert isinstance(result, Refusal) and result.kind == "no_record"
        assert stored.allocated == (), "the loser wrote nothing"


async def test_device_list_is_resent_only_when_it_changes(bus: NatsBus) -> None:
    first = inventory(gpu(0, memory_mib=4096))
    await announce_inventory(bus, first)
    async with service_on(bus) as (service, _):
        lists = service.device_lists()
        initial = await anext(lists)
        assert [d.health for d in initial] == ["Healthy", "Healthy"]
        following = asyncio.ensure_future(anext(lists))
        heartbeat = msgspec.structs.replace(first, observed_at=first.observed_at + 10, sequence=2)
        await bus.publish(subjects.inventory(NODE), codec.encode(heartbeat))
        await asyncio.sleep(0.3)
        assert not following.done(), "an unchanged inventory sends no new list"
        sick = inventory(gpu(0, memory_mib=4096, health="unhealthy"), at=first.observed_at + 20)
        await bus.publish(subjects.inventory(NODE), codec.encode(sick))
        changed = await asyncio.wait_for(following, 5)
        assert [d.health for d in changed] == ["Unhealthy", "Unhealthy"]
        stale = inventory(gpu(0, memory_mib=4096), at=first.observed_at + 15)
        await bus.publish(subjects.inventory(NODE), codec.encode(stale))
        await asyncio.sleep(0.2)
        assert [d.health for d in service.devices] == ["Unhealthy", "Unhealthy"], (
            "an older snapshot arriving late is ignored"
        )
        await lists.aclose()  # type: ignore[attr-defined]


class UnreachableKvBus:
    """The real bus, except that compare-and-set fails as when NATS is unreachable."""

    def __init__(self, bus: NatsBus) -> None:
        self._bus = bus

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def kv_send(
        self,
        bucket: str,
        key: str,
        value: bytes,
        *,
        revision: int,
        create: bool = False,
        guard: str = "",
    ) -> bool:
        raise TimeoutError("nats: timeout")


async def test_a_bus_failure_during_the_write_is_a_refusal_not_a_crash(bus: NatsBus) -> None:
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, record("down", container("main", share(0))))
    async with service_on(UnreachableKvBus(bus)) as (service, _):
        result = await service.allocate([(f"{uuid(0)}::0",)])
    assert isinstance(result, Refusal) and result.kind == "unavailable"
    assert result.message == (
        f"cannot write the assignment record {subjects.assignment_key(NODE, 'down')}: NATS "
        "failed (TimeoutError: nats: timeout)"
    )
    assert (await get_record(bus, "down")).state == "bound"
