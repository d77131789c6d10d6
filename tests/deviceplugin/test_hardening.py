"""Issue 9 against the device plugin over a real nats-server: nothing a peer writes stops it,
records and inventory are never trusted blindly, one bad record never blocks a node.

Each test writes what an adversary (or a broken peer) could write, then checks the plugin's
answers, its dead letters and its health.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import msgspec
import pytest

from services.deviceplugin._proto import api_pb2
from services.deviceplugin.rules.allocate import ContainerGrant, Refusal
from services.deviceplugin.rules.devices import DeviceConfig
from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord
from shared.messages.deadletter import DeadLetter
from shared.runtime.bus import Delivery
from shared.runtime.edge import DEADLETTER_PAYLOAD_LIMIT
from shared.runtime.health import Readiness
from shared.runtime.nats import NatsBus
from tests.deviceplugin.builders import NODE, container, gpu, inventory, record, share, uuid
from tests.deviceplugin.conftest import PluginFactory, get_record, until
from tests.deviceplugin.fake_kubelet import FakeKubelet
from tests.deviceplugin.test_service import service_on
from tests.harness.clock import FakeClock
from tests.harness.kv import announce_inventory, put_committed

Letters = asyncio.Queue[DeadLetter]


async def dead_letters(bus: NatsBus, family: str) -> Letters:
    queue: Letters = asyncio.Queue()

    async def handler(delivery: Delivery) -> None:
        await queue.put(codec.decode(delivery.data, DeadLetter))

    await bus.subscribe(subjects.deadletter(family), handler)
    return queue


async def next_letter(letters: Letters) -> DeadLetter:
    return await asyncio.wait_for(letters.get(), timeout=10)


def device(index: int, ordinal: int = 0) -> tuple[str, ...]:
    return (f"{uuid(index)}::{ordinal}",)


def key(uid: str) -> str:
    return subjects.assignment_key(NODE, uid)


# --- 1. nothing a peer writes can stop the plugin ------------------------------------------------


async def test_an_oversized_bad_value_is_dead_lettered_truncated_and_the_plugin_stays_up(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    """~400 KB of control characters: as a dead letter (JSON-escaped six times over) it would
    exceed the server's 1 MiB payload limit. The plugin must survive it, on a KV key and on a
    subject alike, and go on allocating."""
    huge = b'{"pod_uid": "' + b"\x01" * 400_000 + b'"'
    assignments = await dead_letters(bus, "assignments")
    inventories = await dead_letters(bus, "inventory")
    await announce_inventory(bus, inventory(gpu(0)))
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        await bus.kv_put(subjects.KV_ASSIGNMENTS, key("huge"), huge)
        await bus.publish(subjects.inventory(NODE), huge)
        for letter in (await next_letter(assignments), await next_letter(inventories)):
            assert letter.payload_truncated and letter.payload_bytes == len(huge)
            assert len(letter.payload.encode()) <= DEADLETTER_PAYLOAD_LIMIT
            assert letter.payload.startswith('{"pod_uid": "\x01')
        await put_committed(bus, record("after", container("main", share(0))))
        response = await stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device(0))]
            ),
            timeout=10,
        )
        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuid(0)
        assert plugin.ready()
    # start_plugin asserts the plugin then stopped with exit code 0: it never crashed.


# --- 3. records are checked against the inventory and their key ---------------------------------


BAD_RECORDS: list[tuple[str, AssignmentRecord, str]] = [
    (
        "huge-memory",
        record("huge-memory", container("main", share(0, memory_mib=10_000_000))),
        "holds 10000000 MiB of GPU",
    ),
    (
        "negative-memory",
        record("negative-memory", container("main", share(0, memory_mib=-5))),
        "-5 MiB",
    ),
    ("cores-500", record("cores-500", container("main", share(0, cores=500))), "500 %"),
    (
        "negative-cores",
        record("negative-cores", container("main", share(0, cores=-1))),
        "-1 % of the SMs",
    ),
    (
        "wrong-index",
        record(
            "wrong-index",
            container("main", msgspec.structs.replace(share(0), index=3)),
        ),
        "at index 3, but it is index 0",
    ),
    (
        "same-gpu-twice",
        record("same-gpu-twice", container("main", share(0), share(0))),
        "more than once",
    ),
    (
        "count-mismatch",
        record("count-mismatch", container("main", share(0), devices=2)),
        "asks for 2 tessera.dev/gpu but the record gives it 1 GPU slice",
    ),
    (
        "key-mismatch",
        record("other-uid", container("main", share(0))),
        "does not match the record",
    ),
]


async def test_records_that_cannot_be_believed_are_dead_lettered_and_never_served(
    bus: NatsBus,
) -> None:
    letters = await dead_letters(bus, "assignments")
    await announce_inventory(bus, inventory(gpu(0, memory_mib=81_920)))
    async with service_on(bus) as (service, registry):
        for uid, bad, _ in BAD_RECORDS:
            await bus.kv_put(subjects.KV_ASSIGNMENTS, key(uid), codec.encode(bad))
        reasons = {}
        for _ in BAD_RECORDS:
            letter = await next_letter(letters)
            reasons[letter.subject.rsplit(".", 1)[1]] = letter.reason
        for uid, _, says in BAD_RECORDS:
            assert says in reasons[uid], (uid, reasons[uid])
        for count in (1, 2):
            result = await service.allocate([tuple(f"{uuid(0)}::{n}" for n in range(count))])
            assert isinstance(result, Refusal) and result.kind == "no_record", result
        rejected = registry.get_sample_value(
            "tessera_messages_rejected_total", {"family": "assignments", "kind": "validate"}
        )
        assert rejected == len(BAD_RECORDS)


# --- 4. records only move forward ---------------------------------------------------------------


async def regress_to_bound(bus: NatsBus, uid: str) -> None:
    """Rewrite an allocated record as a fresh bound one (what a confused or hostile writer does)."""
    stored = await get_record(bus, uid)
    await bus.kv_put(
        subjects.KV_ASSIGNMENTS,
        key(uid),
        codec.encode(
            msgspec.structs.replace(stored, state="bound", allocated=(), allocated_at=None)
        ),
    )


async def release_then_bind_again(bus: NatsBus, uid: str) -> None:
    stored = await get_record(bus, uid)
    released = msgspec.structs.replace(stored, state="released", released_at=1_700_000_500.0)
    await bus.kv_put(subjects.KV_ASSIGNMENTS, key(uid), codec.encode(released))
    await bus.kv_put(
        subjects.KV_ASSIGNMENTS,
        key(uid),
        codec.encode(
            msgspec.structs.replace(stored, state="bound", allocated=(), allocated_at=None)
        ),
    )


@pytest.mark.parametrize(
    ("rewrite", "says"),
    [
        pytest.param(regress_to_bound, "state moved backwards: allocated -> bound", id="allocated"),
        pytest.param(
            release_then_bind_again, "state moved backwards: released -> bound", id="released"
        ),
    ],
)
async def test_a_record_moved_backwards_is_refused_and_served_once_only(
    bus: NatsBus, rewrite: Callable[[NatsBus, str], Awaitable[None]], says: str
) -> None:
    letters = await dead_letters(bus, "assignments")
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, record("once", container("main", share(0))))
    async with service_on(bus) as (service, _):
        assert isinstance((await service.allocate([device(0)]))[0], ContainerGrant)  # type: ignore[index]
        await rewrite(bus, "once")
        letter = await next_letter(letters)
        assert says in letter.reason
        again = await service.allocate([device(0, 1)])
        assert isinstance(again, Refusal) and again.kind == "no_record", again


# --- 5. one bad record never blocks a node -----------------------------------------------------


async def test_a_record_of_a_vanished_gpu_does_not_block_a_valid_newer_one(bus: NatsBus) -> None:
    letters = await dead_letters(bus, "assignments")
    await announce_inventory(bus, inventory(gpu(0), gpu(1)))
    await put_committed(bus, record("old", container("main", share(1)), bound_at=1_700_000_100.0))
    await put_committed(bus, record("new", container("main", share(0)), bound_at=1_700_000_200.0))
    async with service_on(bus) as (service, _):
        await announce_inventory(bus, inventory(gpu(0), at=1_700_000_300.0))  # GPU 1 is gone
        letter = await next_letter(letters)
        assert f"names GPU {uuid(1)}, which node {NODE} does not list" in letter.reason
        result = await service.allocate([device(0)])
        assert isinstance(result, list) and isinstance(result[0], ContainerGrant), result
        assert result[0].annotations["tessera.dev/pod-uid"] == "new"
    assert (await get_record(bus, "new")).state == "allocated"


async def test_a_record_rewritten_to_another_node_is_forgotten_not_retried(bus: NatsBus) -> None:
    letters = await dead_letters(bus, "assignments")
    await announce_inventory(bus, inventory(gpu(0)))
    await put_committed(bus, record("moved", container("main", share(0))))
    async with service_on(bus) as (service, registry):
        stored = await get_record(bus, "moved")
        await bus.kv_put(
            subjects.KV_ASSIGNMENTS,
            key("moved"),
            codec.encode(msgspec.structs.replace(stored, node="gpu-node-2.example.com")),
        )
        assert "does not match the record" in (await next_letter(letters)).reason
        result = await service.allocate([device(0)])
        assert isinstance(result, Refusal) and result.kind == "no_record", result
        assert registry.get_sample_value("tessera_deviceplugin_record_conflicts_total") == 0


# --- 6. inventory is bounded ---------------------------------------------------------------------


async def test_inventory_that_cannot_be_believed_is_dead_lettered_and_real_snapshots_win(
    bus: NatsBus,
) -> None:
    letters = await dead_letters(bus, "inventory")
    real = msgspec.structs.replace(
        inventory(gpu(0), at=1_700_000_000.0), producer="node/1/1.0", sequence=5
    )
    await announce_inventory(bus, real)
    async with service_on(bus) as (service, _):
        ten_years = msgspec.structs.replace(
            inventory(gpu(7), at=real.observed_at), observed_at=4_000_000_000.0, producer="fake"
        )
        absurd = msgspec.structs.replace(
            inventory(gpu(0, memory_mib=10**12), at=1_700_000_010.0), producer="fake2"
        )
        foreign = inventory(gpu(3), node="gpu-node-2.example.com", at=1_700_000_020.0)
        for bad in (ten_years, absurd, foreign):
            await bus.publish(subjects.inventory(NODE), codec.encode(bad))
        reasons = [(await next_letter(letters)).reason for _ in range(3)]
        assert "s ahead of this clock" in reasons[0]
        assert "1000000000000 MiB of memory" in reasons[1]
        assert (
            "inventory of node 'gpu-node-2.example.com' on the subject or key of node"
            in (reasons[2])
        )
        assert {d.gpu_uuid for d in service.devices} == {uuid(0)}

        # A replay of the same producer's older snapshot is ignored. (The foreign snapshot after
        # it is a marker: its dead letter means the replay was handled.)
        replayed = msgspec.structs.replace(
            inventory(gpu(0), gpu(5), at=1_699_999_990.0), producer=real.producer, sequence=4
        )
        for message in (replayed, foreign):
            await bus.publish(subjects.inventory(NODE), codec.encode(message))
        await next_letter(letters)
        assert service.inventory == real
        # A restarted inventory (a new producer, sequence 1 again) wins by being later.
        restarted = msgspec.structs.replace(
            inventory(gpu(0), gpu(1), at=1_700_000_060.0), producer="node/2/60.0", sequence=1
        )
        await bus.publish(subjects.inventory(NODE), codec.encode(restarted))
        await until(lambda: service.inventory == restarted, what="the restarted producer")
        assert {d.gpu_uuid for d in service.devices} == {uuid(0), uuid(1)}


async def test_a_forged_snapshot_in_the_inventorys_name_cannot_keep_its_devices_unhealthy(
    bus: NatsBus,
) -> None:
    """Issue 19: a snapshot naming the node's inventory with sequence 2**62 marked every device
    Unhealthy until the inventory restarted (its own sequences never caught up). Now no producer
    can send that sequence, and a forgery the bounds let through holds only until the
    inventory's next snapshot, which is fresher."""
    letters = await dead_letters(bus, "inventory")
    at = 1_700_000_000.0
    honest = msgspec.structs.replace(
        inventory(gpu(0), gpu(1), at=at), producer="node/1/1.0", sequence=5
    )
    await announce_inventory(bus, honest)
    sick = (
        gpu(0, health="unhealthy", reason="XID 79"),
        gpu(1, health="unhealthy", reason="XID 79"),
    )
    async with service_on(bus) as (service, _):

        def healthy() -> list[bool]:
            return [d.healthy for d in service.devices]

        assert healthy() and all(healthy())
        forged = msgspec.structs.replace(
            inventory(*sick, at=at + 10), producer=honest.producer, sequence=2**62
        )
        await bus.publish(subjects.inventory(NODE), codec.encode(forged))
        letter = await next_letter(letters)
        assert letter.reason == f"sequence {2**62} outside 0..{2**53 - 1}"
        assert all(healthy()) and service.inventory == honest

        believable = msgspec.structs.replace(forged, sequence=2**53 - 1)
        await bus.publish(subjects.inventory(NODE), codec.encode(believable))
        await until(lambda: not any(healthy()), what="the forgery believed (no reader can tell)")
        heartbeat = msgspec.structs.replace(honest, sequence=6, observed_at=at + 30)
        await bus.publish(subjects.inventory(NODE), codec.encode(heartbeat))
        await until(lambda: all(healthy()), what="the inventory's next snapshot taken back")
        assert service.inventory == heartbeat


async def test_a_device_list_too_large_for_the_kubelet_is_refused_before_it_is_built(
    bus: NatsBus,
) -> None:
    """1 TiB in 1 MiB units would be a million devices: refused with the fix, nothing built."""
    await announce_inventory(bus, inventory(gpu(0, memory_mib=1 << 20)))
    readiness = Readiness()
    config = DeviceConfig(mode="memory-units")
    async with service_on(bus, devices=config, readiness=readiness, ready=lambda: True) as (
        service,
        _,
    ):
        await until(lambda: "devices" in readiness.report(), what="the device list decided")
        ready, reason = readiness.report()["devices"]
        assert not ready
        assert reason.startswith("1048576 devices make a ListAndWatch message of about")
        assert "raise --memory-unit-mib to at least" in reason
        assert service.devices == ()


async def test_an_unset_memory_unit_is_the_smallest_the_kubelet_takes_and_is_shown(
    bus: NatsBus,
) -> None:
    """4 x 16 GiB in 1 MiB devices is too large a message: unset, the unit is 2 MiB, the
    devices are advertised, and /readyz says which unit."""
    await announce_inventory(bus, inventory(*(gpu(i, memory_mib=16_384) for i in range(4))))
    readiness = Readiness()
    config = DeviceConfig(mode="memory-units", memory_unit_mib=0)
    async with service_on(bus, devices=config, readiness=readiness, ready=lambda: True) as (
        service,
        _,
    ):
        await until(lambda: "devices" in readiness.report(), what="the device list decided")
        assert readiness.report()["devices"] == (True, "32768 devices of 2 MiB")
        assert len(service.devices) == 4 * 16_384 // 2


# --- 7. unhealthy and departed GPUs ---------------------------------------------------------------


async def test_an_unhealthy_gpu_is_not_granted_and_does_not_block_a_healthy_one(
    bus: NatsBus,
) -> None:
    await announce_inventory(bus, inventory(gpu(0, health="unhealthy", reason="XID 79"), gpu(1)))
    await put_committed(bus, record("sick", container("main", share(0)), bound_at=1_700_000_100.0))
    async with service_on(bus) as (service, _):
        refused = await service.allocate([device(1)])
        assert isinstance(refused, Refusal) and refused.kind == "unavailable"
        assert f"GPU {uuid(0)} (unhealthy: XID 79)" in refused.message
        await put_committed(
            bus, record("well", container("main", share(1)), bound_at=1_700_000_200.0)
        )
        await until(
            lambda: any(view.record.pod_uid == "well" for view in service.held_records),
            what="the healthy record",
        )
        granted = await service.allocate([device(1)])
        assert isinstance(granted, list) and granted[0].annotations["tessera.dev/pod-uid"] == "well"
    assert (await get_record(bus, "sick")).state == "bound", "the sick one waits, not allocated"


async def test_device_ids_of_a_gpu_no_longer_listed_are_refused(bus: NatsBus) -> None:
    await announce_inventory(bus, inventory(gpu(0), gpu(1)))
    await put_committed(bus, record("r", container("main", share(0))))
    async with service_on(bus) as (service, _):
        await announce_inventory(bus, inventory(gpu(0), at=1_700_000_300.0))
        await until(lambda: {d.gpu_uuid for d in service.devices} == {uuid(0)}, what="GPU 1 gone")
        result = await service.allocate([device(1)])
        assert isinstance(result, Refusal) and result.kind == "invalid"
        assert result.message == (
            f"device IDs no longer advertised (their GPU left the node's inventory): {uuid(1)}::0"
        )
    assert (await get_record(bus, "r")).state == "bound"


async def test_grpc_refusals_reach_the_kubelet_with_the_reason(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, inventory(gpu(0, health="unhealthy", reason="XID 48")))
    await put_committed(bus, record("sick", container("main", share(0))))
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device(0))]
                ),
                timeout=10,
            )
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "(unhealthy: XID 48)" in (refused.value.details() or "")


# --- also: what /metrics says about records and inventory ---------------------------------------


async def test_metrics_count_records_held_and_the_inventory_age(
    bus: NatsBus, clock: FakeClock
) -> None:
    observed = clock.now() - 12.0
    await announce_inventory(bus, inventory(gpu(0), at=observed))
    await put_committed(bus, record("a", container("main", share(0))))
    await put_committed(bus, record("b", container("main", share(0)), bound_at=1_700_000_200.0))
    async with service_on(bus, clock) as (service, registry):

        def held(state: str) -> float | None:
            return registry.get_sample_value("tessera_deviceplugin_records", {"state": state})

        await until(lambda: held("bound") == 2, what="two bound records counted")
        assert isinstance(await service.allocate([device(0)]), list)
        assert (held("bound"), held("allocated")) == (1, 1)
        age = registry.get_sample_value("tessera_deviceplugin_inventory_age_seconds")
        assert age == pytest.approx(12.0)
        await clock.advance(30)
        age = registry.get_sample_value("tessera_deviceplugin_inventory_age_seconds")
        assert age == pytest.approx(42.0)
