"""Pure: a node's GPU inventory -> the devices this plugin advertises to the kubelet.

Two resource modes (docs/design.md §3), chosen per node:

- ``logical`` (seed 000): resource ``tessera.dev/gpu``. Each physical GPU becomes a split count of
  logical devices: set for that GPU, else set for every GPU, else derived from its memory (one per
  ``split_memory_mib``), and never fewer than 2.
- ``memory-units`` (seeds 003/004): resource ``tessera.dev/gpu-memory``. One device per
  ``memory_unit_mib`` MiB of each GPU's memory, so the device count a container gets is its memory.

Device IDs name their GPU (``<gpu uuid>::<n>``) so an operator reading the kubelet's checkpoint or
``kubectl describe node`` can tell which GPU a device stands for. Health follows the inventory; a
GPU the inventory marks ``gone`` stays listed as unhealthy (the kubelet then stops admitting pods to
it) and a GPU missing from the inventory is no longer listed. The NUMA node of each GPU becomes the
device's topology, for the kubelet's Topology Manager.

Callers: ``service.py`` recomputes the list on every inventory and resends it when it changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import msgspec

from shared import annotations as names
from shared.messages.inventory import GpuTelemetry, NodeInventory

Mode = Literal["logical", "memory-units"]

RESOURCE_BY_MODE: Final[dict[Mode, str]] = {
    "logical": names.GPU,
    "memory-units": names.GPU_MEMORY,
}

HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"

MIN_SPLIT: Final = 2
"""Seed 000: every physical GPU becomes at least two logical devices."""

MAX_DEVICE_ID_LENGTH: Final = 63
"""The kubelet rejects longer device IDs."""

KUBELET_MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
"""The kubelet's gRPC client keeps the default 4 MiB receive limit for ListAndWatch messages."""

ID_SEPARATOR: Final = "::"

AUTO_UNIT: Final = 0
"""``memory_unit_mib`` unset: the smallest unit whose device list the kubelet takes."""


class DeviceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How GPUs become devices; built once from the settings."""

    mode: Mode = "logical"
    split_memory_mib: int = 2048
    """Logical mode: one logical device per this many MiB of a GPU's memory (at least 2)."""
    split_count: int = 0
    """Logical mode: the same split count for every GPU; 0 derives it from memory."""
    split_counts: Mapping[str, int] = {}
    """Logical mode: split count per GPU, keyed by GPU UUID or by GPU index as text."""
    memory_unit_mib: int = 1
    """Memory-units mode: MiB one device stands for; :data:`AUTO_UNIT` = chosen per node by
    :func:`choose_memory_unit`."""

    @property
    def resource(self) -> str:
        return RESOURCE_BY_MODE[self.mode]


class Device(msgspec.Struct, frozen=True, kw_only=True):
    """One advertised device and the physical GPU behind it."""

    id: str
    gpu_uuid: str
    gpu_index: int
    healthy: bool
    numa_node: int | None = None

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


def split_count(gpu: GpuTelemetry, config: DeviceConfig) -> int:
    """How many logical devices ``gpu`` becomes (never fewer than :data:`MIN_SPLIT`)."""
    per_gpu = config.split_counts.get(gpu.uuid, config.split_counts.get(str(gpu.index)))
    if per_gpu is not None:
        count = per_gpu
    elif config.split_count > 0:
        count = config.split_count
    else:
        count = gpu.memory_total_mib // max(config.split_memory_mib, 1)
    return max(MIN_SPLIT, count)


def devices_per_gpu(gpu: GpuTelemetry, config: DeviceConfig) -> int:
    """How many devices ``gpu`` is advertised as in the configured mode."""
    if config.mode == "logical":
        return split_count(gpu, config)
    return gpu.memory_total_mib // max(config.memory_unit_mib, 1)


def device_id(gpu: GpuTelemetry, ordinal: int) -> str:
    """``<uuid>::<ordinal>``; ``gpu<index>::<ordinal>`` when a UUID would make it too long."""
    candidate = f"{gpu.uuid}{ID_SEPARATOR}{ordinal}"
    if len(candidate) <= MAX_DEVICE_ID_LENGTH:
        return candidate
    return f"gpu{gpu.index}{ID_SEPARATOR}{ordinal}"


def advertise(inventory: NodeInventory | None, config: DeviceConfig) -> tuple[Device, ...]:
    """Every device of the node in a stable order (GPU index, then ordinal)."""
    if inventory is None:
        return ()
    devices: list[Device] = []
    for gpu in sorted(inventory.gpus, key=lambda g: (g.index, g.uuid)):
        healthy = gpu.health == "healthy"
        for ordinal in range(devices_per_gpu(gpu, config)):
            devices.append(
                Device(
                    id=device_id(gpu, ordinal),
                    gpu_uuid=gpu.uuid,
                    gpu_index=gpu.index,
                    healthy=healthy,
                    numa_node=gpu.numa_node,
                )
            )
    return tuple(devices)


_DEVICE_OVERHEAD_BYTES: Final = 4 + 2 + 2 + 16
"""Per device in a ListAndWatch message besides the ID and health text: the Device field tag
and length (<= 4 bytes), the ID and health fields' tags and lengths, and a topology with one NUMA
node (<= 16 bytes)."""


def estimated_list_bytes(devices: tuple[Device, ...]) -> int:
    """An upper estimate of the encoded ListAndWatch response for ``devices``."""
    return sum(_DEVICE_OVERHEAD_BYTES + len(d.id) + len(d.health) for d in devices)


def _size_problem(size: int, count: int, config: DeviceConfig) -> str | None:
    if size <= KUBELET_MAX_MESSAGE_BYTES:
        return None
    if config.mode == "memory-units":
        smallest_unit = config.memory_unit_mib * size // KUBELET_MAX_MESSAGE_BYTES + 1
        advice = f"raise --memory-unit-mib to at least {smallest_unit}"
    else:
        advice = "lower --split-count or raise --split-memory-mib"
    return (
        f"{count} devices make a ListAndWatch message of about {size} bytes, over the "
        f"kubelet's {KUBELET_MAX_MESSAGE_BYTES}-byte limit; {advice}"
    )


def list_size_problem(devices: tuple[Device, ...], config: DeviceConfig) -> str | None:
    """Why the kubelet would refuse this device list (too large a message), or None."""
    return _size_problem(estimated_list_bytes(devices), len(devices), config)


def _inventory_list_bytes(inventory: NodeInventory, config: DeviceConfig) -> tuple[int, int]:
    """(an upper estimate of the ListAndWatch message's size, the device count) for the
    devices ``inventory`` makes, from the counts alone."""
    size = count = 0
    for gpu in inventory.gpus:
        per_gpu = devices_per_gpu(gpu, config)
        longest_id = len(device_id(gpu, max(per_gpu - 1, 0)))
        count += per_gpu
        size += per_gpu * (_DEVICE_OVERHEAD_BYTES + longest_id + len(UNHEALTHY))
    return size, count


def inventory_size_problem(inventory: NodeInventory, config: DeviceConfig) -> str | None:
    """:func:`list_size_problem` of ``advertise(inventory, config)`` without building the list:
    an upper estimate from the device counts alone, so a GPU claiming absurd memory costs
    nothing (checked before :func:`advertise`)."""
    size, count = _inventory_list_bytes(inventory, config)
    return _size_problem(size, count, config)


def choose_memory_unit(inventory: NodeInventory, config: DeviceConfig) -> int:
    """Memory-units mode with the unit unset: the smallest unit (MiB) whose device list for
    ``inventory`` the kubelet takes in one message; 1 MiB wherever that fits (most nodes up to
    about 50 GiB of GPU memory)."""

    def fits(unit: int) -> bool:
        trial = msgspec.structs.replace(config, memory_unit_mib=unit)
        return _inventory_list_bytes(inventory, trial)[0] <= KUBELET_MAX_MESSAGE_BYTES

    # The message only shrinks as the unit grows: the smallest unit that fits, by bisection.
    low, high = 1, max((gpu.memory_total_mib for gpu in inventory.gpus), default=1)
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return low


def gpu_of(devices: tuple[Device, ...]) -> dict[str, str]:
    """Device ID -> GPU UUID."""
    return {device.id: device.gpu_uuid for device in devices}
