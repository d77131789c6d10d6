"""A simulated kubelet: one node's Node object, its device-plugin registry and device manager,
and its DRA manager.

What a real kubelet does with device plugins, DRA drivers and pods, minus the containers (in the
spirit of kwok, but with the device-plugin and DRA paths real, over unix-socket gRPC):

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
- **DRA.** Before an admitted pod's containers start, its ResourceClaims are prepared by their
  drivers' plugins and each container's CDI devices resolved (``dramanager.py``, ``cdi.py``);
  what the containers get is recorded like Allocate answers. When that fails the pod stays
  ``Pending`` (a ``FailedPrepareDynamicResources`` event, containers waiting) and is tried again
  after ``retry_s``, as the pod workers back off.
- **Deletion.** A pod marked for deletion has its containers stopped, its devices freed, its DRA
  claims unprepared, and its deletion finished (delete with grace 0 and a uid precondition), as
  the kubelet's status manager does; a pod deleted outright frees its devices and claims as well.

The kubelet never trusts the plugin's answers: it records them, and :meth:`usage` and
:attr:`overcommits` let callers check them against the GPUs' real capacities (passed in, from the
fake GPU description) at every allocation.

The device-plugin registry and Allocate calls are the :class:`DeviceManager` it extends
(``devicemanager.py``), the DRA plugins and claims its :class:`DraManager` (``dramanager.py``);
this module adds the Node, the pod lifecycle, the resource fit, the pod status, the containers'
logs and what they hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shared.quantity import QuantityError, parse_quantity
from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.cdi import UnresolvableDevicesError
from tessera.devcluster.devicemanager import (
    AdmissionError,
    ContainerRecord,
    DeviceManager,
    _count,
    log,
)
from tessera.devcluster.dramanager import DraError, DraManager
from tessera.devcluster.recorder import record_event
from tessera.devcluster.resources import NODE, POD, ApiError, Obj, timestamp

KUBELET_VERSION: Final = "v1.37.0-tessera-sim"
ENV_VISIBLE: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_MEMORY: Final = "TESSERA_GPU_MEMORY_LIMIT_MIB"
ENV_CORES: Final = "TESSERA_GPU_CORES"
LOGGED_ENV: Final = ("NVIDIA_", "TESSERA_", "CUDA_", "LD_PRELOAD", "VOLCANO_", "ALIYUN_")
"""What a simulated container's log shows of its environment (``kubectl logs``)."""
REGISTRY_DIR: Final = "plugins_registry"
"""Under the plugin directory: where DRA plugins put their registration sockets."""
CDI_DIR: Final = "cdi"
"""Under the plugin directory: the node's CDI spec directory."""
RESYNC: Final = "RESYNC"
"""A pod event the kubelet queues itself: look at the pod again (a retry)."""


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
    waiting_reason: str = ""
    """Why its containers have not started yet (e.g. ``FailedPrepareDynamicResources``)."""
    waiting_message: str = ""
    terminated_at: float | None = None
    unprepared: tuple[str, ...] = ()
    """The DRA claims unprepared for it when it ended."""

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


def _split(value: str) -> list[str]:
    return [part for part in value.split(",") if part] if value else []


class SimulatedKubelet(DeviceManager):
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
        retry_s: float = 1.0,
        dra_poll_s: float = 0.2,
    ) -> None:
        super().__init__(api=api, name=spec.name, plugin_dir=plugin_dir, clock=clock)
        self.retry_s = retry_s
        """How soon a pod whose containers could not start (or whose claims could not be
        unprepared) is tried again (the pod workers' back-off)."""
        self.dra = DraManager(
            api=api,
            node=spec.name,
            registry_dir=plugin_dir / REGISTRY_DIR,
            cdi_dirs=(plugin_dir / CDI_DIR,),
            poll_s=dra_poll_s,
        )
        self.spec = spec
        self._node_index = node_index
        self._pod_ip_prefix = pod_ip_prefix
        self.pods: dict[str, PodRecord] = {}
        """Every pod this kubelet handled (kept after it is gone, for reports)."""
        self._live: set[str] = set()
        """Uids of admitted pods whose containers are running (not yet terminated)."""
        self._asked: dict[str, dict[str, Any]] = {}
        """What each live pod asks of the node (parsed once: a pod's resources never change)."""
        self._queue: asyncio.Queue[tuple[str, Obj | None]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._gpus = {gpu.uuid: gpu for gpu in spec.gpus}
        self.overcommits: list[Overcommit] = []
        self._pod_count = 0

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create (or refresh) the Node, serve ``kubelet.sock``, start admitting pods."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        (self.plugin_dir / CDI_DIR).mkdir(exist_ok=True)
        self._create_node()
        await self._serve()
        await self.dra.start()
        self._worker = asyncio.create_task(self._work(), name=f"kubelet-{self.name}")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        await self.dra.stop()
        await self._stop_serving()

    @property
    def registry_dir(self) -> Path:
        """Where DRA plugins put their registration sockets (``plugins_registry``)."""
        return self.dra.registry_dir

    @property
    def cdi_dir(self) -> Path:
        """The node's CDI spec directory (``/etc/cdi``, ``/var/run/cdi`` on a real node)."""
        return self.plugin_dir / CDI_DIR

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
        if kind == RESYNC:
            current = self.api.find(POD, meta["namespace"], meta["name"])
            if current is None or current["metadata"]["uid"] != uid:
                await self._terminated(pod)  # gone meanwhile: what is left to undo
                return
            pod, kind = current, "MODIFIED"
        if kind == "DELETED":
            await self._terminated(pod)
            return
        record = self.pods.get(uid)
        if meta.get("deletionTimestamp"):
            if record is None:
                self.pods[uid] = record = PodRecord(
                    uid, meta["namespace"], meta["name"], self.clock()
                )
            if not await self._terminated(pod):
                return  # its claims are not unprepared yet: the pod stays until they are
            with contextlib.suppress(ApiError):
                self.api.delete(POD, meta["namespace"], meta["name"], grace_period_s=0, uid=uid)
            return
        if record is not None:
            if record.waiting_reason and record.terminated_at is None:
                await self._start(pod, record)
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
            await self._allocate(current, record.containers)
            asked = self._fit(current)
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
        self._asked[uid] = asked
        await self._start(current, record)

    async def _start(self, pod: Obj, record: PodRecord) -> None:
        """Start an admitted pod's containers: its DRA claims prepared first (``SyncPod``) and
        their CDI devices resolved; when that fails the pod stays Pending and is tried again."""
        if (pod.get("spec") or {}).get("resourceClaims"):
            try:
                await self.dra.prepare(pod)
                claimed = self.dra.container_records(pod, self.clock())
            except DraError as error:
                self._wait(
                    pod,
                    record,
                    "FailedPrepareDynamicResources",
                    f"Failed to prepare dynamic resources: {error}",
                    "ContainerCreating",
                )
                return
            except UnresolvableDevicesError as error:
                self._wait(
                    pod,
                    record,
                    "Failed",
                    f"Error: CDI device injection failed: {error}",
                    "CreateContainerError",
                )
                return
            record.containers.extend(claimed)
        record.waiting_reason = record.waiting_message = ""
        self._observe_usage()
        self._set_running(pod, record)
        record.running_at = self.clock()

    def _wait(self, pod: Obj, record: PodRecord, reason: str, note: str, state: str) -> None:
        """The pod stays Pending with its containers waiting in ``state``; a Warning event says
        why, and the pod is looked at again after ``retry_s``."""
        if (record.waiting_reason, record.waiting_message) != (reason, note):
            # Once per distinct reason: a recorder counts repeats instead of writing them again.
            log.info(
                "pod waits",
                extra={"node": self.name, "pod": record.key, "reason": reason, "note": note},
            )
            record_event(
                self.api,
                pod,
                kind="Pod",
                reason=reason,
                note=note,
                controller="kubelet",
                instance=self.name,
                action="StartContainer",
            )
        record.waiting_reason, record.waiting_message = reason, note
        containers = (pod.get("spec") or {}).get("containers") or []
        waiting = {"reason": state}
        if state != "ContainerCreating":
            waiting["message"] = note
        self._patch_status(
            pod,
            {
                "phase": "Pending",
                "hostIP": self._host_ip(),
                "startTime": timestamp(record.seen_at),
                "containerStatuses": [
                    {
                        "name": c.get("name", ""),
                        "image": c.get("image", ""),
                        "imageID": "",
                        "ready": False,
                        "started": False,
                        "restartCount": 0,
                        "state": {"waiting": waiting},
                    }
                    for c in containers
                ],
            },
        )
        self._retry(pod)

    def _retry(self, pod: Obj) -> None:
        asyncio.get_running_loop().call_later(self.retry_s, self._queue.put_nowait, (RESYNC, pod))

    async def _terminated(self, pod: Obj) -> bool:
        """The pod's containers are gone: free its devices and unprepare its DRA claims; False
        when a claim could not be unprepared yet (tried again after ``retry_s``)."""
        uid = pod["metadata"]["uid"]
        record = self.pods.get(uid)
        if record is not None and record.terminated_at is None:
            record.terminated_at = self.clock()
        self._live.discard(uid)
        self._asked.pop(uid, None)
        self._free(uid)
        if not self.dra.pod_claims(uid):
            return True
        try:
            unprepared = await self.dra.unprepare(uid)
        except DraError as error:
            log.warning(
                "unprepare failed", extra={"node": self.name, "uid": uid, "error": str(error)}
            )
            self._retry(pod)
            return False
        if record is not None:
            record.unprepared += tuple(unprepared)
        return True

    def _fit(self, pod: Obj) -> dict[str, Any]:
        """The kubelet's resource fit (GeneralPredicates) over the pods admitted here; what
        ``pod`` asks of the node when it fits."""
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
            for name, amount in self._asked[uid].items():
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
        return wanted

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
        lines += [
            f"device {path}"
            for r in record.containers
            if r.container == container
            for path in r.device_nodes
        ]
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
        claims: set[tuple[str, str]] = set()
        for record in self.running_records():
            for container in record.containers:
                # A DRA claim shared by several containers or pods is one allocation.
                if container.resource.startswith("resourceclaims/"):
                    claim = (container.namespace, container.resource)
                    if claim in claims:
                        continue
                    claims.add(claim)
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
