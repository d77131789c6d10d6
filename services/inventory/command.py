"""``tessera inventory``: settings and entry point of the inventory service."""

from __future__ import annotations

from shared.config import NodeSettings
from shared.runtime.command import ServiceCommand


class InventorySettings(NodeSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Inventory settings."""


SERVICE = ServiceCommand(
    name="inventory",
    summary="publish NVML telemetry and GPU health for one node",
    description="The inventory reads every GPU on its node through NVML (or a fake backend) and "
    "publishes snapshots to tessera.inventory.<node> and the inventory KV bucket.",
    settings=InventorySettings,
    main=None,
)
