"""Pure: inventory -> advertised devices, in both modes."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.deviceplugin.rules import devices
from services.deviceplugin.rules.devices import DeviceConfig
from shared.messages.inventory import GpuTelemetry
from tests.deviceplugin.builders import gpu, inventory, uuid


@pytest.mark.parametrize(
    ("config", "the_gpu", "expected"),
    [
        pytest.param(DeviceConfig(), gpu(0, memory_mib=16_384), 8, id="by-memory-16g"),
        pytest.param(DeviceConfig(), gpu(0, memory_mib=81_920), 40, id="by-memory-80g"),
        pytest.param(DeviceConfig(), gpu(0, memory_mib=3_000), 2, id="small-gpu-still-two"),
        pytest.param(
            DeviceConfig(split_memory_mib=8192),
            gpu(0, memory_mib=24_576),
            3,
            id="custom-memory-per-device",
        ),
        pytest.param(DeviceConfig(split_count=4), gpu(0, memory_mib=81_920), 4, id="global"),
        pytest.param(DeviceConfig(split_count=1), gpu(0), 2, id="global-below-minimum"),
        pytest.param(
            DeviceConfig(split_count=4, split_counts={"1": 7}),
            gpu(1),
            7,
            id="per-gpu-index-beats-global",
        ),
        pytest.param(
            DeviceConfig(split_counts={uuid(2): 5, "2": 9}),
            gpu(2),
            5,
            id="per-gpu-uuid-beats-index",
        ),
        pytest.param(
            DeviceConfig(split_counts={"0": 6}),
            gpu(1, memory_mib=16_384),
            8,
            id="other-gpu-override-ignored",
        ),
    ],
)
def test_logical_split_count(config: DeviceConfig, the_gpu: GpuTelemetry, expected: int) -> None:
    assert devices.split_count(the_gpu, config) == expected


@pytest.mark.parametrize(
    ("unit", "memory_mib", "expected"),
    [
        pytest.param(1, 4096, 4096, id="mib-units"),
        pytest.param(256, 16_384, 64, id="256-mib-units"),
        pytest.param(1024, 16_000, 15, id="partial-unit-dropped"),
    ],
)
def test_memory_units_one_device_per_unit(unit: int, memory_mib: int, expected: int) -> None:
    config = DeviceConfig(mode="memory-units", memory_unit_mib=unit)
    listed = devices.advertise(inventory(gpu(0, memory_mib=memory_mib)), config)
    assert len(listed) == expected
    assert config.resource == "tessera.dev/gpu-memory"


def test_logical_devices_name_their_gpu_and_carry_health_and_numa() -> None:
    listed = devices.advertise(
        inventory(
            gpu(1, memory_mib=4096, numa=1, health="unhealthy"),
            gpu(0, memory_mib=4096, numa=0),
            gpu(2, memory_mib=4096, numa=None, health="gone"),
        ),
        DeviceConfig(),
    )
    assert [(d.id, d.health, d.numa_node) for d in listed] == [
        (f"{uuid(0)}::0", "Healthy", 0),
        (f"{uuid(0)}::1", "Healthy", 0),
        (f"{uuid(1)}::0", "Unhealthy", 1),
        (f"{uuid(1)}::1", "Unhealthy", 1),
        (f"{uuid(2)}::0", "Unhealthy", None),
        (f"{uuid(2)}::1", "Unhealthy", None),
    ]


def test_no_inventory_means_no_devices() -> None:
    assert devices.advertise(None, DeviceConfig()) == ()


def test_overlong_uuid_falls_back_to_index_id() -> None:
    odd = msgspec.structs.replace(gpu(3), uuid="GPU-" + "f" * 70)
    listed = devices.advertise(inventory(odd), DeviceConfig(split_count=2))
    assert [d.id for d in listed] == ["gpu3::0", "gpu3::1"]
    assert all(d.gpu_uuid == odd.uuid for d in listed)


@pytest.mark.parametrize(
    ("config", "memory_mib", "problem"),
    [
        pytest.param(
            DeviceConfig(mode="memory-units", memory_unit_mib=1),
            81_920,
            "raise --memory-unit-mib to at least 2",
            id="80g-in-mib-units-too-large",
        ),
        pytest.param(
            DeviceConfig(mode="memory-units", memory_unit_mib=16),
            81_920,
            None,
            id="80g-in-16-mib-units-fits",
        ),
        pytest.param(DeviceConfig(), 81_920, None, id="logical-fits"),
    ],
)
def test_list_size_problem_names_the_fix(
    config: DeviceConfig, memory_mib: int, problem: str | None
) -> None:
    listed = devices.advertise(inventory(gpu(0, memory_mib=memory_mib)), config)
    found = devices.list_size_problem(listed, config)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found and "kubelet" in found


gpus_strategy = st.lists(
    st.builds(
        lambda index, memory, healthy: gpu(
            index, memory_mib=memory, health="healthy" if healthy else "unhealthy"
        ),
        st.integers(0, 15),
        st.integers(1, 200_000),
        st.booleans(),
    ),
    max_size=8,
    unique_by=lambda g: g.index,
)


@given(
    gpus=gpus_strategy,
    split_count=st.integers(0, 64),
    split_memory=st.integers(256, 65_536),
)
def test_logical_invariants(gpus: list[GpuTelemetry], split_count: int, split_memory: int) -> None:
    config = DeviceConfig(split_count=split_count, split_memory_mib=split_memory)
    listed = devices.advertise(inventory(*gpus), config)
    ids = [d.id for d in listed]
    assert len(ids) == len(set(ids)), "device IDs are unique"
    assert all(len(i) <= devices.MAX_DEVICE_ID_LENGTH for i in ids)
    for the_gpu in gpus:
        own = [d for d in listed if d.gpu_uuid == the_gpu.uuid]
        assert len(own) >= devices.MIN_SPLIT, "every GPU gets at least two logical devices"
        assert all(d.id.startswith(the_gpu.uuid) for d in own), "IDs name their GPU"
        assert all(d.healthy == (the_gpu.health == "healthy") for d in own)
    assert listed == devices.advertise(inventory(*reversed(gpus)), config), "order-independent"


@pytest.mark.parametrize(
    ("gpus", "memory_mib", "unit"),
    [
        pytest.param(2, 16_384, 1, id="2xT4-fits-in-mib"),
        pytest.param(4, 16_384, 2, id="4xT4-needs-2-mib"),
        pytest.param(8, 81_920, 13, id="8xA100-80GB"),
    ],
)
def test_the_memory_unit_chosen_is_the_smallest_the_kubelet_takes(
    gpus: int, memory_mib: int, unit: int
) -> None:
    node = inventory(*(gpu(i, memory_mib=memory_mib) for i in range(gpus)))
    config = DeviceConfig(mode="memory-units", memory_unit_mib=devices.AUTO_UNIT)
    assert devices.choose_memory_unit(node, config) == unit
    at = msgspec.structs.replace(config, memory_unit_mib=unit)
    assert devices.inventory_size_problem(node, at) is None
    below = msgspec.structs.replace(config, memory_unit_mib=unit - 1)
    assert unit == 1 or devices.inventory_size_problem(node, below) is not None
