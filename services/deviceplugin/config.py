"""The device plugin's configuration, derived once from its settings (``command.build_config``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.deviceplugin.rules.allocate import ResponseOptions
from services.deviceplugin.rules.devices import DeviceConfig


@dataclass(frozen=True)
class PluginConfig:
    """Everything the device plugin needs to run on one node."""

    node: str
    devices: DeviceConfig
    response: ResponseOptions
    plugin_dir: Path
    endpoint: str
    """Socket file name in ``plugin_dir``."""
    pre_start: bool = False
    record_wait_s: float = 2.0
    """How long one Allocate waits for the records watch to show a record (or its own write
    of it) before reading the bucket itself."""
    nats_wait_s: float = 15.0
    """How long one Allocate waits for a lost NATS connection to come back before refusing."""
    kubelet_poll_s: float = 1.0
    api: str = "device-plugin"
    """``dra``: serve the kubelet's DRA plugin API instead (docs/design.md §14)."""
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    dra_plugin_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_dir: Path = Path("/var/run/cdi")

    @property
    def resource(self) -> str:
        return self.devices.resource
