"""Fixtures for device plugin tests: a plugin directory, a fake kubelet, running plugins."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.deviceplugin.command import DevicePluginSettings, build_config
from services.deviceplugin.config import PluginConfig
from services.deviceplugin.service import run_plugin
from shared import codec, subjects
from shared.messages.assignments import AssignmentRecord
from shared.runtime.bus import Bus
from shared.runtime.health import Readiness
from shared.runtime.lifecycle import run_service
from tests.deviceplugin.builders import NODE
from tests.deviceplugin.fake_kubelet import FakeKubelet
from tests.harness.nats import NatsServer
from tests.harness.wait import eventually

until = functools.partial(eventually, timeout=10.0, interval=0.01)
"""Wait (polling) until ``condition()`` holds."""


@dataclass
class RunningPlugin:
    config: PluginConfig
    readiness: Readiness
    stop: asyncio.Event

    @property
    def endpoint(self) -> str:
        return self.config.endpoint

    def ready(self) -> bool:
        return self.readiness.ready

    def check(self, name: str) -> tuple[bool, str]:
        return self.readiness.report().get(name, (False, "absent"))


PluginFactory = Callable[..., contextlib.AbstractAsyncContextManager[RunningPlugin]]


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short directory under /tmp: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[FakeKubelet]:
    async with FakeKubelet(plugin_dir) as fake:
        yield fake


@pytest.fixture
def start_plugin(nats_server: NatsServer, plugin_dir: Path) -> PluginFactory:
    """``async with start_plugin(mode="memory-units", ...) as plugin:`` runs a real plugin
    process body (run_service + run_plugin) against the test's nats-server, ready on exit."""

    @contextlib.asynccontextmanager
    async def running(
        *, directory: Path | None = None, wait_ready: bool = True, **overrides: Any
    ) -> AsyncIterator[RunningPlugin]:
        fields: dict[str, Any] = {
            "node": NODE,
            "nats_url": nats_server.url,
            "http_host": "127.0.0.1",
            "http_port": 0,
            "log_format": "text",
            "plugin_dir": str(directory or plugin_dir),
            "kubelet_poll_s": 0.05,
            "record_wait_s": 0.3,
        }
        settings = DevicePluginSettings(**(fields | overrides))
        config = build_config(settings)
        plugin = RunningPlugin(config=config, readiness=Readiness(), stop=asyncio.Event())
        task = asyncio.create_task(
            run_service(
                name="deviceplugin",
                settings=settings,
                body=functools.partial(run_plugin, config=config),
                stop=plugin.stop,
                readiness=plugin.readiness,
            )
        )
        try:
            if wait_ready:
                await until(
                    lambda: plugin.ready() or task.done(),
                    what=f"plugin readiness {plugin.readiness.report()}",
                )
                assert not task.done(), "the plugin stopped while starting"
            yield plugin
        finally:
            plugin.stop.set()
            assert await asyncio.wait_for(task, timeout=10) == 0

    return running


async def get_record(bus: Bus, uid: str, node: str = NODE) -> AssignmentRecord:
    entry = await bus.kv_get(subjects.KV_ASSIGNMENTS, subjects.assignment_key(node, uid))
    assert entry is not None
    return codec.decode(entry.value, AssignmentRecord)
