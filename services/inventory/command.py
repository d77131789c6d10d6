"""``tessera inventory``: settings and entry point of the inventory service.

``main`` checks the settings, builds the GPU reader for ``--backend`` and opens it *before*
anything else starts: a node without a usable NVML fails at once with one line naming the cause
and the way out (exit code 4), never with a traceback. Then the service runs under
``shared.runtime.lifecycle.run_service`` until SIGTERM, and the reader is closed last.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec

from services.inventory import snapshot
from services.inventory.fake import FakeReader, FakeSpecError, load_fake_spec, parse_fake_gpus
from services.inventory.reader import BackendUnavailableError, GpuReader
from services.inventory.service import InventoryMetrics, InventoryService
from shared.config import ConfigError, NodeSettings, require_node
from shared.runtime.command import ServiceCommand
from shared.runtime.lifecycle import Hosted, ServiceContext, run_service

EXIT_BACKEND_UNAVAILABLE: Final = 4


class InventorySettings(NodeSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Inventory settings."""

    backend: Annotated[
        Literal["nvml", "fake"],
        msgspec.Meta(
            description="where GPU readings come from: nvml (the driver) or fake "
            "(simulated GPUs, see --fake-gpus / --fake-spec)"
        ),
    ] = "nvml"
    fake_gpus: Annotated[
        str,
        msgspec.Meta(
            description="fake GPUs as COUNTxMODEL-MEMORY groups, comma-separated, e.g. "
            "4xA100-80GB or 2xA100-80GB,1xT4-16GB (with --backend fake)"
        ),
    ] = ""
    fake_spec: Annotated[
        str,
        msgspec.Meta(
            description="TOML or JSON file describing fake GPUs, scripted load and "
            "health events (with --backend fake)"
        ),
    ] = ""
    nvml_library: Annotated[
        str,
        msgspec.Meta(
            description="path of libnvidia-ml.so.1 when it is not on the library "
            "path; empty = let the loader find it"
        ),
    ] = ""
    poll_interval_s: Annotated[
        float, msgspec.Meta(gt=0, description="seconds between two reads of every GPU")
    ] = 2.0
    heartbeat_interval_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="publish at least this often (seconds) even when "
            "nothing changed beyond the deadbands (well below the placer's --inventory-stale-s, "
            "after which it stops placing on the node)",
        ),
    ] = 10.0
    deadband_memory_mib: Annotated[
        int, msgspec.Meta(ge=0, description="used-memory change (MiB) that is still noise")
    ] = 256
    deadband_utilization_pct: Annotated[
        int,
        msgspec.Meta(ge=0, le=100, description="utilisation change (points) that is still noise"),
    ] = 5
    deadband_temperature_c: Annotated[
        int, msgspec.Meta(ge=0, description="temperature change (C) that is still noise")
    ] = 3
    deadband_power_w: Annotated[
        float, msgspec.Meta(ge=0, description="power change (W) that is still noise")
    ] = 15.0
    health_probe_period_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            description="an unhealthy GPU is probed again this many seconds "
            "after its last fault and is healthy again if it "
            "answers normally",
        ),
    ] = 60.0
    event_wait_timeout_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=60,
            description="longest single wait for an NVML health event "
            "(seconds); bounds how long a stop waits for it",
        ),
    ] = 1.0


def policy_of(settings: InventorySettings) -> snapshot.Policy:
    """The pure core's tunables, from the settings."""
    return snapshot.Policy(
        heartbeat_s=settings.heartbeat_interval_s,
        probe_after_s=settings.health_probe_period_s,
        deadbands=snapshot.Deadbands(
            memory_mib=settings.deadband_memory_mib,
            utilization_pct=settings.deadband_utilization_pct,
            temperature_c=settings.deadband_temperature_c,
            power_w=settings.deadband_power_w,
        ),
    )


def build_reader(settings: InventorySettings, *, node: str) -> GpuReader:
    """The reader ``--backend`` asks for, or ConfigError when its options do not fit."""
    if settings.backend == "nvml":
        if settings.fake_gpus or settings.fake_spec:
            raise ConfigError("--fake-gpus and --fake-spec need --backend fake")
        # Imported here so that a fake node never loads pynvml at all.
        from services.inventory.nvml import NvmlReader

        return NvmlReader(library=settings.nvml_library)
    if bool(settings.fake_gpus) == bool(settings.fake_spec):
        raise ConfigError(
            "--backend fake needs exactly one of --fake-gpus (e.g. 4xA100-80GB) or --fake-spec FILE"
        )
    try:
        spec = (
            parse_fake_gpus(settings.fake_gpus)
            if settings.fake_gpus
            else load_fake_spec(Path(settings.fake_spec))
        )
        return FakeReader(spec, node=node)
    except FakeSpecError as error:
        raise ConfigError(str(error)) from None


def check(settings: InventorySettings) -> None:
    """Combinations of settings that each look fine alone; ConfigError when they do not fit."""
    if settings.heartbeat_interval_s < settings.poll_interval_s:
        raise ConfigError(
            f"--heartbeat-interval-s ({settings.heartbeat_interval_s}) must not be shorter than "
            f"--poll-interval-s ({settings.poll_interval_s}): the heartbeat is checked at each poll"
        )


def producer_id(started_at: float) -> str:
    """This process's identity on its snapshots: host, pid and start time (unique per start), so
    readers order its snapshots by sequence and never confuse them with another process's."""
    return f"{os.uname().nodename}/{os.getpid()}/{started_at:.6f}"


async def inventory_body(
    context: ServiceContext, *, reader: GpuReader, settings: InventorySettings, node: str
) -> None:
    """The service body ``run_service`` runs: wire the ports, run until cancelled."""
    service = InventoryService(
        reader=reader,
        bus=context.bus,
        clock=context.clock,
        node=node,
        policy=policy_of(settings),
        poll_interval_s=settings.poll_interval_s,
        event_wait_timeout_s=settings.event_wait_timeout_s,
        metrics=InventoryMetrics.create(context.registry),
        readiness=context.readiness,
        producer=producer_id(context.clock.now()),
    )
    await service.run()


async def main(settings: InventorySettings, *, hosted: Hosted | None = None) -> int:
    """Entry point of ``tessera inventory``; returns the process exit code (``hosted``: one of
    several services of this process, see ``run_service``)."""
    node = require_node(settings)
    check(settings)
    reader = build_reader(settings, node=node)
    try:
        await reader.open()
    except BackendUnavailableError as error:
        print(f"tessera inventory: {error}", file=sys.stderr)
        await reader.close()
        return EXIT_BACKEND_UNAVAILABLE
    try:
        return await run_service(
            name="inventory",
            settings=settings,
            body=functools.partial(inventory_body, reader=reader, settings=settings, node=node),
            hosted=hosted,
        )
    finally:
        await reader.close()


SERVICE = ServiceCommand(
    name="inventory",
    summary="publish NVML telemetry and GPU health for one node",
    description="The inventory reads every GPU on its node through NVML (or a fake backend) and "
    "publishes snapshots to tessera.inventory.<node> and the inventory KV bucket: on change "
    "beyond the deadbands, or every heartbeat interval. Exit codes: 0 after SIGTERM, 1 when the "
    "service failed, 2 configuration error, 4 GPU backend unavailable (no NVML).",
    settings=InventorySettings,
    main=main,
)
