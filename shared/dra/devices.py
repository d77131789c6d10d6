"""Pure: a physical GPU as a ``gpu.tessera.dev`` DRA device (docs/design.md §14).

One device per physical GPU, named ``gpu-<index>``, in one pool per node, allocatable many times
(``allowMultipleAllocations``), with two consumable capacities:

- ``memory``: the GPU's memory as a byte quantity (``81920Mi``). Its request policy rounds a
  request up to the node's memory unit (``step``) from a minimum slice (``min``), at most the
  largest such value within the GPU (``max``), and an unrequested memory is that maximum: the
  whole GPU.
- ``compute``: 100 (percent of the GPU's SMs), steps of 1 from 1, unrequested = 100.

So a claim that requests no capacity takes the whole GPU, as DRA's defaults say, and a slice
names both (either one left out is the whole of it). Rounding follows the structured allocator
(``calculateConsumedCapacity`` in ``k8s.io/dynamic-resource-allocation/structured``): a request
below ``min`` is ``min``, otherwise ``min`` plus whole steps, never above ``max``.

Attributes, in the driver's domain: ``uuid``, ``model``, ``index``, ``memoryMiB``; and the
standard ones (``k8s.io/dynamic-resource-allocation/deviceattribute``), when the inventory knows
them: ``resource.kubernetes.io/numaNode``, ``resource.kubernetes.io/pciBusID`` and
``resource.kubernetes.io/pcieRoot``.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Final

import msgspec

from shared.messages.inventory import GpuTelemetry
from shared.quantity import MIB, QuantityError, mebibytes, parse_quantity

DRIVER: Final = "gpu.tessera.dev"
"""The driver's name, and the DeviceClass Tessera's chart creates."""
DEVICE_CLASS: Final = DRIVER
DEVICE_PREFIX: Final = "gpu-"
NODE_API_LABEL: Final = "tessera.dev/gpu-api"
"""A node's label saying how its GPUs are offered: ``dra``, or (absent) the device plugin."""
DRA_API: Final = "dra"

STANDARD_DOMAIN: Final = "resource.kubernetes.io"
UUID: Final = "uuid"
MODEL: Final = "model"
INDEX: Final = "index"
MEMORY_MIB: Final = "memoryMiB"
NUMA_NODE: Final = f"{STANDARD_DOMAIN}/numaNode"
PCI_BUS_ID: Final = f"{STANDARD_DOMAIN}/pciBusID"
PCIE_ROOT: Final = f"{STANDARD_DOMAIN}/pcieRoot"

MEMORY: Final = "memory"
COMPUTE: Final = "compute"
COMPUTE_TOTAL: Final = 100
"""``compute`` counts percent of the GPU's SMs (``tessera.dev/gpu-cores``)."""

ATTRIBUTE_MAX_LENGTH: Final = 64
"""The API refuses longer string attribute values."""

_DEVICE_NAME: Final = re.compile(r"^gpu-(0|[1-9][0-9]*)$")
_PCI_BUS_ID: Final = re.compile(
    r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$"
)


class MemoryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a node's GPUs round memory requests: its memory unit and the smallest slice."""

    step_mib: int = 1
    minimum_mib: int = 1


DEFAULT_POLICY: Final = MemoryPolicy()
"""1 MiB steps from 1 MiB: what a node without a memory unit of its own rounds to."""


class Version(msgspec.Struct, frozen=True, kw_only=True):
    """A ``version`` attribute (semver 2.0.0), as distinct from a plain string."""

    text: str


AttributeValue = bool | int | str | Version


class DeviceDescription(msgspec.Struct, frozen=True, kw_only=True):
    """A device as DRA describes it: what CEL selectors and constraints read."""

    name: str
    driver: str = DRIVER
    attributes: dict[str, AttributeValue]
    """Fully qualified names (``gpu.tessera.dev/model``) -> values."""
    capacity: dict[str, Fraction]
    """Fully qualified names -> amounts in the capacity's base unit (bytes for memory)."""
    allow_multiple_allocations: bool = True


class MemoryRange(msgspec.Struct, frozen=True, kw_only=True):
    """The ``validRange`` of one GPU's memory, in MiB; ``maximum`` is also the default."""

    minimum: int
    maximum: int
    step: int


class Consumed(msgspec.Struct, frozen=True, kw_only=True):
    """What one allocation of a device takes of it (``consumedCapacity``)."""

    memory_mib: int
    compute: int
    """Percent of the GPU's SMs."""


def qualified(name: str) -> str:
    """The attribute or capacity name as CEL and constraints see it: an unqualified name is in
    the driver's domain."""
    return name if "/" in name else f"{DRIVER}/{name}"


def device_name(index: int) -> str:
    return f"{DEVICE_PREFIX}{index}"


def device_index(name: str) -> int | None:
    """The GPU index a device name stands for; None when it is not one of Tessera's."""
    match = _DEVICE_NAME.match(name)
    return int(match.group(1)) if match else None


def pci_bus_id(nvml_bus_id: str) -> str | None:
    """NVML's bus ID (``00000000:3B:00.0``) in the extended BDF notation the standard
    attribute uses (``0000:3b:00.0``); None when it is not one."""
    match = _PCI_BUS_ID.match(nvml_bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def memory_range(total_mib: int, policy: MemoryPolicy) -> MemoryRange:
    """The memory request policy of a GPU with ``total_mib``: from the minimum slice (at most the
    whole GPU) in whole steps up to the largest value the GPU holds."""
    step = max(1, policy.step_mib)
    minimum = min(max(1, policy.minimum_mib), total_mib)
    maximum = minimum + (total_mib - minimum) // step * step
    return MemoryRange(minimum=minimum, maximum=maximum, step=step)


def round_memory(mib: int, policy: MemoryPolicy) -> int:
    """A memory request of ``mib`` as the request policy rounds it up: the minimum slice, or
    that plus whole steps (the GPU's own maximum is a fit, checked where it is placed)."""
    step = max(1, policy.step_mib)
    minimum = max(1, policy.minimum_mib)
    return minimum + max(0, -(-(mib - minimum) // step)) * step


def gpu_attributes(
    *,
    uuid: str,
    model: str,
    index: int,
    memory_mib: int,
    numa_node: int | None = None,
    nvml_bus_id: str = "",
    pcie_root: str = "",
) -> dict[str, AttributeValue]:
    """The device attributes of a GPU (fully qualified names); the NUMA node, PCI bus and PCIe
    root only when known."""
    found: dict[str, AttributeValue] = {
        qualified(UUID): uuid[:ATTRIBUTE_MAX_LENGTH],
        qualified(MODEL): model[:ATTRIBUTE_MAX_LENGTH],
        qualified(INDEX): index,
        qualified(MEMORY_MIB): memory_mib,
    }
    if numa_node is not None and numa_node >= 0:
        found[NUMA_NODE] = numa_node
    bus = pci_bus_id(nvml_bus_id) if nvml_bus_id else None
    if bus is not None:
        found[PCI_BUS_ID] = bus
    if pcie_root:
        found[PCIE_ROOT] = pcie_root[:ATTRIBUTE_MAX_LENGTH]
    return found


def attributes(gpu: GpuTelemetry) -> dict[str, AttributeValue]:
    """The device attributes of ``gpu`` (fully qualified names)."""
    return gpu_attributes(
        uuid=gpu.uuid,
        model=gpu.model,
        index=gpu.index,
        memory_mib=gpu.memory_total_mib,
        numa_node=gpu.numa_node,
        nvml_bus_id=gpu.pci_bus_id,
        pcie_root=gpu.pcie_root,
    )


def gpu_device(
    found: dict[str, AttributeValue], *, index: int, memory_mib: int
) -> DeviceDescription:
    """The device of GPU ``index`` with attributes ``found`` and ``memory_mib`` of memory."""
    return DeviceDescription(
        name=device_name(index),
        attributes=found,
        capacity={
            qualified(MEMORY): Fraction(memory_mib * MIB),
            qualified(COMPUTE): Fraction(COMPUTE_TOTAL),
        },
    )


def describe(gpu: GpuTelemetry) -> DeviceDescription:
    """``gpu`` as the device Tessera publishes for it."""
    return gpu_device(attributes(gpu), index=gpu.index, memory_mib=gpu.memory_total_mib)


def consumed(requests: dict[str, str], *, total_mib: int, policy: MemoryPolicy) -> Consumed | str:
    """What a request of ``requests`` (``capacity.requests``: capacity name -> quantity) takes of
    one GPU with ``total_mib``, rounded as its request policy says; the reason when the GPU
    cannot hold it (or a request names a capacity the device does not have)."""
    unknown = sorted(set(requests) - {MEMORY, COMPUTE, qualified(MEMORY), qualified(COMPUTE)})
    if unknown:
        return f"capacity {', '.join(unknown)} is not one of {MEMORY}, {COMPUTE}"
    wanted = {name.rsplit("/", 1)[-1]: value for name, value in requests.items()}
    window = memory_range(total_mib, policy)
    try:
        memory = window.maximum if MEMORY not in wanted else mebibytes(wanted[MEMORY])
        compute_asked = (
            Fraction(COMPUTE_TOTAL) if COMPUTE not in wanted else parse_quantity(wanted[COMPUTE])
        )
    except QuantityError as error:
        return str(error)
    if memory <= 0 or compute_asked <= 0:
        return "a capacity request must be positive"
    memory = round_memory(memory, policy) if memory > window.minimum else window.minimum
    if memory > window.maximum:
        return f"{memory} MiB of memory is more than the GPU's {window.maximum} MiB"
    compute = max(1, math.ceil(compute_asked))
    if compute > COMPUTE_TOTAL:
        return f"compute {compute_asked} is more than {COMPUTE_TOTAL}"
    return Consumed(memory_mib=memory, compute=compute)
