"""The simulated kubelet's device manager against plugins over real gRPC. It dials a registered
plugin as the kubelet does: it waits for the connection (``grpc.WithBlock()`` with a timeout)
instead of taking a first failed connect for a plugin gone, which would leave the node's devices
unhealthy with nobody to register again. A plugin registering again while an Allocate to it is in
flight fails that pod's admission, as the kubelet's does, and the node goes on starting pods."""

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
from tessera.devcluster.resources import NODE, POD
from tests.harness.wait import eventually

RESOURCE = "example.com/gpu"
ENDPOINT = "late.sock"


class TwoDevices(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    """A plugin that lists two healthy devices and then keeps the stream open."""

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        yield api_pb2.ListAndWatchResponse(
            devices=[api_pb2.Device(ID=f"dev-{n}", health="Healthy") for n in range(2)]
        )
        await asyncio.Event().wait()


class HeldAllocate(TwoDevices):
    """Two devices, and an Allocate that answers once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls = 0

    async def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.calls += 1
        await self.release.wait()
        return api_pb2.AllocateResponse(
            container_responses=[api_pb2.ContainerAllocateResponse(envs={"DEVICE": "given"})]
        )


async def register(kubelet: SimulatedKubelet) -> None:
    """The plugin's Register call to the kubelet."""
    async with grpc.aio.insecure_channel(f"unix://{kubelet.socket}") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(version=API_VERSION, endpoint=ENDPOINT, resource_name=RESOURCE),
            timeout=5,
        )


def bound_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "node-1",
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {RESOURCE: "1"}}}
            ],
        },
    }


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
        await register(kubelet)
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


async def test_a_plugin_registering_again_mid_allocate_fails_that_pod_and_no_other(
    api: ApiServer, plugin_dir: Path
) -> None:
    kubelet = SimulatedKubelet(api=api, spec=NodeSpec(name="node-1"), plugin_dir=plugin_dir)
    await kubelet.start()
    devices = HeldAllocate()
    plugin = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(devices, plugin)
    plugin.add_insecure_port(f"unix://{plugin_dir / ENDPOINT}")
    await plugin.start()

    def phase(name: str) -> str:
        found = api.find(POD, "default", name)
        return str(((found or {}).get("status") or {}).get("phase", ""))

    try:
        await register(kubelet)
        await kubelet.registered(RESOURCE, timeout=8)
        kubelet.pod_event("ADDED", api.create(POD, bound_pod("first"), "default"))
        await eventually(lambda: devices.calls == 1, what="an Allocate in flight")
        # The kubelet closes the old registration's channel, cancelling the call in flight.
        await register(kubelet)
        await eventually(lambda: phase("first") == "Failed", what="first Failed")
        status = api.get(POD, "default", "first")["status"]
        assert status["reason"] == "UnexpectedAdmissionError"
        assert "code = Cancelled desc = grpc: the client connection is closing" in status["message"]
        devices.release.set()
        await kubelet.registered(RESOURCE, timeout=8)
        kubelet.pod_event("ADDED", api.create(POD, bound_pod("second"), "default"))
        await eventually(lambda: phase("second") == "Running", what="second Running")
    finally:
        devices.release.set()
        await plugin.stop(0)
        await kubelet.stop()
