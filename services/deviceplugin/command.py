"""``tessera deviceplugin``: settings and entry point of the device plugin."""

from __future__ import annotations

from shared.config import NodeSettings
from shared.runtime.command import ServiceCommand


class DevicePluginSettings(NodeSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Device plugin settings."""


SERVICE = ServiceCommand(
    name="deviceplugin",
    summary="serve the kubelet's device plugin API for one node",
    description="The device plugin advertises Tessera devices to the kubelet and answers "
    "Allocate exactly from the assignment record the placer and binder wrote.",
    settings=DevicePluginSettings,
    main=None,
)
