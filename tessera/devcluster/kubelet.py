"""A simulated kubelet: one node's Node object, its device-plugin registry and device manager.

What a real kubelet does with device plugins and pods, minus the containers (in the spirit of
kwok, but with the device-plugin path real, over unix-socket gRPC):

- **Node.** :meth:`SimulatedKubelet.start` creates the Node (CPU, memory, pods, labels, Ready
  condition, addresses, node info) through the API test double.
- **Registration.** It serves the kubelet's ``Registration`` service on ``kubelet.sock`` in its
  own plugin directory. A plugin that registers (API ``v1beta1``) is dialled back on its endpoint
  in the same directory; its ``ListAndWatch`` stream is followed and each list is reflected into
  the Node's ``status.capacity`` (every device) and ``status.allocatable`` (the healthy ones), as
  the kubelet's device manager does. When the stream breaks (the plugin died), every device of
  the resource counts as unhealthy (allocatable 0, capacity kept) until a plugin registers again;
  a new registration for the same resource replaces the old endpoint.
- **Admission and Allocate.** Pods bound to the node are admitted one at a time, oldest first,
  as the kubelet's pod workers do: for each container (init containers first) and each of its
  limits that a registered plugin serves, the device manager checks that enough healthy devices
  are free, asks ``GetPreferredAllocation`` when the plugin offers it (keeping the answer only
  when it is a valid choice), otherwise takes free healthy devices in order, and calls
  ``Allocate`` for that container. The environment, mounts and annotations of each answer are
  recorded (:class:`ContainerRecord`). Then the resource fit (CPU, memory, pods, extended
  resources the node advertises) is checked, and the pod is set Running through ``pods/status``
  with container statuses. An Allocate error rejects the pod as the kubelet does: phase
  ``Failed``, reason ``UnexpectedAdmissionError``; a resource that does not fit: ``OutOf<name>``.
  Extended resources the node does not advertise are ignored, as the kubelet's admission does.
- **Deletion.** A pod marked for deletion has its containers stopped, its devices freed, and its
  deletion finished (delete with grace 0 and a uid precondition), as the kubelet's status manager
  does; a pod deleted outright frees its devices as well.

The kubelet never trusts the plugin's answers: it records them, and :meth:`usage` and
:attr:`overcommits` let callers check them against the GPUs' real capacities (passed in, from the
fake GPU description) at every allocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from services.deviceplugin._proto import api_pb2, api_pb2_grpc
from shared.quantity import QuantityError, parse_quantity
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.resources import NODE, POD, ApiError, Obj, timestamp

log = logging.getLogger(__name__)

API_VERSION: Final = "v1beta1"
KUBELET_SOCKET: Final = "kubelet.sock"
KUBELET_CHECKPOINT: Final = "kubelet_internal_checkpoint"
"""The device manager's own file in the plugin directory, the one it keeps when it starts."""
KUBELET_VERSION: Final = "v1.31.0-tessera-sim"
ENV_VISIBLE: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_MEMORY: Final = "TESSERA_GPU_MEMORY_LIMIT_MIB"
ENV_CORES: Final = "TESSERA_GPU_CORES"
LOGGED_ENV: Final = ("NVIDIA_", "TESSERA_", "CUDA_", "LD_PRELOAD", "VOLCANO_", "ALIYUN_")
"""What a simulated container's log shows of its environment (``kubectl logs``)."""
REGISTRATION_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True)
class GpuCapacity:
    """One physical GPU of the node as the hardware really is (not as any service reports it)."""

    uuid: str
    index: int
    model: str
    memory_mib: int


@dataclass(frozen=True)
class NodeSpec:
    """What a simulated node is: its name, CPU, memory, labels and GPUs."""

    name: str
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 250
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[GpuCapacity, ...] = ()


@dataclass(frozen=True)
class ContainerRecord:
    """What one container was given by the device plugin (one Allocate answer per resource)."""

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


@dataclass
class PodRecord:
    """A pod as this kubelet handled it: its timeline and what its containers were given."""

    uid: str
    namespace: str
    name: str
    seen_at: float
    containers: list[ContainerRecord] = field(default_factory=list)
    allocated_at: float | None = None
    running_at: float | None = None
    failed_reason: str = ""
    failed_message: str = ""
    terminated_at: float | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Overcommit:
    """A moment when the containers running on a GPU held more than the GPU has."""

    node: str
    gpu: str
    memory_mib: int
    memory_total_mib: int
    cores: int
    at: float
    pods: tuple[str, ...]


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


def _split(value: str) -> list[str]:
    return [part for part in value.split(",") if part] if value else []


class _Registration(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: SimulatedKubelet) -> None:
        self._kubelet = kubelet

    async def Register(  # noqa: N802 (the generated servicer's method name)
        self, request: Any, context: Any
    ) -> Any:
        problem = self._kubelet.registration_problem(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await self._kubelet.register(request)
        return api_pb2.Empty()


class SimulatedKubelet:
    """One node's kubelet (see the module docstring). Fed pod events by its cluster."""

    def __init__(
        self,
        *,
        api: ApiServer,
        spec: NodeSpec,
        plugin_dir: Path,
        clock: Callable[[], float] = time.time,
        pod_ip_prefix: str = "10.244",
        node_index: int = 0,
    ) -> None:
        self.api = api
        self.spec = spec
        self.name = spec.name
        self.plugin_dir = plugin_dir
        self.clock = clock
        self._node_index = node_index
        self._pod_ip_prefix = pod_ip_prefix
        self._server: Any = None
        self._plugins: dict[str, _Plugin] = {}
        self._allocated: dict[str, dict[str, set[str]]] = {}
        """Pod uid -> resource -> device IDs in use by the pod's containers."""
        self.pods: dict[str, PodRecord] = {}
        """Every pod this kubelet handled (kept after it is gone, for reports)."""
        self._live: set[str] = set()
        """Uids of admitted pods whose containers are running (not yet terminated)."""
        self._queue: asyncio.Queue[tuple[str, Obj | None]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._gpus = {gpu.uuid: gpu for gpu in spec.gpus}
        self.overcommits: list[Overcommit] = []
        self.registrations = 0
        self._registered = asyncio.Event()
        self._pod_count = 0

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    async def start(self) -> None:
        """Create (or refresh) the Node, serve ``kubelet.sock``, start admitting pods."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._create_node()
        await self._serve()
        self._worker = asyncio.create_task(self._work(), name=f"kubelet-{self.name}")

    async def _serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
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
        for plugin in list(self._plugins.values()):
            await self._drop_plugin(plugin)
        self._plugins.clear()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)
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

    # --- the Node -------------------------------------------------------------------------------

    def _create_node(self) -> None:
        spec = self.spec
        labels = {
            "kubernetes.io/hostname": spec.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "tessera-sim",
            **spec.labels,
        }
        if spec.gpus:
            models = sorted({gpu.model for gpu in spec.gpus})
            labels.update(
                {
                    "nvidia.com/gpu.present": "true",
                    "nvidia.com/gpu.product": models[0],
                    "nvidia.com/gpu.count": str(len(spec.gpus)),
                    "nvidia.com/gpu.memory": str(max(g.memory_mib for g in spec.gpus)),
                }
            )
        resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.pods)}
        resources["ephemeral-storage"] = "100Gi"
        now = self.clock()
        node: Obj = {
            "metadata": {"name": spec.name, "labels": labels},
            "spec": {"podCIDR": self._pod_cidr()},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "conditions": [
                    _condition("MemoryPressure", "False", "KubeletHasSufficientMemory", now),
                    _condition("DiskPressure", "False", "KubeletHasNoDiskPressure", now),
                    _condition("PIDPressure", "False", "KubeletHasSufficientPID", now),
                    _condition("Ready", "True", "KubeletReady", now),
                ],
                "addresses": [
                    {"type": "InternalIP", "address": self._host_ip()},
                    {"type": "Hostname", "address": spec.name},
                ],
                "nodeInfo": {
                    "kubeletVersion": KUBELET_VERSION,
                    "kubeProxyVersion": KUBELET_VERSION,
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "sim://1.0",
                    "osImage": "Tessera simulated node",
                    "kernelVersion": "simulated",
                    "machineID": spec.name,
                    "systemUUID": spec.name,
                    "bootID": spec.name,
                },
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        }
        existing = self.api.find(NODE, "", spec.name)
        if existing is None:
            self.api.create(NODE, node)
        else:
            self.api.patch(
                NODE,
                "",
                spec.name,
                {"status": node["status"]},
                "application/merge-patch+json",
                "status",
            )

    def _host_ip(self) -> str:
        return f"172.18.{self._node_index // 250}.{self._node_index % 250 + 2}"

    def _pod_cidr(self) -> str:
        return f"{self._pod_ip_prefix}.{self._node_index % 256}.0/24"

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
            async for response in plugin.stub.ListAndWatch(api_pb2.Empty()):
                plugin.devices = {d.ID: d.health == "Healthy" for d in response.devices}
                plugin.connected = True
                self._reflect_devices()
                self._registered.set()
        except grpc.aio.AioRpcError as error:
            log.warning(
                "device plugin stream ended",
                extra={"node": self.name, "resource": plugin.resource, "error": str(error.code())},
            )
        if self._plugins.get(plugin.resource) is plugin:
            plugin.connected = False
            self._reflect_devices()

    # --- pods -----------------------------------------------------------------------------------

    def pod_event(self, kind: str, pod: Obj) -> None:
        """A change of a pod bound to this node (from the cluster's pod watch)."""
        self._queue.put_nowait((kind, pod))

    async def _work(self) -> None:
        while True:
            kind, pod = await self._queue.get()
            if pod is None:
                continue
            try:
                await self._handle(kind, pod)
            except Exception:  # a bug here must not stop the node
                log.exception("kubelet failed to handle a pod", extra={"node": self.name})

    async def _handle(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        if kind == "DELETED":
            self._terminated(uid)
            return
        record = self.pods.get(uid)
        if meta.get("deletionTimestamp"):
            if record is None:
                self.pods[uid] = record = PodRecord(
                    uid, meta["namespace"], meta["name"], self.clock()
                )
            self._terminated(uid)
            with contextlib.suppress(ApiError):
                self.api.delete(POD, meta["namespace"], meta["name"], grace_period_s=0, uid=uid)
            return
        if record is not None:
            return  # admitted (or rejected) already
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return
        # Events queue up; act on the pod as it is now (the binder may have changed it).
        current = self.api.find(POD, meta["namespace"], meta["name"])
        if current is None or current["metadata"]["uid"] != uid:
            return
        record = PodRecord(uid, meta["namespace"], meta["name"], self.clock())
        self.pods[uid] = record
        try:
            # The kubelet's order: the device manager's admit handler, then the resource fit.
            await self._allocate(current, record)
            self._fit(current)
        except AdmissionError as rejected:
            record.failed_reason, record.failed_message = rejected.reason, rejected.message
            self._free(uid)
            self._set_failed(current, rejected)
            log.info(
                "pod rejected",
                extra={"node": self.name, "pod": record.key, "reason": rejected.reason},
            )
            return
        record.allocated_at = self.clock()
        self._live.add(uid)
        self._observe_usage()
        self._set_running(current, record)
        record.running_at = self.clock()

    def _terminated(self, uid: str) -> None:
        record = self.pods.get(uid)
        if record is not None and record.terminated_at is None:
            record.terminated_at = self.clock()
        self._live.discard(uid)
        self._free(uid)

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

    async def _allocate(self, pod: Obj, record: PodRecord) -> None:
        """The device manager's Allocate for every container, in pod order."""
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
                    response = await plugin.stub.Allocate(
                        api_pb2.AllocateRequest(
                            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
                        )
                    )
                except grpc.aio.AioRpcError as error:
                    raise AdmissionError(
                        "UnexpectedAdmissionError",
                        f"Allocate failed due to rpc error: code = {_code_name(error)} desc = "
                        f"{error.details()}, which is unexpected",
                    ) from None
                answer = response.container_responses[0] if response.container_responses else None
                record.containers.append(
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
                answer = await plugin.stub.GetPreferredAllocation(
                    api_pb2.PreferredAllocationRequest(
                        container_requests=[
                            api_pb2.ContainerPreferredAllocationRequest(
                                available_deviceIDs=available, allocation_size=needed
                            )
                        ]
                    )
                )
            except grpc.aio.AioRpcError as error:
                raise AdmissionError(
                    "UnexpectedAdmissionError",
                    f"Allocate failed due to rpc error: code = {_code_name(error)} desc = "
                    f"{error.details()}, which is unexpected",
                ) from None
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

    def _fit(self, pod: Obj) -> None:
        """The kubelet's resource fit (GeneralPredicates) over the pods admitted here."""
        node = self.api.find(NODE, "", self.name)
        allocatable = ((node or {}).get("status") or {}).get("allocatable") or {}
        wanted = _requests(pod)
        used: dict[str, Any] = {}
        admitted = 0
        for uid in self._live:
            record = self.pods[uid]
            other = self.api.find(POD, record.namespace, record.name)
            if other is None:
                continue
            admitted += 1
            for name, amount in _requests(other).items():
                used[name] = used.get(name, 0) + amount
        if admitted + 1 > _count(allocatable.get("pods", "110")):
            raise AdmissionError("OutOfpods", "Node didn't have enough resource: pods")
        for name, amount in wanted.items():
            if amount <= 0:
                continue
            extended = "/" in name and not name.startswith("kubernetes.io/")
            if name not in allocatable:
                if extended:
                    continue  # the kubelet ignores extended resources the node does not have
                if name not in ("cpu", "memory"):
                    continue
            capacity = parse_quantity(allocatable.get(name, "0"))
            if used.get(name, 0) + amount > capacity:
                raise AdmissionError(
                    f"OutOf{name}",
                    f"Node didn't have enough resource: {name}, requested: {_show(amount)}, "
                    f"used: {_show(used.get(name, 0))}, capacity: {_show(capacity)}",
                )

    # --- status ---------------------------------------------------------------------------------

    def _patch_status(self, pod: Obj, status: Obj) -> None:
        """Merge ``status`` into the pod's status subresource (the uid guards against a pod
        recreated under the same name); a pod deleted meanwhile is left alone."""
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):
            self.api.patch(
                POD,
                meta["namespace"],
                meta["name"],
                {"metadata": {"uid": meta["uid"]}, "status": status},
                "application/merge-patch+json",
                "status",
            )

    def _set_failed(self, pod: Obj, rejected: AdmissionError) -> None:
        status = {
            "phase": "Failed",
            "reason": rejected.reason,
            "message": f"Pod was rejected: {rejected.message}",
        }
        self._patch_status(pod, status)

    def _set_running(self, pod: Obj, record: PodRecord) -> None:
        meta = pod["metadata"]
        now = self.clock()
        self._pod_count += 1
        started = timestamp(now)
        containers = (pod.get("spec") or {}).get("containers") or []
        statuses = [
            {
                "name": c.get("name", ""),
                "image": c.get("image", ""),
                "imageID": f"sim://{c.get('image', '')}",
                "containerID": f"sim://{meta['uid'][:8]}-{i}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}},
            }
            for i, c in enumerate(containers)
        ]
        conditions = [
            {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
        ]
        scheduled = [
            c
            for c in (pod.get("status") or {}).get("conditions") or []
            if c.get("type") == "PodScheduled"
        ]
        pod_ip = f"{self._pod_ip_prefix}.{self._node_index % 256}.{self._pod_count % 250 + 2}"
        status = {
            "phase": "Running",
            "conditions": conditions + scheduled,
            "hostIP": self._host_ip(),
            "hostIPs": [{"ip": self._host_ip()}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": timestamp(record.seen_at),
            "containerStatuses": statuses,
        }
        self._patch_status(pod, status)

    # --- logs ---------------------------------------------------------------------------------

    def logs(self, pod: Obj, container: str) -> str:
        """What ``kubectl logs`` shows of ``container``: the simulated container runs
        ``env | grep -E 'NVIDIA_VISIBLE_DEVICES|TESSERA_|CUDA_|LD_PRELOAD'``, so its log is the
        GPU environment the device plugin gave it (and the mounts). ApiError 400 while the pod
        is not running here, as the kubelet answers for a container that has not started."""
        meta = pod["metadata"]
        record = self.pods.get(meta["uid"])
        if record is None or record.running_at is None:
            reason = record.failed_reason if record is not None else ""
            state = f"failed: {reason}" if reason else "waiting to start"
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{meta["name"]}" is {state}',
            )
        envs = pod_containers_env(record.containers).get(container, {})
        mounts = [m for r in record.containers if r.container == container for m in r.mounts]
        lines = [f"{key}={envs[key]}" for key in sorted(envs) if key.startswith(LOGGED_ENV)]
        lines += [f"mount {host} -> {path}{' (ro)' if ro else ''}" for path, host, ro in mounts]
        if not lines:
            lines = ["no GPU environment: this container was given no Tessera device"]
        return "".join(f"{line}\n" for line in lines)

    # --- what the containers hold ---------------------------------------------------------------

    def running_records(self) -> list[PodRecord]:
        return [self.pods[uid] for uid in self._live]

    def usage(self) -> dict[str, tuple[int, int, list[str]]]:
        """GPU uuid -> (MiB, percent of SMs, pods) held by running containers, as their recorded
        environments say."""
        used: dict[str, tuple[int, int, list[str]]] = {}
        for record in self.running_records():
            for container in record.containers:
                uuids = _split(container.envs.get(ENV_VISIBLE, ""))
                memory = _split(container.envs.get(ENV_MEMORY, ""))
                cores = _split(container.envs.get(ENV_CORES, ""))
                for position, uuid in enumerate(uuids):
                    mib = int(memory[position]) if position < len(memory) else 0
                    pct = int(cores[position]) if position < len(cores) else 0
                    held_mib, held_pct, pods = used.get(uuid, (0, 0, []))
                    used[uuid] = (held_mib + mib, held_pct + pct, [*pods, record.key])
        return used

    def _observe_usage(self) -> None:
        now = self.clock()
        for uuid, (mib, pct, pods) in self.usage().items():
            gpu = self._gpus.get(uuid)
            total = gpu.memory_mib if gpu is not None else 0
            if gpu is None or mib > total or pct > 100:
                self.overcommits.append(
                    Overcommit(
                        node=self.name,
                        gpu=uuid,
                        memory_mib=mib,
                        memory_total_mib=total,
                        cores=pct,
                        at=now,
                        pods=tuple(pods),
                    )
                )


def _code_name(error: grpc.aio.AioRpcError) -> str:
    code = error.code()
    name = code.name if code is not None else "Unknown"
    return "".join(part.capitalize() for part in name.split("_"))


def _requests(pod: Obj) -> dict[str, Any]:
    """What the pod asks of the node: the larger of its app containers' sum and its largest
    init container, per resource (kube-scheduler's and the kubelet's rule)."""
    spec = pod.get("spec") or {}
    total: dict[str, Any] = {}
    for container in spec.get("containers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = total.get(name, 0) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = max(total.get(name, 0), amount)
    return total


def _container_requests(container: Obj) -> dict[str, Any]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    amounts = {}
    for name, value in merged.items():
        try:
            amounts[name] = parse_quantity(value)
        except (QuantityError, TypeError, ValueError):
            continue
    return amounts


def _show(amount: Any) -> str:
    return str(int(amount)) if amount == int(amount) else str(float(amount))


def _condition(kind: str, status: str, reason: str, now: float) -> Obj:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": f"kubelet: {reason}",
        "lastHeartbeatTime": timestamp(now),
        "lastTransitionTime": timestamp(now),
    }


def pod_containers_env(records: Sequence[ContainerRecord]) -> dict[str, dict[str, str]]:
    """Container name -> its environment merged over every resource answer."""
    merged: dict[str, dict[str, str]] = {}
    for record in records:
        merged.setdefault(record.container, {}).update(record.envs)
    return merged
