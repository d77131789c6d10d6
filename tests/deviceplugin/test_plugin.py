"""The device plugin end to end: a fake kubelet over real unix-socket gRPC, a real nats-server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.deviceplugin._proto import api_pb2
from shared import codec, subjects
from shared.messages.deadletter import DeadLetter
from shared.runtime.bus import Delivery
from shared.runtime.nats import NatsBus
from tests.deviceplugin.builders import (
    MEMORY_RESOURCE,
    NODE,
    container,
    gpu,
    inventory,
    record,
    share,
    uuid,
)
from tests.deviceplugin.conftest import PluginFactory, get_record, until
from tests.deviceplugin.fake_kubelet import FakeKubelet
from tests.harness.kv import announce_inventory, put_committed

TWO_GPUS = inventory(gpu(0, memory_mib=4096, numa=0), gpu(1, memory_mib=8192, numa=1))


def ids(index: int, *ordinals: int) -> list[str]:
    return [f"{uuid(index)}::{n}" for n in ordinals]


def allocate_request(*containers: list[str]) -> Any:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )


async def allocate(stub: Any, device_ids: list[str]) -> Any:
    response = await stub.Allocate(allocate_request(device_ids), timeout=5)
    assert len(response.container_responses) == 1
    return response.container_responses[0]


# --- registration and ListAndWatch ----------------------------------------------------------


async def test_registers_and_lists_every_device_with_numa_topology(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    async with start_plugin() as plugin:
        registration = await kubelet.registered()
        assert (registration.version, registration.endpoint, registration.resource_name) == (
            "v1beta1",
            "tessera-logical.sock",
            "tessera.dev/gpu",
        )
        assert registration.options.get_preferred_allocation_available
        assert not registration.options.pre_start_required
        async with kubelet.plugin(plugin.endpoint) as stub:
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
            assert options.get_preferred_allocation_available
            stream = stub.ListAndWatch(api_pb2.Empty())
            first = await asyncio.wait_for(stream.read(), 5)
            stream.cancel()
    # 4096 MiB -> 2 logical devices, 8192 MiB -> 4 (one per 2048 MiB).
    assert [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in first.devices] == [
        *[(i, "Healthy", [0]) for i in ids(0, 0, 1)],
        *[(i, "Healthy", [1]) for i in ids(1, 0, 1, 2, 3)],
    ]


async def test_list_and_watch_sends_a_new_list_after_a_health_change(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        stream = stub.ListAndWatch(api_pb2.Empty())
        first = await asyncio.wait_for(stream.read(), 5)
        assert {d.health for d in first.devices} == {"Healthy"}
        sick = inventory(
            gpu(0, memory_mib=4096, numa=0),
            gpu(1, memory_mib=8192, numa=1, health="unhealthy", reason="XID 79"),
            at=TWO_GPUS.observed_at + 5,
        )
        await bus.publish(subjects.inventory(NODE), codec.encode(sick))
        second = await asyncio.wait_for(stream.read(), 5)
        stream.cancel()
    assert {d.ID: d.health for d in second.devices} == {
        **{i: "Healthy" for i in ids(0, 0, 1)},
        **{i: "Unhealthy" for i in ids(1, 0, 1, 2, 3)},
    }


async def test_kubelet_restart_reregisters_without_losing_assignment_state(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    await put_committed(bus, record("before", container("main", share(0)), bound_at=100.0))
    await put_committed(bus, record("after", container("main", share(1)), bound_at=200.0))
    async with start_plugin() as plugin:
        await kubelet.registered()
        async with kubelet.plugin(plugin.endpoint) as stub:
            granted = await allocate(stub, ids(1, 3))
            assert granted.envs["NVIDIA_VISIBLE_DEVICES"] == uuid(0)

        await kubelet.restart()
        again = await kubelet.registered()
        assert again.endpoint == plugin.endpoint
        await until(lambda: plugin.check("kubelet")[0], what="registered again")
        assert (plugin.config.plugin_dir / plugin.endpoint).exists()

        async with kubelet.plugin(plugin.endpoint) as stub:
            stream = stub.ListAndWatch(api_pb2.Empty())
            listed = await asyncio.wait_for(stream.read(), 5)
            stream.cancel()
            assert len(listed.devices) == 6
            # The record allocated before the restart stays so; the next one is answered.
            granted = await allocate(stub, ids(0, 0))
            assert granted.envs["NVIDIA_VISIBLE_DEVICES"] == uuid(1)
    assert (await get_record(bus, "before")).state == "allocated"
    assert len((await get_record(bus, "before")).allocated) == 1
    assert (await get_record(bus, "after")).state == "allocated"


async def test_refused_registration_is_retried_and_shown_on_readyz(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    kubelet.refuse = "resource tessera.dev/gpu is already registered"
    async with start_plugin(wait_ready=False) as plugin:
        await until(
            lambda: "already registered" in plugin.check("kubelet")[1],
            what="the refusal on readiness",
        )
        assert not plugin.ready()
        kubelet.refuse = ""
        await kubelet.registered()
        await until(plugin.ready, what="ready after the kubelet accepts")


async def test_not_ready_until_the_kubelet_answers_the_registration(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    # Inventory and records are ready at once; a slow Register must still keep /readyz false
    # (it said ready before the plugin socket was served, and an Allocate then found no socket).
    await announce_inventory(bus, TWO_GPUS)
    kubelet.answer_registrations.clear()
    async with start_plugin(wait_ready=False) as plugin:
        await until(lambda: kubelet.register_calls == 1, what="a registration under way")
        await until(
            lambda: plugin.check("inventory")[0] and plugin.check("records")[0],
            what="inventory and records ready",
        )
        assert plugin.check("kubelet") == (False, "not registered with the kubelet yet")
        assert not plugin.ready()
        kubelet.answer_registrations.set()
        await kubelet.registered()
        await until(plugin.ready, what="ready once the kubelet answers")


# --- Allocate -------------------------------------------------------------------------------


async def test_single_container_pod_is_allocated_from_its_record(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    await put_committed(bus, record("solo", container("main", share(1, memory_mib=3000, cores=25))))
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        granted = await allocate(stub, ids(0, 1))  # the kubelet picked a device of GPU 0
    assert dict(granted.envs) == {
        "NVIDIA_VISIBLE_DEVICES": uuid(1),
        "TESSERA_GPU_MEMORY_LIMIT_MIB": "3000",
        "TESSERA_GPU_MEMORY_TOTAL_MIB": "8192",
        "TESSERA_GPU_CORES": "25",
    }
    assert dict(granted.annotations) == {
        "tessera.dev/pod-uid": "solo",
        "tessera.dev/container": "main",
    }
    stored = await get_record(bus, "solo")
    assert stored.state == "allocated"
    assert [(a.container, a.device_ids) for a in stored.allocated] == [("main", tuple(ids(0, 1)))]


async def test_multi_container_pod_is_answered_container_by_container(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    await put_committed(
        bus,
        record(
            "multi",
            container("trainer", share(0, memory_mib=1024), share(1, memory_mib=2048)),
            container("logger"),  # no GPU: the kubelet never calls Allocate for it
            container("evaluator", share(1, memory_mib=512)),
        ),
    )
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        trainer = await allocate(stub, ids(1, 0, 1))
        assert (await get_record(bus, "multi")).state == "bound"
        evaluator = await allocate(stub, ids(0, 0))
    assert trainer.envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuid(0)},{uuid(1)}"
    assert trainer.envs["TESSERA_GPU_MEMORY_LIMIT_MIB"] == "1024,2048"
    assert evaluator.envs["NVIDIA_VISIBLE_DEVICES"] == uuid(1)
    assert evaluator.envs["TESSERA_GPU_MEMORY_LIMIT_MIB"] == "512"
    stored = await get_record(bus, "multi")
    assert stored.state == "allocated"
    assert [a.container for a in stored.allocated] == ["trainer", "evaluator"]


async def test_two_same_size_pods_each_get_their_own_decided_gpu(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    await put_committed(bus, record("first", container("main", share(1)), bound_at=100.0))
    await put_committed(bus, record("second", container("main", share(0)), bound_at=200.0))
    everything = [*ids(0, 0, 1), *ids(1, 0, 1, 2, 3)]
    preferred_request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=everything, allocation_size=1
            )
        ]
    )
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        steer = await stub.GetPreferredAllocation(preferred_request, timeout=5)
        assert list(steer.container_responses[0].deviceIDs) == ids(1, 0)
        first = await allocate(stub, ids(1, 0))
        steer = await stub.GetPreferredAllocation(preferred_request, timeout=5)
        assert list(steer.container_responses[0].deviceIDs) == ids(0, 0)
        # Even when the kubelet ignores the preference, the record decides the GPU.
        second = await allocate(stub, ids(1, 1))
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == uuid(1)
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == uuid(0)
    assert (await get_record(bus, "first")).allocated[0].device_ids == tuple(ids(1, 0))
    assert (await get_record(bus, "second")).allocated[0].device_ids == tuple(ids(1, 1))


async def test_memory_units_mode_advertises_units_and_allocates_by_memory(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, inventory(gpu(0, memory_mib=2048), gpu(1, memory_mib=1024)))
    await put_committed(
        bus,
        record(
            "mem", container("main", share(1, memory_mib=768), devices=3, resource=MEMORY_RESOURCE)
        ),
    )
    async with start_plugin(mode="memory-units", memory_unit_mib=256) as plugin:
        registration = await kubelet.registered()
        assert (registration.resource_name, registration.endpoint) == (
            MEMORY_RESOURCE,
            "tessera-memory-units.sock",
        )
        async with kubelet.plugin(plugin.endpoint) as stub:
            stream = stub.ListAndWatch(api_pb2.Empty())
            listed = await asyncio.wait_for(stream.read(), 5)
            stream.cancel()
            assert len(listed.devices) == 2048 // 256 + 1024 // 256
            steer = await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[d.ID for d in listed.devices], allocation_size=3
                        )
                    ]
                ),
                timeout=5,
            )
            assert list(steer.container_responses[0].deviceIDs) == ids(1, 0, 1, 2)
            granted = await allocate(stub, ids(1, 0, 1, 2))
    assert granted.envs["NVIDIA_VISIBLE_DEVICES"] == uuid(1)
    assert granted.envs["TESSERA_GPU_MEMORY_LIMIT_MIB"] == "768"
    assert granted.envs["TESSERA_GPU_MEMORY_TOTAL_MIB"] == "1024"


@pytest.mark.parametrize(
    ("overrides", "envs", "mounts"),
    [
        pytest.param({}, {}, [], id="none"),
        pytest.param(
            {"isolation": "mps", "mps_pipe_dir": "/run/nvidia/mps"},
            {
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{uuid(1)}=3000M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
            },
            [("/tmp/nvidia-mps", "/run/nvidia/mps", False)],
            id="mps",
        ),
        pytest.param(
            {
                "isolation": "hami-core",
                "hami_core_library": "/opt/hami/libvgpu.so",
                "compat_envs": ("volcano", "aliyun"),
            },
            {
                "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
                "CUDA_DEVICE_SM_LIMIT": "25",
                "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so",
                "VOLCANO_GPU_ALLOCATED": "3000",
                "VOLCANO_GPU_MEMORY_TOTAL": "8192",
                "ALIYUN_COM_GPU_MEM_IDX": "1",
                "ALIYUN_COM_GPU_MEM_POD": "3000",
                "ALIYUN_COM_GPU_MEM_CONTAINER": "3000",
                "ALIYUN_COM_GPU_MEM_DEV": "8192",
            },
            [("/usr/local/vgpu/libvgpu.so", "/opt/hami/libvgpu.so", True)],
            id="hami-core-with-compat",
        ),
    ],
)
async def test_isolation_provider_variables_and_mounts(
    bus: NatsBus,
    kubelet: FakeKubelet,
    start_plugin: PluginFactory,
    overrides: dict[str, Any],
    envs: dict[str, str],
    mounts: list[tuple[str, str, bool]],
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    await put_committed(bus, record("iso", container("main", share(1, memory_mib=3000, cores=25))))
    async with start_plugin(**overrides) as plugin, kubelet.plugin(plugin.endpoint) as stub:
        granted = await allocate(stub, ids(1, 2))
    assert dict(granted.envs) == {
        "NVIDIA_VISIBLE_DEVICES": uuid(1),
        "TESSERA_GPU_MEMORY_LIMIT_MIB": "3000",
        "TESSERA_GPU_MEMORY_TOTAL_MIB": "8192",
        "TESSERA_GPU_CORES": "25",
        **envs,
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in granted.mounts] == mounts


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_ids", "code", "message"),
    [
        pytest.param(
            ids(0, 0, 1),
            grpc.StatusCode.FAILED_PRECONDITION,
            f"no bound assignment record on node {NODE} has a next container needing exactly 2 "
            "tessera.dev/gpu devices; bound pods waiting: ml/pod-one container main needs 1",
            id="no-record-of-that-size",
        ),
        pytest.param(
            ["GPU-not-here::0"],
            grpc.StatusCode.INVALID_ARGUMENT,
            "device IDs this plugin never advertised: GPU-not-here::0",
            id="never-advertised",
        ),
    ],
)
async def test_allocate_errors_say_what_is_missing(
    bus: NatsBus,
    kubelet: FakeKubelet,
    start_plugin: PluginFactory,
    device_ids: list[str],
    code: grpc.StatusCode,
    message: str,
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    await put_committed(bus, record("one", container("main", share(0))))
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Allocate(allocate_request(device_ids), timeout=5)
    assert refused.value.code() == code
    assert refused.value.details() == message
    assert (await get_record(bus, "one")).state == "bound", "nothing was allocated"


async def test_allocate_waits_for_a_record_the_binder_writes_late(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    async with start_plugin(record_wait_s=5.0) as plugin, kubelet.plugin(plugin.endpoint) as stub:
        call = asyncio.create_task(allocate(stub, ids(0, 0)))
        await asyncio.sleep(0.2)
        assert not call.done()
        await put_committed(bus, record("late", container("main", share(1))))
        granted = await asyncio.wait_for(call, 5)
    assert granted.envs["NVIDIA_VISIBLE_DEVICES"] == uuid(1)


async def test_two_plugin_processes_never_allocate_one_record_twice(
    bus: NatsBus,
    nats_server: Any,
    kubelet: FakeKubelet,
    start_plugin: PluginFactory,
    plugin_dir: Path,
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    await put_committed(bus, record("contested", container("main", share(0))))
    other_dir = plugin_dir / "other"
    other_dir.mkdir()
    async with (
        FakeKubelet(other_dir) as other_kubelet,
        start_plugin() as first,
        start_plugin(directory=other_dir) as second,
        kubelet.plugin(first.endpoint) as first_stub,
        other_kubelet.plugin(second.endpoint) as second_stub,
    ):
        results = await asyncio.gather(
            first_stub.Allocate(allocate_request(ids(0, 0)), timeout=5),
            second_stub.Allocate(allocate_request(ids(0, 1)), timeout=5),
            return_exceptions=True,
        )
    granted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(granted) == 1 and len(refused) == 1, results
    assert refused[0].code() == grpc.StatusCode.FAILED_PRECONDITION
    stored = await get_record(bus, "contested")
    assert stored.state == "allocated" and len(stored.allocated) == 1


# --- edge and pre-start ---------------------------------------------------------------------


async def test_malformed_inventory_is_dead_lettered_and_the_plugin_keeps_serving(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    letters: asyncio.Queue[Delivery] = asyncio.Queue()

    async def collect(delivery: Delivery) -> None:
        await letters.put(delivery)

    await bus.subscribe(subjects.deadletter("inventory"), collect)
    await announce_inventory(bus, TWO_GPUS)
    async with start_plugin() as plugin, kubelet.plugin(plugin.endpoint) as stub:
        await bus.publish(subjects.inventory(NODE), b'{"node": "x", "gpus": "many"}')
        letter = codec.decode((await asyncio.wait_for(letters.get(), 5)).data, DeadLetter)
        assert letter.service == "deviceplugin" and "gpus" in letter.reason
        stream = stub.ListAndWatch(api_pb2.Empty())
        listed = await asyncio.wait_for(stream.read(), 5)
        stream.cancel()
        assert len(listed.devices) == 6
        assert plugin.ready()


async def test_pre_start_refuses_a_container_whose_gpu_turned_unhealthy(
    bus: NatsBus, kubelet: FakeKubelet, start_plugin: PluginFactory
) -> None:
    await announce_inventory(bus, TWO_GPUS)
    await put_committed(bus, record("pre", container("main", share(1))))
    async with start_plugin(pre_start=True) as plugin, kubelet.plugin(plugin.endpoint) as stub:
        assert (await kubelet.registered()).options.pre_start_required
        await allocate(stub, ids(0, 1))
        request = api_pb2.PreStartContainerRequest(devices_ids=ids(0, 1))
        await stub.PreStartContainer(request, timeout=5)
        sick = inventory(
            gpu(0, memory_mib=4096),
            gpu(1, memory_mib=8192, health="unhealthy", reason="XID 48"),
            at=TWO_GPUS.observed_at + 1,
        )
        await announce_inventory(bus, sick)
        await asyncio.sleep(0.2)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.PreStartContainer(request, timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f"was allocated GPU {uuid(1)} (unhealthy: XID 48)" in (refused.value.details() or "")
