"""``tessera.allocations.<node>``: the device plugin answered Allocate (deviceplugin -> binder)."""

from __future__ import annotations

from shared.messages.base import Message


class AllocationEvent(Message, frozen=True, kw_only=True):
    """A container of a pod received its devices; ``complete`` when the whole pod has."""

    pod_uid: str
    namespace: str
    name: str
    node: str
    container: str
    device_ids: tuple[str, ...]
    gpu_uuids: tuple[str, ...]
    complete: bool
    allocated_at: float
    plugin_id: str = ""
