"""The simulated kubelet's device manager dials a registered plugin as the kubelet does: it waits
for the connection (``grpc.WithBlock()`` with a timeout) instead of taking a first failed connect
for a plugin gone, which would leave the node's devices unhealthy with nobody to register again."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.deviceplugin._proto import api_pb2, api_pb2_grpc
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.devicemanager import API_VERSION
from tessera.devcluster.kubelet import NodeSpec, SimulatedKubelet
from tessera.devcluster.resources import NODE

RESOURCE = "example.com/gpu"
ENDPOINT = "late.sock"


class TwoDevices(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    """A plugin that lists two healthy devices and then keeps the stream open."""

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        yield api_pb2.ListAndWatchResponse(
            devices=[api_pb2.Device(ID=f"dev-{n}", health="Healthy") for n in range(2)]
        )
        await asyncio.Event().wait()


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dm-", dir="/tmp"))  # unix sockets: short paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_plugin_that_serves_just_after_registering_gets_its_devices_listed(
    api: ApiServer, plugin_dir: Path
) -> None:
    kubelet = SimulatedKubelet(api=api, spec=NodeSpec(name="node-1"), plugin_dir=plugin_dir)
    await kubelet.start()
    plugin = grpc.aio.server()
    try:
        async with grpc.aio.insecure_channel(f"unix://{kubelet.socket}") as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION, endpoint=ENDPOINT, resource_name=RESOURCE
                ),
                timeout=5,
            )
        # Not serving yet: the kubelet's first connect fails, and it must keep dialling.
        await asyncio.sleep(0.3)
        api_pb2_grpc.add_DevicePluginServicer_to_server(TwoDevices(), plugin)
        plugin.add_insecure_port(f"unix://{plugin_dir / ENDPOINT}")
        await plugin.start()
        await kubelet.registered(RESOURCE, timeout=8)
        node = api.find(NODE, "", "node-1")
        assert node is not None
        assert node["status"]["allocatable"][RESOURCE] == "2"
    finally:
        await plugin.stop(0)
        await kubelet.stop()
