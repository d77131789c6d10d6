"""Builders for inventory test values: a plain GPU reading with overrides, a node reading."""

from __future__ import annotations

from typing import Any

import msgspec

from services.inventory.reader import GpuFault, GpuReading, HealthEvent, NodeReading


def gpu(uuid: str = "GPU-a", index: int = 0, **changes: Any) -> GpuReading:
    """An idle 80 GiB GPU; keyword arguments override any field."""
    base = GpuReading(
        uuid=uuid,
        index=index,
        model="A100-80GB",
        memory_total_mib=81920,
        memory_used_mib=0,
        memory_free_mib=81920,
        utilization_pct=0,
        temperature_c=30,
        power_w=60.0,
        sm_clock_mhz=210,
        sm_clock_max_mhz=1410,
        pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
        numa_node=0,
    )
    return msgspec.structs.replace(base, **changes)


def node(*gpus: GpuReading, faults: tuple[GpuFault, ...] = (), driver: str = "550") -> NodeReading:
    return NodeReading(gpus=gpus, faults=faults, driver_version=driver)


def xid(code: int, uuid: str = "GPU-a") -> HealthEvent:
    return HealthEvent(uuid=uuid, kind="xid", code=code)
