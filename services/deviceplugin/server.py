"""The gRPC adapter: the kubelet's v1beta1 API in and out (the only module here importing grpc).

It translates and nothing more. :class:`GrpcPluginServer` serves the DevicePlugin service on a unix
socket and turns each RPC into a call on a :class:`PluginCore` (the service), protobuf into plain
values and back; a :class:`~services.deviceplugin.rules.allocate.Refusal` becomes a gRPC error whose
message the kubelet shows in the pod's admission error. :func:`register` calls the kubelet's
Registration service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import grpc

from services.deviceplugin._proto import api_pb2, api_pb2_grpc
from services.deviceplugin.kubelet import RegistrationError
from services.deviceplugin.rules.allocate import ContainerGrant, Refusal, RefusalKind
from services.deviceplugin.rules.devices import Device

log = logging.getLogger(__name__)

API_VERSION: Final = "v1beta1"

STATUS_OF_REFUSAL: Final[dict[RefusalKind, grpc.StatusCode]] = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "no_record": grpc.StatusCode.FAILED_PRECONDITION,
    "uncommitted": grpc.StatusCode.PERMISSION_DENIED,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "conflict": grpc.StatusCode.ABORTED,
}


@dataclass(frozen=True, slots=True)
class PluginOptions:
    """What the plugin tells the kubelet it implements."""

    pre_start_required: bool = False
    preferred_allocation: bool = True


@dataclass(frozen=True, slots=True)
class PreferenceRequest:
    """One container of a GetPreferredAllocation call."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


class PluginCore(Protocol):
    """What the gRPC servicer needs from the service behind it."""

    @property
    def options(self) -> PluginOptions: ...

    def device_lists(self) -> AsyncIterator[tuple[Device, ...]]:
        """The current device list at once, then each changed list, until closed."""
        ...

    def preferred(self, requests: Sequence[PreferenceRequest]) -> list[tuple[str, ...]]:
        """The preferred IDs for each container."""
        ...

    async def allocate(self, requests: Sequence[tuple[str, ...]]) -> list[ContainerGrant] | Refusal:
        """One grant per container (the kubelet's device IDs each), or why not."""
        ...

    async def pre_start(self, device_ids: tuple[str, ...]) -> Refusal | None:
        """None when the container may start."""
        ...


def _device_message(device: Device) -> api_pb2.Device:
    topology = (
        api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=device.numa_node)])
        if device.numa_node is not None
        else None
    )
    return api_pb2.Device(ID=device.id, health=device.health, topology=topology)


def _grant_message(grant: ContainerGrant) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=grant.envs,
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in grant.mounts
        ],
        annotations=grant.annotations,
    )


class _Servicer(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, core: PluginCore) -> None:
        self._core = core
        self._last_list: tuple[tuple[Device, ...], api_pb2.ListAndWatchResponse] | None = None

    def _list_message(self, devices: tuple[Device, ...]) -> api_pb2.ListAndWatchResponse:
        # Every open stream sends the same list after a change: build the message once.
        if self._last_list is None or self._last_list[0] is not devices:
            message = api_pb2.ListAndWatchResponse(devices=[_device_message(d) for d in devices])
            self._last_list = (devices, message)
        return self._last_list[1]

    async def GetDevicePluginOptions(  # noqa: N802 (the generated servicer's method name)
        self, request: api_pb2.Empty, context: Any
    ) -> api_pb2.DevicePluginOptions:
        options = self._core.options
        return api_pb2.DevicePluginOptions(
            pre_start_required=options.pre_start_required,
            get_preferred_allocation_available=options.preferred_allocation,
        )

    async def ListAndWatch(  # noqa: N802 (the generated servicer's method name)
        self, request: api_pb2.Empty, context: Any
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        lists = self._core.device_lists()
        try:
            async for devices in lists:
                yield self._list_message(devices)
        finally:
            await lists.aclose()  # type: ignore[attr-defined]

    async def GetPreferredAllocation(  # noqa: N802 (the generated servicer's method name)
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        answers = self._core.preferred(
            [
                PreferenceRequest(
                    available=tuple(r.available_deviceIDs),
                    must_include=tuple(r.must_include_deviceIDs),
                    size=r.allocation_size,
                )
                for r in request.container_requests
            ]
        )
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=list(ids)) for ids in answers
            ]
        )

    async def Allocate(  # noqa: N802 (the generated servicer's method name)
        self, request: api_pb2.AllocateRequest, context: Any
    ) -> api_pb2.AllocateResponse:
        result = await self._core.allocate(
            [tuple(r.devices_ids) for r in request.container_requests]
        )
        if isinstance(result, Refusal):
            await context.abort(STATUS_OF_REFUSAL[result.kind], result.message)
        assert not isinstance(result, Refusal)  # abort raises
        return api_pb2.AllocateResponse(container_responses=[_grant_message(g) for g in result])

    async def PreStartContainer(  # noqa: N802 (the generated servicer's method name)
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        refusal = await self._core.pre_start(tuple(request.devices_ids))
        if refusal is not None:
            await context.abort(STATUS_OF_REFUSAL[refusal.kind], refusal.message)
        return api_pb2.PreStartContainerResponse()


def _unix_target(socket_path: str) -> str:
    # gRPC needs an absolute path after unix:// ("unix://relative" is an authority, and fails).
    return f"unix://{os.path.abspath(socket_path)}"


def _fresh_socket_target(socket_path: str) -> str:
    """The gRPC target for serving at ``socket_path``, after removing what a previous run left."""
    # A stale socket (or anything else) left at our endpoint would make the bind fail.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    return _unix_target(socket_path)


class GrpcPluginServer:
    """The DevicePlugin service of ``core`` on a unix socket (implements ``PluginServer``)."""

    def __init__(self, core: PluginCore, *, stop_grace_s: float = 1.0) -> None:
        self._core = core
        self._grace = stop_grace_s
        self._server: Any = None

    async def start(self, socket_path: str) -> None:
        target = _fresh_socket_target(socket_path)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self._core), server)
        server.add_insecure_port(target)
        await server.start()
        self._server = server
        log.info("serving the device plugin API", extra={"socket": socket_path})

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(self._grace)


async def register(
    kubelet_socket: str,
    *,
    endpoint: str,
    resource: str,
    options: PluginOptions,
    timeout_s: float = 5.0,
) -> None:
    """Register ``resource`` served at ``endpoint`` (a file name in the plugin directory).

    Raises:
        RegistrationError: the kubelet did not answer within ``timeout_s`` or refused.
    """
    request = api_pb2.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource,
        options=api_pb2.DevicePluginOptions(
            pre_start_required=options.pre_start_required,
            get_preferred_allocation_available=options.preferred_allocation,
        ),
    )
    try:
        async with grpc.aio.insecure_channel(_unix_target(kubelet_socket)) as channel:
            async with asyncio.timeout(timeout_s):
                await channel.channel_ready()
            await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=timeout_s)
    except TimeoutError:
        raise RegistrationError(f"no answer from {kubelet_socket} within {timeout_s} s") from None
    except grpc.aio.AioRpcError as error:
        raise RegistrationError(f"{error.code().name}: {error.details()}") from None
