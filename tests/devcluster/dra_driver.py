"""A minimal DRA driver's kubelet plugin for the tests (not Tessera's): what
``kubernetes-sigs/dra-example-driver`` does, over real gRPC on unix sockets.

- It serves ``pluginregistration.Registration`` on ``<registry>/<driver>-reg.sock`` (GetInfo:
  type ``DRAPlugin``, its driver name, its ``dra.sock`` endpoint, the services it names) and
  records what ``NotifyRegistrationStatus`` tells it.
- It publishes its node's ResourceSlice through the API over HTTP.
- ``NodePrepareResources``: for each claim it GETs the ResourceClaim over HTTP (as a driver must:
  the call names the claim only), takes the allocation results of its driver, writes one CDI
  spec per claim (``<kind>=<claim uid>-<device>``, env ``NVIDIA_VISIBLE_DEVICES`` with the GPU's
  uuid and ``TESSERA_GPU_MEMORY_LIMIT_MIB`` from the result's consumed memory, or the whole GPU)
  and answers the devices with their CDI names. ``NodeUnprepareResources`` removes the spec.
- Tests steer it: claims to leave out of the next answer, errors to answer, CDI names with no
  spec; it records every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from services.deviceplugin._proto.dra.v1 import api_pb2 as dra_pb2
from services.deviceplugin._proto.dra.v1 import api_pb2_grpc as dra_grpc
from services.deviceplugin._proto.pluginregistration.v1 import api_pb2 as registration_pb2
from services.deviceplugin._proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from shared.quantity import mebibytes

DRA_SERVICE = "v1.DRAPlugin"


@dataclass(frozen=True)
class Gpu:
    name: str
    uuid: str
    memory_mib: int


@dataclass
class Calls:
    """What the kubelet asked of the plugin, and what registration it was told."""

    prepared: list[list[str]] = field(default_factory=list)
    """Claim names of each NodePrepareResources call."""
    unprepared: list[list[str]] = field(default_factory=list)
    registration: list[tuple[bool, str]] = field(default_factory=list)


class _Registration(registration_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, driver: TestDriver) -> None:
        self.driver = driver

    async def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        return registration_pb2.PluginInfo(
            type=self.driver.plugin_type,
            name=self.driver.name,
            endpoint=str(self.driver.endpoint),
            supported_versions=self.driver.services,
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.driver.calls.registration.append((request.plugin_registered, request.error))
        return registration_pb2.RegistrationStatusResponse()


class _Plugin(dra_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, driver: TestDriver) -> None:
        self.driver = driver

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        driver = self.driver
        driver.calls.prepared.append([c.name for c in request.claims])
        answer = dra_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            if claim.name in driver.skip_once:
                driver.skip_once.discard(claim.name)
                continue
            if claim.name in driver.errors:
                answer.claims[claim.uid].error = driver.errors[claim.name]
                continue
            if driver.held is not None:
                await driver.held.wait()
            devices = await driver.prepare(claim)
            answer.claims[claim.uid].devices.extend(devices)
        return answer

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.driver.calls.unprepared.append([c.name for c in request.claims])
        answer = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            with contextlib.suppress(FileNotFoundError):
                self.driver.spec_path(claim.uid).unlink()
            answer.claims[claim.uid].error = ""
        return answer


class TestDriver:
    """See the module docstring."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(
        self,
        *,
        name: str,
        node: str,
        registry_dir: Path,
        socket_dir: Path,
        cdi_dir: Path,
        api_url: str,
        token: str,
        gpus: tuple[Gpu, ...],
        services: tuple[str, ...] = (DRA_SERVICE,),
        plugin_type: str = "DRAPlugin",
    ) -> None:
        self.name = name
        self.node = node
        self.registration_socket = registry_dir / f"{name}-reg.sock"
        self.endpoint = socket_dir / "dra.sock"
        self.cdi_dir = cdi_dir
        self.api_url = api_url
        self.token = token
        self.gpus = {gpu.name: gpu for gpu in gpus}
        self.services = list(services)
        self.plugin_type = plugin_type
        self.kind = f"{name}/gpu"
        self.calls = Calls()
        self.skip_once: set[str] = set()
        """Claims to leave out of the next answer (the kubelet must ask again)."""
        self.errors: dict[str, str] = {}
        """Claim name -> the error to answer for it."""
        self.no_spec: set[str] = set()
        """Claims whose CDI spec is not written (their names do not resolve)."""
        self.held: asyncio.Event | None = None
        """When set, NodePrepareResources answers only once the event is set."""
        self._servers: list[Any] = []
        self._session: aiohttp.ClientSession | None = None

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / f"{self.name}-{claim_uid}.json"

    async def start(self) -> None:
        """Serve the plugin, then the registration socket (a driver registers once it serves)."""
        self.endpoint.parent.mkdir(parents=True, exist_ok=True)
        self._session = aiohttp.ClientSession()
        plugin = grpc.aio.server()
        dra_grpc.add_DRAPluginServicer_to_server(_Plugin(self), plugin)
        plugin.add_insecure_port(f"unix://{self.endpoint}")
        await plugin.start()
        self._servers = [plugin, await self._serve_registration()]

    async def _serve_registration(self) -> Any:
        registration = grpc.aio.server()
        registration_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)
        with contextlib.suppress(FileNotFoundError):
            self.registration_socket.unlink()
        registration.add_insecure_port(f"unix://{self.registration_socket}")
        await registration.start()
        return registration

    async def register_again(self) -> None:
        """A new registration socket in place of the old, the plugin still serving (as a
        restarted plugin's): the kubelet deregisters the plugin, then registers it again."""
        plugin, registration = self._servers
        await registration.stop(0)
        self._servers = [plugin, await self._serve_registration()]

    async def stop(self) -> None:
        """What a plugin that exits does: its sockets go away."""
        for server in reversed(self._servers):
            await server.stop(0)
        self._servers = []
        for path in (self.registration_socket, self.endpoint):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self._session is not None
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        async with self._session.request(
            method, self.api_url + path, headers=headers, data=json.dumps(body) if body else None
        ) as response:
            return response.status, await response.json()

    async def publish(self) -> None:
        """The node's ResourceSlice: one device per GPU, allocatable many times (consumable
        memory, 1 GiB steps)."""
        devices = [
            {
                "name": gpu.name,
                "allowMultipleAllocations": True,
                "attributes": {"uuid": {"string": gpu.uuid}},
                "capacity": {
                    "memory": {
                        "value": f"{gpu.memory_mib}Mi",
                        "requestPolicy": {
                            "default": f"{gpu.memory_mib}Mi",
                            "validRange": {"min": "1Gi", "step": "1Gi"},
                        },
                    }
                },
            }
            for gpu in self.gpus.values()
        ]
        body = {
            "metadata": {"name": f"{self.node}-{self.name}"},
            "spec": {
                "driver": self.name,
                "nodeName": self.node,
                "pool": {"name": self.node, "generation": 0, "resourceSliceCount": 1},
                "devices": devices,
            },
        }
        status, answer = await self._api("POST", "/apis/resource.k8s.io/v1/resourceslices", body)
        assert status in (201, 409), answer

    async def prepare(self, claim: Any) -> list[Any]:
        path = f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}"
        status, stored = await self._api("GET", path)
        assert status == 200 and stored["metadata"]["uid"] == claim.uid, stored
        allocation = (stored.get("status") or {}).get("allocation") or {}
        results = [
            r for r in allocation.get("devices", {}).get("results", []) if r["driver"] == self.name
        ]
        devices = []
        spec_devices = []
        for result in results:
            gpu = self.gpus[result["device"]]
            consumed = (result.get("consumedCapacity") or {}).get("memory")
            memory = mebibytes(consumed) if consumed else gpu.memory_mib
            cdi_name = f"{claim.uid}-{result['device']}"
            spec_devices.append(
                {
                    "name": cdi_name,
                    "containerEdits": {
                        "env": [
                            f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}",
                            f"TESSERA_GPU_MEMORY_LIMIT_MIB={memory}",
                        ],
                        "deviceNodes": [{"path": f"/dev/nvidia{result['device'][-1]}"}],
                    },
                }
            )
            device = dra_pb2.Device(
                request_names=[result["request"]],
                pool_name=result["pool"],
                device_name=result["device"],
                cdi_device_ids=[f"{self.kind}={cdi_name}"],
            )
            if result.get("shareID"):
                device.share_id = result["shareID"]
            devices.append(device)
        if claim.name not in self.no_spec:
            spec = {
                "cdiVersion": "0.6.0",
                "kind": self.kind,
                "containerEdits": {"env": [f"DRA_DRIVER={self.name}"]},
                "devices": spec_devices,
            }
            self.spec_path(claim.uid).write_text(json.dumps(spec))
        return devices
