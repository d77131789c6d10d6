"""``tessera.inventory.<node>``: what every GPU on a node is and how it is doing."""

from __future__ import annotations

from typing import Literal

from shared.messages.base import Message

GpuHealthState = Literal["healthy", "unhealthy", "gone"]

TopologyLevel = Literal["internal", "single", "multiple", "hostbridge", "node", "system", "unknown"]
"""NVML's common-ancestor level between two GPUs, nearest first."""


class GpuProcess(Message, frozen=True, kw_only=True):
    """A compute process seen on a GPU, with the memory it holds."""

    pid: int
    used_memory_mib: int


class GpuLink(Message, frozen=True, kw_only=True):
    """How this GPU reaches a peer GPU on the same node."""

    peer_uuid: str
    level: TopologyLevel = "unknown"
    nvlinks: int = 0
    """Number of active NVLinks between the two GPUs (0 = none)."""


class GpuTelemetry(Message, frozen=True, kw_only=True):
    """One physical GPU: identity, capacity, live load, topology and health."""

    uuid: str
    index: int
    model: str
    memory_total_mib: int
    memory_used_mib: int
    memory_free_mib: int
    utilization_pct: int = 0
    temperature_c: int = 0
    power_w: float = 0.0
    sm_clock_mhz: int = 0
    sm_clock_max_mhz: int = 0
    pci_bus_id: str = ""
    numa_node: int | None = None
    pcie_root: str = ""
    """The PCIe root complex the GPU hangs off (``pci0000:00``), as sysfs names it; "" when
    unknown. GPUs under one root talk without crossing the CPU interconnect."""
    nvlink_peers: tuple[str, ...] = ()
    """UUIDs of GPUs reachable over NVLink."""
    links: tuple[GpuLink, ...] = ()
    mig_enabled: bool = False
    processes: tuple[GpuProcess, ...] = ()
    health: GpuHealthState = "healthy"
    health_reason: str = ""


class NodeInventory(Message, frozen=True, kw_only=True):
    """The latest view of every GPU on one node, published on change or heartbeat."""

    node: str
    gpus: tuple[GpuTelemetry, ...]
    observed_at: float
    """Seconds since the epoch when the readings were taken."""
    sequence: int = 0
    """Monotonic per inventory process; a restart starts again at 1."""
    producer: str = ""
    """Which inventory process published it (unique per process start): readers take the same
    producer's next ``sequence`` whatever its clock did, and otherwise the later ``observed_at``
    (``shared.validation.take_inventory``)."""
    backend: str = "nvml"
    driver_version: str = ""
