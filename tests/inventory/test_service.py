"""The service shell against a real nats-server, with the fake reader and a fake clock.

What a placer relies on: snapshots arrive on ``tessera.inventory.<node>``, the KV bucket holds the
latest one, noise inside the deadbands is not published, the heartbeat still arrives, health events
are published at once, readiness follows the reader, and a failed send is retried, not lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

import aiohttp
import pytest

from services.inventory.command import InventorySettings, inventory_body
from services.inventory.fake import FakeReader, parse_fake_gpus
from services.inventory.reader import HealthEvent, NodeReadError, NodeReading
from shared import codec, subjects
from shared.messages.inventory import NodeInventory
from shared.runtime.bus import Bus
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import ServiceContext, run_service
from shared.runtime.nats import NatsBus
from tests.harness.clock import FakeClock
from tests.harness.nats import NatsServer
from tests.inventory.helpers import NODE, Inbox, harness, running


async def latest_in_kv(bus: NatsBus) -> NodeInventory:
    entry = await bus.kv_get(subjects.KV_INVENTORY, subjects.node_token(NODE))
    assert entry is not None
    return codec.decode(entry.value, NodeInventory)


@pytest.fixture
def reader() -> FakeReader:
    return FakeReader(parse_fake_gpus("2xA100-80GB"), node=NODE)


async def test_snapshots_reach_subscribers_and_the_kv_bucket(
    reader: FakeReader, bus: NatsBus, clock: FakeClock
) -> None:
    inbox = await Inbox(bus, NODE).start()
    async with running(harness(reader=reader, bus=bus, clock=clock)):
        first = await inbox.next()
        assert (first.node, first.sequence, first.backend, first.observed_at) == (
            NODE,
            1,
            "fake",
            clock.now(),
        )
        assert [(g.uuid, g.model, g.memory_total_mib, g.health) for g in first.gpus] == [
            (uuid, "A100-80GB", 81920, "healthy") for uuid in reader.uuids
        ]
        assert await latest_in_kv(bus) == first


async def test_noise_waits_for_the_heartbeat_and_a_real_change_goes_out_at_once(
    reader: FakeReader, bus: NatsBus, clock: FakeClock
) -> None:
    inbox = await Inbox(bus, NODE).start()
    async with running(harness(reader=reader, bus=bus, clock=clock)) as rig:
        assert (await inbox.next()).sequence == 1

        # Inside every deadband (the fake's power and temperature follow its utilisation).
        for utilization, used in ((3, 100), (2, 256), (1, 10)):
            reader.set_load(0, utilization_pct=utilization, memory_used_mib=used)
            await rig.tick(10)
        assert await inbox.settle() == []
        assert (await latest_in_kv(bus)).sequence == 1

        reader.set_load(1, memory_used_mib=40_000)
        await rig.tick(10)
        changed = await inbox.next()
        assert (changed.sequence, changed.gpus[1].memory_used_mib) == (2, 40_000)
        assert await latest_in_kv(bus) == changed
        gpu = changed.gpus[1]
        labels = {"uuid": gpu.uuid, "index": "1", "model": gpu.model}
        shown = {
            "tessera_gpu_memory_used_mib": 40_000,
            "tessera_gpu_memory_total_mib": gpu.memory_total_mib,
            "tessera_gpu_utilization_percent": gpu.utilization_pct,
            "tessera_gpu_temperature_celsius": gpu.temperature_c,
            "tessera_gpu_power_watts": gpu.power_w,
        }
        assert {name: rig.sample(name, **labels) for name in shown} == shown

        for _ in range(29):  # nothing new for 290 s: still quiet
            await rig.tick(10)
        assert await inbox.settle() == []
        await rig.tick(10)  # 300 s after the last publication: the heartbeat
        beat = await inbox.next()
        assert (beat.sequence, beat.observed_at, beat.gpus) == (3, clock.now(), changed.gpus)
        assert rig.sample("tessera_inventory_publications_total", reason="heartbeat") == 1
        assert rig.sample("tessera_inventory_publications_total", reason="changed") == 1


async def test_a_critical_event_is_published_without_waiting_for_a_poll(
    reader: FakeReader, bus: NatsBus, clock: FakeClock
) -> None:
    inbox = await Inbox(bus, NODE).start()
    async with running(harness(reader=reader, bus=bus, clock=clock)) as rig:
        await inbox.next()
        reader.inject(1, xid=48)
        marked = await inbox.next()
        assert [(g.health, g.health_reason) for g in marked.gpus] == [
            ("healthy", ""),
            ("unhealthy", "XID 48: double-bit ECC error"),
        ]
        assert await latest_in_kv(bus) == marked
        labels = {"uuid": reader.uuids[1], "index": "1", "model": "A100-80GB"}
        assert rig.sample("tessera_gpu_health", **labels, state="unhealthy") == 1
        assert rig.sample("tessera_gpu_health", **labels, state="healthy") == 0


class FlakyReader:
    """A fake reader whose whole-node reads fail while ``failure`` is set."""

    def __init__(self, inner: FakeReader) -> None:
        self.inner = inner
        self.failure = ""

    @property
    def backend(self) -> str:
        return self.inner.backend

    async def open(self) -> None:
        await self.inner.open()

    async def read(self) -> NodeReading:
        if self.failure:
            raise NodeReadError(self.failure)
        return await self.inner.read()

    async def wait_event(self, timeout_s: float) -> HealthEvent | None:
        return await self.inner.wait_event(timeout_s)

    async def close(self) -> None:
        await self.inner.close()


async def test_readiness_follows_the_reader(
    reader: FakeReader, bus: NatsBus, clock: FakeClock
) -> None:
    flaky = FlakyReader(reader)
    async with running(harness(reader=flaky, bus=bus, clock=clock)) as rig:
        assert rig.readiness.report()["gpus"] == (True, "")
        flaky.failure = "NVML cannot list GPUs: Driver Not Loaded"
        await rig.tick(10)
        assert rig.readiness.report()["gpus"] == (False, "NVML cannot list GPUs: Driver Not Loaded")
        assert rig.sample("tessera_inventory_read_failures_total") == 1
        flaky.failure = ""
        await rig.tick(10)
        assert rig.readiness.report()["gpus"] == (True, "")


class FailingBus:
    """The real bus, except that the next ``failures`` core publishes raise."""

    def __init__(self, inner: NatsBus, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    @property
    def connected(self) -> bool:
        return self.inner.connected

    async def publish(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionResetError("nats: connection closed")
        await self.inner.publish(subject, data, headers=headers)

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        return await self.inner.kv_put(bucket, key, value)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_a_failed_send_is_decided_again_at_the_next_poll(
    reader: FakeReader, bus: NatsBus, clock: FakeClock
) -> None:
    inbox = await Inbox(bus, NODE).start()
    failing: Bus = FailingBus(bus, failures=1)  # type: ignore[assignment]
    async with running(harness(reader=reader, bus=failing, clock=clock)) as rig:
        assert await inbox.settle() == []
        assert rig.sample("tessera_inventory_publish_failures_total") == 1
        await rig.tick(10)
        retried = await inbox.next()
        assert retried.sequence == 1  # nothing was sent under the failed attempt's number
        assert rig.sample("tessera_inventory_publications_total", reason="first") == 1


class KvCheckingBus:
    """The real bus; each core publish first notes whether the node's KV entry already holds
    exactly what is being published."""

    def __init__(self, inner: NatsBus) -> None:
        self.inner = inner
        self.kv_current_at_publish: list[bool] = []

    async def publish(
        self, subject: str, data: bytes, *, headers: Mapping[str, str] | None = None
    ) -> None:
        entry = await self.inner.kv_get(subjects.KV_INVENTORY, subjects.node_token(NODE))
        self.kv_current_at_publish.append(entry is not None and entry.value == data)
        await self.inner.publish(subject, data, headers=headers)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_whoever_the_subject_wakes_finds_the_same_snapshot_in_kv(
    reader: FakeReader, bus: NatsBus, clock: FakeClock
) -> None:
    # It published first and wrote KV second: a subscriber reading KV on the news could read
    # the snapshot before (seen in CI as a heartbeat whose KV entry was one sequence behind).
    checking = KvCheckingBus(bus)
    inbox = await Inbox(bus, NODE).start()
    rig = harness(reader=reader, bus=checking, clock=clock)  # type: ignore[arg-type]
    async with running(rig):
        assert (await inbox.next()).sequence == 1
        reader.set_load(1, memory_used_mib=40_000)  # a real change: published at once
        await rig.tick(10)
        assert (await inbox.next()).sequence == 2
    assert checking.kv_current_at_publish == [True, True]


async def test_runs_under_the_service_runtime_with_health_and_metrics_over_http(
    nats_server: NatsServer, bus: NatsBus, reader: FakeReader
) -> None:
    """The body as ``tessera inventory`` runs it: run_service, real HTTP, a stop like SIGTERM."""
    inbox = await Inbox(bus, NODE).start()
    settings = InventorySettings(
        nats_url=nats_server.url,
        http_host="127.0.0.1",
        http_port=0,
        log_format="text",
        node=NODE,
        backend="fake",
        fake_gpus="2xA100-80GB",
    )
    stop = asyncio.Event()
    readiness = Readiness()
    await reader.open()

    async def body(context: ServiceContext) -> None:
        await inventory_body(
            context,
            reader=reader,
            settings=settings,
            node=NODE,
        )

    task = asyncio.create_task(
        run_service(name="inventory", settings=settings, body=body, stop=stop, readiness=readiness)
    )
    try:
        await inbox.next()
        port = readiness.http_port
        counted = 'tessera_inventory_publications_total{reason="first"} 1.0'
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                assert response.status == 200
                checks = (await response.json())["checks"]
            # The subject carries the snapshot before the KV put finishes and the publication is
            # counted: poll for the count rather than race it.
            for _ in range(500):
                async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                    metrics = await response.text()
                if counted in metrics:
                    break
                await asyncio.sleep(0.01)
        assert checks["gpus"] == {"ready": True, "reason": ""}
        uuid = reader.uuids[0]
        assert (
            f'tessera_gpu_memory_total_mib{{index="0",model="A100-80GB",uuid="{uuid}"}} 81920.0'
        ) in metrics
        assert counted in metrics
    finally:
        stop.set()
        assert await asyncio.wait_for(task, timeout=10) == 0
        with contextlib.suppress(Exception):
            await reader.close()
