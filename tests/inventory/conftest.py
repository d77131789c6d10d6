"""Fixtures of the inventory tests: the compiled NVML stub and a default two-GPU script for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inventory.stub import NvmlStub, StubGpu, build_stub

GPU_A = "GPU-11111111-2222-3333-4444-555555555555"
GPU_B = "GPU-66666666-7777-8888-9999-000000000000"


@pytest.fixture(scope="session")
def nvml_stub_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stub ``libnvidia-ml.so.1``, compiled once per test session."""
    return build_stub(tmp_path_factory.mktemp("nvml-stub"))


def two_gpus(library: Path) -> NvmlStub:
    """Two A100s joined by two NVLinks, each with its own figures, one running a process."""
    return NvmlStub(
        library=library,
        gpus=[
            StubGpu(
                uuid=GPU_A,
                bus_id="00000000:07:00.0",
                memory_used_mib=1024,
                utilization_pct=37,
                temperature_c=41,
                power_mw=123_456,
                sm_clock_mhz=1410,
                sm_clock_max_mhz=1410,
                numa_node=0,
                mig=True,
                nvlinks=((0, 1), (1, 1)),
                processes=((4242, 2048), (4343, 512)),
            ),
            StubGpu(
                uuid=GPU_B,
                name="NVIDIA A100-SXM4-40GB",
                bus_id="00000000:0A:00.0",
                memory_total_mib=40960,
                memory_used_mib=0,
                utilization_pct=0,
                temperature_c=33,
                power_mw=55_000,
                sm_clock_mhz=210,
                sm_clock_max_mhz=1395,
                numa_node=1,
                nvlinks=((0, 0), (1, 0)),
            ),
        ],
        topology={(0, 1): 10},
    )


@pytest.fixture
def nvml_stub(nvml_stub_library: Path) -> Iterator[NvmlStub]:
    """The stub scripted with :func:`two_gpus` and no pending events; tests change it freely."""
    stub = two_gpus(nvml_stub_library)
    stub.write()
    stub.clear_events()
    yield stub
    stub.clear_events()
