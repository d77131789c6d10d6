"""Pure: the ResourceSlices the binder publishes for a node in DRA mode (docs/design.md §14).

One pool per node (named after it), one device per physical GPU in the node's inventory
(``shared.dra.devices``: ``gpu-<index>``, ``allowMultipleAllocations``, capacities ``memory`` and
``compute`` with their request policies, the attributes), sorted by index. A GPU the inventory
does not report healthy carries a ``NoSchedule`` taint (``gpu.tessera.dev/unhealthy``, its state
as the value): no new allocation lands on it, and ``kubectl get resourceslice -o yaml`` says why.

Slices stay within the API's limits: at most 128 devices each, 64 when any device of the pool is
tainted; a pool larger than that is split into several slices, all carrying the pool's
``resourceSliceCount``. When the devices change, the pool's ``generation`` is raised by one over
the highest the node's slices carry, on every slice of the pool, so a reader never mixes an old
slice with a new one (``ResourcePool`` in ``resource/v1/types.go``); unchanged devices change
nothing. :func:`plan_slices` answers what to create, replace and delete.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from shared.dra.devices import (
    COMPUTE,
    COMPUTE_TOTAL,
    DRA_API,
    DRIVER,
    MEMORY,
    NODE_API_LABEL,
    DeviceDescription,
    MemoryPolicy,
    Version,
    describe,
    memory_range,
)
from shared.messages.inventory import GpuTelemetry, NodeInventory
from shared.quantity import canonical

Body = dict[str, Any]

MAX_DEVICES: Final = 128
MAX_DEVICES_WITH_TAINTS: Final = 64
UNHEALTHY_TAINT: Final = f"{DRIVER}/unhealthy"
API_VERSION: Final = "resource.k8s.io/v1"
MAX_NAME: Final = 253


class SliceChanges(msgspec.Struct, frozen=True, kw_only=True):
    """What to write so the node's slices are the planned ones."""

    create: tuple[Body, ...] = ()
    replace: tuple[Body, ...] = ()
    """Full objects with the stored ``metadata.resourceVersion`` (an update of each)."""
    delete: tuple[str, ...] = ()
    """Names of slices to delete."""

    @property
    def empty(self) -> bool:
        return not (self.create or self.replace or self.delete)


def slice_name(node: str, position: int) -> str:
    """``<node>-gpu.tessera.dev-<n>``; a node name too long for that is shortened and made
    unique again by its hash (object names are at most 253 characters)."""
    name = f"{node}-{DRIVER}-{position}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{node[: MAX_NAME - len(name) + len(node) - 11]}-{digest}-{DRIVER}-{position}"


def _attribute(value: object) -> Body:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.text}
    return {"string": str(value)}


def _published_name(qualified: str) -> str:
    """The name as the slice carries it: the driver's own attributes without their domain."""
    prefix = f"{DRIVER}/"
    return qualified[len(prefix) :] if qualified.startswith(prefix) else qualified


def _mib(value: int) -> str:
    return canonical(f"{value}Mi")


def device_body(gpu: GpuTelemetry, policy: MemoryPolicy) -> Body:
    """One GPU as a slice's device."""
    description: DeviceDescription = describe(gpu)
    window = memory_range(gpu.memory_total_mib, policy)
    total = str(COMPUTE_TOTAL)
    body: Body = {
        "name": description.name,
        "allowMultipleAllocations": True,
        "attributes": {
            _published_name(name): _attribute(value)
            for name, value in sorted(description.attributes.items())
        },
        "capacity": {
            MEMORY: {
                "value": _mib(gpu.memory_total_mib),
                "requestPolicy": {
                    "default": _mib(window.maximum),
                    "validRange": {
                        "min": _mib(window.minimum),
                        "max": _mib(window.maximum),
                        "step": _mib(window.step),
                    },
                },
            },
            COMPUTE: {
                "value": total,
                "requestPolicy": {
                    "default": total,
                    "validRange": {"min": "1", "max": total, "step": "1"},
                },
            },
        },
    }
    if gpu.health != "healthy":
        body["taints"] = [{"key": UNHEALTHY_TAINT, "value": gpu.health, "effect": "NoSchedule"}]
    return body


def planned_devices(inventory: NodeInventory, policy: MemoryPolicy) -> list[Body]:
    """The node's devices, by GPU index."""
    return [device_body(g, policy) for g in sorted(inventory.gpus, key=lambda g: g.index)]


def _chunks(devices: Sequence[Body]) -> list[list[Body]]:
    size = MAX_DEVICES_WITH_TAINTS if any("taints" in d for d in devices) else MAX_DEVICES
    return [list(devices[i : i + size]) for i in range(0, len(devices), size)] or [[]]


def _slice(node: str, position: int, devices: list[Body], generation: int, count: int) -> Body:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, position)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def _devices_of(existing: Sequence[Body]) -> list[Body]:
    found: list[Body] = []
    for stored in sorted(existing, key=lambda s: str(s["metadata"]["name"])):
        found.extend((stored.get("spec") or {}).get("devices") or [])
    return found


def plan_slices(
    node: str,
    inventory: NodeInventory | None,
    existing: Sequence[Body],
    *,
    policy: MemoryPolicy,
) -> SliceChanges:
    """The writes that make ``existing`` (the node's slices of this driver, as listed) what the
    inventory says; no inventory (or no GPU) means no slice."""
    if inventory is None or not inventory.gpus:
        return SliceChanges(delete=tuple(str(s["metadata"]["name"]) for s in existing))
    devices = planned_devices(inventory, policy)
    stored = {str(s["metadata"]["name"]): s for s in existing}
    chunks = _chunks(devices)
    names = [slice_name(node, i) for i in range(len(chunks))]
    generations = [
        int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0) for s in existing
    ]
    current = max(generations, default=0)
    unchanged = (
        sorted(stored) == sorted(names)
        and _devices_of(existing) == devices
        and all(g == current for g in generations)
        and all(
            ((stored[n].get("spec") or {}).get("pool") or {}).get("resourceSliceCount")
            == len(chunks)
            and (stored[n].get("spec") or {}).get("devices") == chunk
            for n, chunk in zip(names, chunks, strict=True)
        )
    )
    if unchanged:
        return SliceChanges()
    generation = current + 1 if existing else 0
    create: list[Body] = []
    replace: list[Body] = []
    for position, chunk in enumerate(chunks):
        body = _slice(node, position, chunk, generation, len(chunks))
        old = stored.get(names[position])
        if old is None:
            create.append(body)
        else:
            body["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion", "")
            replace.append(body)
    return SliceChanges(
        create=tuple(create),
        replace=tuple(replace),
        delete=tuple(sorted(set(stored) - set(names))),
    )


def dra_node(labels: Mapping[str, str]) -> bool:
    """Whether the node's GPUs are offered through DRA (the node's ``tessera.dev/gpu-api``
    label says ``dra``; without it a node keeps the device plugin, the default)."""
    return labels.get(NODE_API_LABEL) == DRA_API
