"""The simulated kubelet's device manager: the device-plugin registry and the Allocate calls.

It serves the kubelet's ``Registration`` service on ``kubelet.sock``, dials each registered
plugin back, follows its ``ListAndWatch`` stream into the Node's capacity and allocatable, and,
when a pod is admitted, picks devices for each container (``GetPreferredAllocation`` when the
plugin offers it) and calls ``Allocate``, recording each answer (:class:`ContainerRecord`). With
the DRA manager (``dramanager.py``), the part of the simulated cluster that speaks gRPC (see
``kubelet.py`` for the whole kubelet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from services.deviceplugin._proto import api_pb2, api_pb2_grpc
from shared.quantity import QuantityError, parse_quantity
from tessera.devcluster import grpccalls
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import NODE, ApiError, Obj

log = logging.getLogger("tessera.devcluster.kubelet")  # one logger for the whole kubelet

API_VERSION: Final = "v1beta1"
KUBELET_SOCKET: Final = "kubelet.sock"
KUBELET_CHECKPOINT: Final = "kubelet_internal_checkpoint"
"""The device manager's own file in the plugin directory, the one it keeps when it starts."""
REGISTRATION_TIMEOUT_S: Final = 10.0
DIAL_TIMEOUT_S: Final = 10.0
"""How long the kubelet waits to connect to a plugin that registered: it dials with
``grpc.WithBlock()`` and this timeout (``devicemanager/plugin/v1beta1/client.go``), so a
connection that fails at first (a channel to the same socket still backing off from the plugin's
previous process) is retried, not taken for a plugin gone."""


@dataclass(frozen=True)
class ContainerRecord:
    """What one container was given: by the device plugin (one Allocate answer per resource,
    ``resource`` its name), or by a DRA claim (its CDI devices resolved, ``resource`` is
    ``resourceclaims/<claim>``)."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    envs: Mapping[str, str]
    mounts: tuple[tuple[str, str, bool], ...]
    """(container path, host path, read only)."""
    annotations: Mapping[str, str]
    allocated_at: float
    device_nodes: tuple[str, ...] = ()
    """Container paths of device nodes (from CDI edits: DRA claims)."""


@dataclass
class _Plugin:
    """A registered device plugin: its endpoint, options and the devices it lists."""

    resource: str
    endpoint: str
    preferred: bool
    channel: Any
    stub: Any
    devices: dict[str, bool] = field(default_factory=dict)
    """Device ID -> healthy."""
    connected: bool = True
    task: asyncio.Task[None] | None = None


class AdmissionError(Exception):
    """The pod cannot be admitted: ``reason`` and ``message`` go to its status."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _count(value: Any) -> int:
    try:
        return int(parse_quantity(value))
    except (QuantityError, TypeError, ValueError):
        return 0


class _Registration(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: DeviceManager) -> None:
        self._kubelet = kubelet

    async def Register(  # noqa: N802 (the generated servicer's method name)
        self, request: Any, context: Any
    ) -> Any:
        problem = self._kubelet.registration_problem(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await self._kubelet.register(request)
        return api_pb2.Empty()


class DeviceManager:
    """The device-plugin half of a :class:`~tessera.devcluster.kubelet.SimulatedKubelet`."""

    def __init__(
        self, *, api: ApiServer, name: str, plugin_dir: Path, clock: Callable[[], float]
    ) -> None:
        self.api = api
        self.name = name
        self.plugin_dir = plugin_dir
        self.clock = clock
        self._server: Any = None
        self._plugins: dict[str, _Plugin] = {}
        self._allocated: dict[str, dict[str, set[str]]] = {}
        """Pod uid -> resource -> device IDs in use by the pod's containers."""
        self.registrations = 0
        self._registered = asyncio.Event()
        self.plugins_stopping = False
        """Set when whoever runs the plugins is about to stop them (``tessera up`` stopping):
        their streams then end as asked, which is no news worth a warning."""

    @property
    def socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    async def _serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def _stop_serving(self) -> None:
        """Drop every plugin and stop serving ``kubelet.sock``."""
        for plugin in list(self._plugins.values()):
            await self._drop_plugin(plugin)
        self._plugins.clear()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)

    async def restart(self) -> None:
        """What a restarting kubelet does to its plugins: stop, delete every file in the
        plugin directory but its own checkpoint (subdirectories are kept), serve again; plugins
        must register again."""
        await self._stop_serving()
        for path in self.plugin_dir.iterdir():
            if not path.is_dir() and path.name != KUBELET_CHECKPOINT:
                path.unlink()
        self._registered.clear()
        await self._serve()

    async def registered(self, resource: str, timeout: float = 30.0) -> None:
        """Wait until a plugin for ``resource`` registered and listed its devices."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (
            (plugin := self._plugins.get(resource)) is not None
            and plugin.connected
            and plugin.devices
        ):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no {resource} plugin registered on {self.name}")
            self._registered.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, 0.5)):
                    await self._registered.wait()

    def _reflect_devices(self) -> None:
        """Node ``status.capacity``/``allocatable`` of every device-plugin resource."""
        current = self.api.find(NODE, "", self.name)
        if current is None:
            return
        status = current.get("status") or {}
        capacity = dict(status.get("capacity") or {})
        allocatable = dict(status.get("allocatable") or {})
        for resource, plugin in self._plugins.items():
            healthy = sum(1 for ok in plugin.devices.values() if ok) if plugin.connected else 0
            capacity[resource] = str(len(plugin.devices))
            allocatable[resource] = str(healthy)
        if capacity == status.get("capacity") and allocatable == status.get("allocatable"):
            return
        # A merge patch cannot remove keys it does not name: send the whole maps.
        with contextlib.suppress(ApiError):
            self.api.patch(
                NODE,
                "",
                self.name,
                {"status": {"capacity": capacity, "allocatable": allocatable}},
                "application/merge-patch+json",
                "status",
            )

    # --- device plugins -------------------------------------------------------------------------

    def registration_problem(self, request: Any) -> str:
        if request.version != API_VERSION:
            return f"Unsupported version {request.version!r}: the kubelet supports {API_VERSION!r}"
        if not request.resource_name or "/" not in request.resource_name:
            return f"invalid extended resource name {request.resource_name!r}"
        if not request.endpoint or "/" in request.endpoint:
            return f"invalid endpoint {request.endpoint!r}: a file name in the plugin directory"
        return ""

    async def register(self, request: Any) -> None:
        resource = request.resource_name
        previous = self._plugins.pop(resource, None)
        channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}")
        plugin = _Plugin(
            resource=resource,
            endpoint=request.endpoint,
            preferred=bool(request.options.get_preferred_allocation_available),
            channel=channel,
            stub=api_pb2_grpc.DevicePluginStub(channel),
            devices=dict(previous.devices) if previous else {},
            connected=False,  # its devices count once it lists them
        )
        if previous is not None:
            await self._drop_plugin(previous)
        self._plugins[resource] = plugin
        self.registrations += 1
        plugin.task = asyncio.create_task(
            self._follow(plugin), name=f"kubelet-{self.name}-{resource}"
        )
        log.info(
            "device plugin registered",
            extra={"node": self.name, "resource": resource, "endpoint": request.endpoint},
        )

    async def _drop_plugin(self, plugin: _Plugin) -> None:
        if plugin.task is not None:
            plugin.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await plugin.task
        with contextlib.suppress(Exception):
            await plugin.channel.close()

    async def _follow(self, plugin: _Plugin) -> None:
        """Follow ``ListAndWatch`` until the stream ends; then the devices are unhealthy."""
        try:
            async with asyncio.timeout(DIAL_TIMEOUT_S):
                await plugin.channel.channel_ready()
        except TimeoutError:
            log.warning(
                "cannot connect to the device plugin",
                extra={"node": self.name, "resource": plugin.resource, "timeout_s": DIAL_TIMEOUT_S},
            )
            return
        try:
            async for response in plugin.stub.ListAndWatch(api_pb2.Empty()):
                plugin.devices = {d.ID: d.health == "Healthy" for d in response.devices}
                plugin.connected = True
                self._reflect_devices()
                self._registered.set()
        except grpc.aio.AioRpcError as error:
            log.log(
                logging.DEBUG if self.plugins_stopping else logging.WARNING,
                "device plugin stream ended",
                extra={"node": self.name, "resource": plugin.resource, "error": str(error.code())},
            )
        if self._plugins.get(plugin.resource) is plugin:
            plugin.connected = False
            self._reflect_devices()

    def _free(self, uid: str) -> None:
        self._allocated.pop(uid, None)

    # --- admission ------------------------------------------------------------------------------

    def _in_use(self, resource: str) -> set[str]:
        used: set[str] = set()
        for resources in self._allocated.values():
            used |= resources.get(resource, set())
        return used

    def _containers(self, pod: Obj) -> list[Obj]:
        spec = pod.get("spec") or {}
        return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])

    async def _allocate(self, pod: Obj, given: list[ContainerRecord]) -> None:
        """The device manager's Allocate for every container, in pod order; each answer is
        added to ``given`` (the pod record's containers) as it comes."""
        meta = pod["metadata"]
        uid = meta["uid"]
        for container in self._containers(pod):
            limits = (container.get("resources") or {}).get("limits") or {}
            for resource in sorted(limits):
                plugin = self._plugins.get(resource)
                if plugin is None:
                    continue  # not a device-plugin resource on this node
                needed = _count(limits[resource])
                if needed <= 0:
                    continue
                ids = await self._devices_to_allocate(plugin, needed)
                self._allocated.setdefault(uid, {}).setdefault(resource, set()).update(ids)
                try:
                    response = await grpccalls.answer(
                        plugin.stub.Allocate(
                            api_pb2.AllocateRequest(
                                container_requests=[
                                    api_pb2.ContainerAllocateRequest(devices_ids=ids)
                                ]
                            )
                        )
                    )
                except grpc.aio.AioRpcError as error:
                    raise _rpc_failure(error) from None
                answer = response.container_responses[0] if response.container_responses else None
                given.append(
                    ContainerRecord(
                        pod_uid=uid,
                        namespace=meta["namespace"],
                        pod=meta["name"],
                        container=container.get("name", ""),
                        resource=resource,
                        device_ids=tuple(ids),
                        envs=dict(answer.envs) if answer else {},
                        mounts=tuple(
                            (m.container_path, m.host_path, m.read_only) for m in answer.mounts
                        )
                        if answer
                        else (),
                        annotations=dict(answer.annotations) if answer else {},
                        allocated_at=self.clock(),
                    )
                )

    async def _devices_to_allocate(self, plugin: _Plugin, needed: int) -> list[str]:
        healthy = {i for i, ok in plugin.devices.items() if ok} if plugin.connected else set[str]()
        available = sorted(healthy - self._in_use(plugin.resource))
        if needed > len(available):
            raise AdmissionError(
                "UnexpectedAdmissionError",
                f"Allocate failed due to requested number of devices unavailable for "
                f"{plugin.resource}. Requested: {needed}, Available: {len(available)}, which is "
                "unexpected",
            )
        if plugin.preferred:
            try:
                answer = await grpccalls.answer(
                    plugin.stub.GetPreferredAllocation(
                        api_pb2.PreferredAllocationRequest(
                            container_requests=[
                                api_pb2.ContainerPreferredAllocationRequest(
                                    available_deviceIDs=available, allocation_size=needed
                                )
                            ]
                        )
                    )
                )
            except grpc.aio.AioRpcError as error:
                raise _rpc_failure(error) from None
            if answer.container_responses:
                preferred = list(answer.container_responses[0].deviceIDs)
                free = set(available)
                if (
                    len(preferred) == needed
                    and len(set(preferred)) == needed
                    and all(i in free for i in preferred)
                ):
                    return preferred
        return available[:needed]


def _code_name(error: grpc.aio.AioRpcError) -> str:
    code = error.code()
    name = code.name if code is not None else "Unknown"
    return "".join(part.capitalize() for part in name.split("_"))


def _rpc_failure(error: grpc.aio.AioRpcError) -> AdmissionError:
    """How the kubelet rejects a pod whose Allocate (or preferred allocation) call failed."""
    return AdmissionError(
        "UnexpectedAdmissionError",
        f"Allocate failed due to rpc error: code = {_code_name(error)} desc = "
        f"{error.details()}, which is unexpected",
    )
