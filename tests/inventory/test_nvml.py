"""The NVML adapter over the real pynvml code path, against the C stub ``libnvidia-ml.so.1``.

The adapter preloads the stub from ``nvml_library`` (as an operator would point at a driver outside
the library path); unmodified pynvml then finds it by its soname at ``nvmlInit`` and talks to it
through ctypes with NVML's real signatures and struct layouts. Loading by name through
LD_LIBRARY_PATH, and a node without NVML, are covered in ``test_cli.py`` with real processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

from services.inventory.nvml import NvmlReader, normalize_bus_id
from services.inventory.reader import (
    BackendUnavailableError,
    GpuFault,
    GpuReading,
    HealthEvent,
    NodeReading,
)
from shared.messages.inventory import GpuLink, GpuProcess
from shared.runtime.nats import NatsBus
from tests.harness.clock import FakeClock
from tests.inventory.conftest import GPU_A, GPU_B
from tests.inventory.helpers import NODE, Inbox, eventually, harness, running
from tests.inventory.stub import DOUBLE_BIT_ECC_EVENT, XID_EVENT, NvmlStub


@pytest.fixture
async def reader(nvml_stub: NvmlStub) -> AsyncIterator[NvmlReader]:
    opened = NvmlReader(library=str(nvml_stub.library))
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


EXPECTED_A = GpuReading(
    uuid=GPU_A,
    index=0,
    model="NVIDIA A100-SXM4-80GB",
    memory_total_mib=81920,
    memory_used_mib=1024,
    memory_free_mib=80896,
    utilization_pct=37,
    temperature_c=41,
    power_w=123.456,
    sm_clock_mhz=1410,
    sm_clock_max_mhz=1410,
    pci_bus_id="00000000:07:00.0",
    numa_node=0,
    links=(GpuLink(peer_uuid=GPU_B, level="single", nvlinks=2),),
    mig_enabled=True,
    processes=(
        GpuProcess(pid=4242, used_memory_mib=2048),
        GpuProcess(pid=4343, used_memory_mib=512),
    ),
)
EXPECTED_B = GpuReading(
    uuid=GPU_B,
    index=1,
    model="NVIDIA A100-SXM4-40GB",
    memory_total_mib=40960,
    memory_used_mib=0,
    memory_free_mib=40960,
    utilization_pct=0,
    temperature_c=33,
    power_w=55.0,
    sm_clock_mhz=210,
    sm_clock_max_mhz=1395,
    pci_bus_id="00000000:0A:00.0",
    numa_node=1,
    links=(GpuLink(peer_uuid=GPU_A, level="single", nvlinks=2),),
    mig_enabled=False,
    processes=(),
)


async def test_reads_every_field_of_every_gpu(reader: NvmlReader) -> None:
    assert await reader.read() == NodeReading(
        gpus=(EXPECTED_A, EXPECTED_B), faults=(), driver_version="550.54.15"
    )


async def test_a_changed_gpu_is_read_again(reader: NvmlReader, nvml_stub: NvmlStub) -> None:
    await reader.read()
    nvml_stub.update(0, memory_used_mib=50_000, utilization_pct=99, processes=((7, 48_000),))
    gpu = (await reader.read()).gpus[0]
    assert (gpu.memory_used_mib, gpu.memory_free_mib, gpu.utilization_pct, gpu.processes) == (
        50_000,
        31_920,
        99,
        (GpuProcess(pid=7, used_memory_mib=48_000),),
    )


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        pytest.param(0, "internal", id="internal"),
        pytest.param(20, "multiple", id="multiple-switches"),
        pytest.param(30, "hostbridge", id="hostbridge"),
        pytest.param(40, "node", id="numa-node"),
        pytest.param(50, "system", id="system"),
        pytest.param(77, "unknown", id="unknown-code"),
    ],
)
async def test_topology_levels(nvml_stub: NvmlStub, level: int, expected: str) -> None:
    nvml_stub.topology = {(0, 1): level}
    nvml_stub.write()
    reader = NvmlReader(library=str(nvml_stub.library))
    await reader.open()
    try:
        reading = await reader.read()
    finally:
        await reader.close()
    assert [link.level for gpu in reading.gpus for link in gpu.links] == [expected, expected]


async def test_nvlink_behind_a_switch_counts_through_p2p(nvml_stub: NvmlStub) -> None:
    nvml_stub.update(0, nvlinks=())
    nvml_stub.update(1, nvlinks=())
    nvml_stub.p2p_nvlink = ((0, 1),)
    nvml_stub.write()
    reader = NvmlReader(library=str(nvml_stub.library))
    await reader.open()
    try:
        reading = await reader.read()
    finally:
        await reader.close()
    assert [gpu.links for gpu in reading.gpus] == [
        (GpuLink(peer_uuid=GPU_B, level="single", nvlinks=1),),
        (GpuLink(peer_uuid=GPU_A, level="single", nvlinks=1),),
    ]


async def test_queries_a_gpu_does_not_offer_keep_their_defaults(nvml_stub: NvmlStub) -> None:
    nvml_stub.update(1, power_unsupported=True, numa_node=None, nvlinks=())
    nvml_stub.update(0, nvlinks=())
    reader = NvmlReader(library=str(nvml_stub.library))
    await reader.open()
    try:
        gpu_b = (await reader.read()).gpus[1]
    finally:
        await reader.close()
    assert (gpu_b.power_w, gpu_b.numa_node, gpu_b.links) == (
        0.0,
        None,
        (GpuLink(peer_uuid=GPU_A, level="single", nvlinks=0),),
    )


async def test_a_lost_gpu_is_a_fault_not_a_failed_read(
    reader: NvmlReader, nvml_stub: NvmlStub
) -> None:
    nvml_stub.update(1, lost=True)
    reading = await reader.read()
    # Links are read between GPUs that answer: the lost one has no handle to ask about.
    assert reading.gpus == (msgspec.structs.replace(EXPECTED_A, links=()),)
    assert reading.faults == (GpuFault(index=1, uuid="", reason="NVML: GPU is lost"),)


async def test_a_gpu_that_is_no_longer_counted_is_absent(
    reader: NvmlReader, nvml_stub: NvmlStub
) -> None:
    nvml_stub.visible = 1
    nvml_stub.write()
    reading = await reader.read()
    assert [gpu.uuid for gpu in reading.gpus] == [GPU_A]
    assert reading.faults == ()


@pytest.mark.parametrize(
    ("event_type", "data", "expected"),
    [
        pytest.param(XID_EVENT, 79, HealthEvent(uuid=GPU_B, kind="xid", code=79), id="xid-79"),
        pytest.param(XID_EVENT, 13, HealthEvent(uuid=GPU_B, kind="xid", code=13), id="xid-13"),
        pytest.param(
            DOUBLE_BIT_ECC_EVENT,
            0,
            HealthEvent(uuid=GPU_B, kind="ecc_double_bit", code=0),
            id="double-bit-ecc",
        ),
    ],
)
async def test_health_events_arrive_through_the_event_set(
    reader: NvmlReader, nvml_stub: NvmlStub, event_type: int, data: int, expected: HealthEvent
) -> None:
    await reader.read()  # registers the GPUs on the event set
    nvml_stub.inject(1, event_type, data)
    assert await reader.wait_event(2.0) == expected
    assert await reader.wait_event(0.05) is None


async def test_event_types_not_registered_are_not_delivered(
    reader: NvmlReader, nvml_stub: NvmlStub
) -> None:
    await reader.read()
    nvml_stub.inject(0, 0x4, 0)  # a P-state change: not a health event
    assert await reader.wait_event(0.1) is None


async def test_an_event_from_a_gpu_that_fell_off_the_bus_is_known_by_its_handle(
    reader: NvmlReader, nvml_stub: NvmlStub
) -> None:
    await reader.read()
    nvml_stub.update(1, lost=True)  # it can no longer tell its uuid
    nvml_stub.inject(1, XID_EVENT, 79)
    assert await reader.wait_event(2.0) == HealthEvent(uuid=GPU_B, kind="xid", code=79)


@pytest.mark.parametrize(
    ("init_error", "message"),
    [
        pytest.param(
            9,
            "NVIDIA driver not loaded (NVML: Driver Not Loaded): check the driver on "
            "this node, or run with --backend fake to simulate GPUs",
            id="no-driver",
        ),
        pytest.param(
            4,
            "no permission to use NVML (Insufficient Permissions): the inventory "
            "needs access to /dev/nvidia*; or run with --backend fake to simulate "
            "GPUs",
            id="no-permission",
        ),
        pytest.param(
            999,
            "NVML failed to start: Unknown Error; run with --backend fake to simulate GPUs",
            id="unknown",
        ),
    ],
)
async def test_nvml_failing_at_start_is_a_clear_error(
    nvml_stub: NvmlStub, init_error: int, message: str
) -> None:
    nvml_stub.init_error = init_error
    nvml_stub.write()
    reader = NvmlReader(library=str(nvml_stub.library))
    with pytest.raises(BackendUnavailableError) as raised:
        await reader.open()
    await reader.close()
    assert str(raised.value) == message


async def test_a_library_path_that_does_not_load_is_a_clear_error() -> None:
    reader = NvmlReader(library="/nonexistent/libnvidia-ml.so.1")
    with pytest.raises(
        BackendUnavailableError,
        match=r"^cannot load the NVML library "
        r"/nonexistent/libnvidia-ml.so.1: .*; check --nvml-library, or run with "
        r"--backend fake to simulate GPUs$",
    ):
        await reader.open()
    await reader.close()


@pytest.mark.parametrize(
    ("bus_id", "expected"),
    [
        pytest.param("00000000:0A:00.0", "00000000:0a:00.0", id="nvml-form"),
        pytest.param("0000:0a:00.0", "00000000:0a:00.0", id="short-domain"),
        pytest.param("garbage", "garbage", id="unparsable-kept"),
    ],
)
def test_bus_ids_compare_numerically(bus_id: str, expected: str) -> None:
    assert normalize_bus_id(bus_id) == expected


async def test_service_marks_a_gpu_unhealthy_on_xid_79_and_recovers_after_the_probe(
    nvml_stub: NvmlStub, reader: NvmlReader, bus: NatsBus, clock: FakeClock
) -> None:
    inbox = await Inbox(bus, NODE).start()
    rig = harness(reader=reader, bus=bus, clock=clock)
    async with running(rig):
        first = await inbox.next()
        assert [(gpu.uuid, gpu.health) for gpu in first.gpus] == [
            (GPU_A, "healthy"),
            (GPU_B, "healthy"),
        ]
        assert (first.backend, first.driver_version, first.sequence) == ("nvml", "550.54.15", 1)

        nvml_stub.inject(1, XID_EVENT, 79)
        marked = await inbox.next()
        assert [(gpu.uuid, gpu.health, gpu.health_reason) for gpu in marked.gpus] == [
            (GPU_A, "healthy", ""),
            (GPU_B, "unhealthy", "XID 79: GPU has fallen off the bus"),
        ]
        assert (
            rig.sample(
                "tessera_gpu_health",
                uuid=GPU_B,
                index="1",
                model="NVIDIA A100-SXM4-40GB",
                state="unhealthy",
            )
            == 1
        )

        nvml_stub.inject(0, XID_EVENT, 13)  # an application fault: the GPU is fine
        await eventually(
            lambda: (
                rig.sample(
                    "tessera_gpu_health_events_total", kind="xid", code="13", outcome="ignored"
                )
                == 1
            )
        )
        await rig.tick(30)  # a normal answer before the probe time changes nothing
        assert await inbox.settle() == []

        await rig.tick(30)  # the probe, 60 s after the XID: it answers normally
        recovered = await inbox.next()
        assert [(gpu.uuid, gpu.health, gpu.health_reason) for gpu in recovered.gpus] == [
            (GPU_A, "healthy", ""),
            (GPU_B, "healthy", ""),
        ]

        nvml_stub.visible = 1
        nvml_stub.write()
        await rig.tick(10)
        gone = await inbox.next()
        assert [(gpu.uuid, gpu.health, gpu.health_reason) for gpu in gone.gpus] == [
            (GPU_A, "healthy", ""),
            (GPU_B, "gone", "no longer reported by the GPU backend"),
        ]
    assert (
        rig.sample("tessera_gpu_health_events_total", kind="xid", code="79", outcome="critical")
        == 1
    )
