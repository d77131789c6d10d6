"""``tessera deviceplugin``: settings and entry point of the device plugin."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from services.deviceplugin.config import PluginConfig
from services.deviceplugin.kubelet import DEFAULT_PLUGIN_DIR, KUBELET_SOCKET, MAX_SOCKET_PATH
from services.deviceplugin.rules.allocate import Compat, Isolation, ResponseOptions
from services.deviceplugin.rules.devices import DeviceConfig, Mode
from shared.config import ConfigError, NodeSettings, require_node
from shared.runtime.command import ServiceCommand

if TYPE_CHECKING:  # the lifecycle (and gRPC) load only when the plugin runs
    from shared.runtime.lifecycle import Hosted


class DevicePluginSettings(NodeSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Device plugin settings."""

    mode: Annotated[
        Mode,
        msgspec.Meta(
            description="resource mode: 'logical' advertises tessera.dev/gpu as logical devices "
            "per GPU; 'memory-units' advertises tessera.dev/gpu-memory, one device per memory unit"
        ),
    ] = "logical"
    split_memory_mib: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            description="logical mode: one logical device per this many MiB of a GPU's memory "
            "(never fewer than 2 per GPU)",
        ),
    ] = 2048
    split_count: Annotated[
        int,
        msgspec.Meta(
            ge=0, description="logical mode: the same split count for every GPU (0 = by memory)"
        ),
    ] = 0
    split_counts: Annotated[
        tuple[str, ...],
        msgspec.Meta(
            description="logical mode: split count of single GPUs as GPU=N, GPU being a UUID or "
            "an index, e.g. 0=4,GPU-8f2c...=8"
        ),
    ] = ()
    memory_unit_mib: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            description="memory-units mode: MiB one device stands for. The kubelet takes about "
            "50,000 devices per plugin in one message; 0 = the smallest unit that fits this "
            "node (1 MiB up to about 50 GiB of GPU memory), logged and shown in /readyz. Pods "
            "ask tessera.dev/gpu-memory in MiB and the kubelet hands one device per MiB asked, "
            "so with a unit of N MiB a node offers 1/N of its GPU memory",
        ),
    ] = 0
    plugin_dir: Annotated[
        str,
        msgspec.Meta(description="the kubelet's device plugin directory (holds kubelet.sock)"),
    ] = DEFAULT_PLUGIN_DIR
    endpoint: Annotated[
        str,
        msgspec.Meta(
            description="socket file name this plugin serves in --plugin-dir "
            "(empty = tessera-<mode>.sock)"
        ),
    ] = ""
    isolation: Annotated[
        Isolation,
        msgspec.Meta(description="isolation provider whose variables and mounts containers get"),
    ] = "none"
    mps_pipe_dir: Annotated[
        str,
        msgspec.Meta(description="isolation mps: host directory of the MPS control daemon's pipes"),
    ] = "/tmp/nvidia-mps"
    hami_core_library: Annotated[
        str,
        msgspec.Meta(description="isolation hami-core: host path of HAMi-core's libvgpu.so"),
    ] = "/usr/local/vgpu/libvgpu.so"
    compat_envs: Annotated[
        tuple[Compat, ...],
        msgspec.Meta(
            description="compatibility variables for existing images: volcano, aliyun (or both)"
        ),
    ] = ()
    pre_start: Annotated[
        bool,
        msgspec.Meta(
            description="ask the kubelet to call PreStartContainer, which refuses to start a "
            "container whose decided GPU has turned unhealthy"
        ),
    ] = False
    record_wait_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            description="how long Allocate waits for the binder's bound record before refusing",
        ),
    ] = 2.0
    nats_wait_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            description="how long Allocate waits for NATS to come back (a restart) before "
            "refusing; the kubelet fails the pod on a refusal",
        ),
    ] = 15.0
    kubelet_poll_s: Annotated[
        float,
        msgspec.Meta(gt=0, description="how often to check whether the kubelet restarted"),
    ] = 1.0
    api: Annotated[
        Literal["device-plugin", "dra"],
        msgspec.Meta(
            description="'dra': serve the kubelet's DRA plugin API (gpu.tessera.dev, "
            "registered through --registry-dir; for a node labelled tessera.dev/gpu-api=dra) "
            "instead of the device plugin API"
        ),
    ] = "device-plugin"
    registry_dir: Annotated[
        str, msgspec.Meta(description="dra: the kubelet's plugin registration directory")
    ] = "/var/lib/kubelet/plugins_registry"
    dra_plugin_dir: Annotated[
        str,
        msgspec.Meta(
            description="dra: the kubelet's plugin directory (dra.sock goes in <it>/<driver>)"
        ),
    ] = "/var/lib/kubelet/plugins"
    cdi_dir: Annotated[
        str, msgspec.Meta(description="dra: where the CDI spec of each prepared claim is written")
    ] = "/var/run/cdi"


def parse_split_counts(entries: tuple[str, ...]) -> dict[str, int]:
    """``("0=4", "GPU-x=8")`` -> ``{"0": 4, "GPU-x": 8}``; ConfigError naming a bad entry."""
    counts: dict[str, int] = {}
    for entry in entries:
        gpu, separator, count = entry.partition("=")
        if not separator or not gpu.strip() or not count.strip().isdigit():
            raise ConfigError(
                f"--split-counts entry {entry!r}: expected GPU=N with GPU a UUID or an index and "
                "N a whole number"
            )
        if int(count) < 2:
            raise ConfigError(f"--split-counts entry {entry!r}: a GPU needs at least 2 devices")
        counts[gpu.strip()] = int(count)
    return counts


def build_config(settings: DevicePluginSettings) -> PluginConfig:
    """Check the settings together and derive the plugin's configuration; ConfigError if not."""
    node = require_node(settings)
    endpoint = settings.endpoint or f"tessera-{settings.mode}.sock"
    if "/" in endpoint or endpoint == KUBELET_SOCKET:
        raise ConfigError(
            f"--endpoint {endpoint!r} must be a plain file name other than {KUBELET_SOCKET}"
        )
    plugin_dir = Path(settings.plugin_dir)
    longest = max(len(str(plugin_dir / endpoint)), len(str(plugin_dir / KUBELET_SOCKET)))
    if longest > MAX_SOCKET_PATH:
        raise ConfigError(
            f"--plugin-dir {settings.plugin_dir!r}: socket paths in it would be {longest} bytes, "
            f"over the {MAX_SOCKET_PATH}-byte limit of unix sockets"
        )
    return PluginConfig(
        node=node,
        devices=DeviceConfig(
            mode=settings.mode,
            split_memory_mib=settings.split_memory_mib,
            split_count=settings.split_count,
            split_counts=parse_split_counts(settings.split_counts),
            memory_unit_mib=settings.memory_unit_mib,
        ),
        response=ResponseOptions(
            isolation=settings.isolation,
            mps_pipe_dir=settings.mps_pipe_dir,
            hami_core_library=settings.hami_core_library,
            compat=frozenset(settings.compat_envs),
        ),
        plugin_dir=plugin_dir,
        endpoint=endpoint,
        pre_start=settings.pre_start,
        record_wait_s=settings.record_wait_s,
        nats_wait_s=settings.nats_wait_s,
        kubelet_poll_s=settings.kubelet_poll_s,
        api=settings.api,
        registry_dir=Path(settings.registry_dir),
        dra_plugin_dir=Path(settings.dra_plugin_dir),
        cdi_dir=Path(settings.cdi_dir),
    )


async def main(settings: DevicePluginSettings, *, hosted: Hosted | None = None) -> int:
    """Run the device plugin until SIGTERM; the exit code (``hosted``: one of several services
    of this process, see ``run_service``)."""
    # Imported here so that `tessera --help` and the other services do not load gRPC.
    from services.deviceplugin.service import run_plugin
    from shared.runtime.lifecycle import run_service

    config = build_config(settings)
    return await run_service(
        name="deviceplugin",
        settings=settings,
        body=functools.partial(run_plugin, config=config),
        hosted=hosted,
    )


SERVICE = ServiceCommand(
    name="deviceplugin",
    summary="serve the kubelet's device plugin API for one node",
    description="The device plugin advertises Tessera devices to the kubelet (logical devices "
    "per GPU, or one device per memory unit) and answers Allocate exactly from the pod's "
    "assignment record (what a placer committed, written bound by the binder), then moves it "
    "to allocated.",
    settings=DevicePluginSettings,
    main=main,
)
