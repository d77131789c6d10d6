"""The GPU reader port: what the inventory needs from a GPU backend, and the values it returns.

Two adapters implement :class:`GpuReader`: ``services.inventory.nvml`` (the real one, over
NVML) and ``services.inventory.fake`` (GPUs from a spec, for the demo, the simulator and tests
on machines without GPUs). The service shell calls ``open`` once, then ``read`` on every poll and
``wait_event`` in a loop beside it; the pure core in ``services.inventory.snapshot`` turns what
they return into the published inventory. Readers report what they saw, raw: deciding whether an
event is critical or a GPU is healthy is the core's job, not the adapter's.
"""

from __future__ import annotations

from typing import Literal, Protocol

import msgspec

from shared.messages.inventory import GpuLink, GpuProcess

EventKind = Literal["xid", "ecc_double_bit"]
"""What NVML reported: an XID error (``code`` is the XID) or a double-bit ECC error."""


class GpuReading(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU that answered every query of one read."""

    uuid: str
    index: int
    model: str
    memory_total_mib: int
    memory_used_mib: int
    memory_free_mib: int
    utilization_pct: int
    temperature_c: int
    power_w: float
    sm_clock_mhz: int
    sm_clock_max_mhz: int
    pci_bus_id: str
    numa_node: int | None
    links: tuple[GpuLink, ...] = ()
    """How this GPU reaches each other GPU of the node (common ancestor, NVLinks)."""
    mig_enabled: bool = False
    processes: tuple[GpuProcess, ...] = ()


class GpuFault(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU that is still counted by the backend but did not answer normally."""

    index: int
    uuid: str = ""
    """Empty when the GPU could not even say who it is; the core then matches it by index."""
    reason: str


class NodeReading(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one read of the node returned."""

    gpus: tuple[GpuReading, ...]
    faults: tuple[GpuFault, ...] = ()
    driver_version: str = ""


class HealthEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A health event the backend delivered for one GPU."""

    uuid: str
    kind: EventKind
    code: int = 0
    """The XID for ``kind == "xid"``; 0 otherwise."""


class BackendUnavailableError(Exception):
    """The backend cannot be used at all; the message names the cause and the way out."""


class NodeReadError(Exception):
    """One read of the whole node failed (the backend itself, not a single GPU)."""


class GpuReader(Protocol):
    """A source of GPU readings and health events for one node.

    Contract: ``open`` is called once before anything else and raises
    :class:`BackendUnavailableError` when the backend cannot start. ``read`` returns a complete
    :class:`NodeReading`; a GPU that fails goes into ``faults`` and never fails the whole read,
    while a failure of the backend itself raises :class:`NodeReadError`. ``wait_event`` returns the
    next health event, or None when ``timeout_s`` passed without one; it may run beside ``read``.
    ``close`` is called once at the end, after every other call has returned or been cancelled.
    """

    @property
    def backend(self) -> str:
        """The backend's name as published in ``NodeInventory.backend`` (``nvml``, ``fake``)."""
        ...

    async def open(self) -> None:
        """Start the backend, or raise BackendUnavailableError."""
        ...

    async def read(self) -> NodeReading:
        """Read every GPU, or raise NodeReadError."""
        ...

    async def wait_event(self, timeout_s: float) -> HealthEvent | None:
        """The next health event, or None after ``timeout_s``."""
        ...

    async def close(self) -> None:
        """Release the backend."""
        ...
