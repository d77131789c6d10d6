"""A simulated kubelet's DRA manager: the kubelet's plugin watcher for DRA drivers and its
``pkg/kubelet/cm/dra`` manager, over real gRPC on unix sockets.

- **Registration** (``pkg/kubelet/pluginmanager``, ``pkg/kubelet/cm/dra/plugin``). It watches
  its ``plugins_registry`` directory (names starting with ``.`` ignored). For each socket that
  appears it calls ``pluginregistration.Registration/GetInfo``; a ``DRAPlugin`` whose
  ``supported_versions`` name a DRA service it speaks (``v1.DRAPlugin``) is registered under its
  driver name with its endpoint (dialled as ``unix:<endpoint>``) and told so with
  ``NotifyRegistrationStatus``; anything else is told why not, in the kubelet's words. A socket
  that goes away deregisters its plugin; one that is replaced (the plugin restarted) registers
  again. Several plugins of one driver may be registered (a rolling update): the newest is used.
- **Prepare** (``prepareResources``). Before a pod's containers start, for each of its
  ``spec.resourceClaims`` the claim's name is resolved (from ``status.resourceClaimStatuses`` for
  a template), the claim fetched, checked to be owned by the pod (for a template) and reserved
  for it; each driver of its allocation must be registered. The claims not prepared yet are sent
  to each driver in one ``NodePrepareResources`` call (several claims batched). An RPC error
  (also a call cut off by its plugin deregistering: ``grpccalls``), an error for a claim, or a
  claim missing from the answer fails the pod's start; whatever is not prepared is sent again on
  the next try. Each claim is prepared once for all pods that use it.
- **CDI**: each container gets the CDI device names of the claims (and requests) it lists in
  ``resources.claims``, which ``cdi.py`` resolves against the node's CDI spec directories.
- **Unprepare** (``unprepareResources``): when a pod ends, claims no other pod on the node uses
  are sent to ``NodeUnprepareResources``; a failure keeps them to try again.

Errors are :class:`DraError` with the kubelet's messages (``pod p (uid) is not allowed to use
ResourceClaim c (uid)``, ``DRA driver x is not registered``, ``NodePrepareResources skipped 1
ResourceClaims``...), for the pod's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from services.deviceplugin._proto.dra.v1 import api_pb2 as dra_pb2
from services.deviceplugin._proto.dra.v1 import api_pb2_grpc as dra_grpc
from services.deviceplugin._proto.pluginregistration.v1 import api_pb2 as registration_pb2
from services.deviceplugin._proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from tessera.devcluster import cdi, dra, grpccalls
from tessera.devcluster.devicemanager import ContainerRecord
from tessera.devcluster.objects import ApiObjects
from tessera.devcluster.resources import RESOURCE_CLAIM, Obj

log = logging.getLogger("tessera.devcluster.kubelet")

PLUGIN_TYPE: Final = "DRAPlugin"
SERVICES: Final = ("v1.DRAPlugin",)
"""The DRA services this kubelet speaks, newest first (a real 1.37 kubelet also speaks
``v1beta1.DRAPlugin``, whose protos are not compiled here)."""
CLIENT_TIMEOUT_S: Final = 45.0
REGISTRATION_TIMEOUT_S: Final = 10.0


class DraError(Exception):
    """Why a pod's claims cannot be prepared (or unprepared), in the kubelet's words."""


@dataclass
class Plugin:
    """A registered DRA plugin: its driver, endpoint and gRPC connection."""

    driver: str
    endpoint: str
    service: str
    registration_socket: Path
    channel: Any
    stub: Any


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as its driver answered."""

    driver: str
    pool: str
    device: str
    request_names: tuple[str, ...]
    cdi_device_ids: tuple[str, ...]
    share_id: str | None


@dataclass
class ClaimInfo:
    """A claim this node prepared (or is preparing): the kubelet's claim info cache entry."""

    uid: str
    namespace: str
    name: str
    drivers: tuple[str, ...]
    pods: set[str] = field(default_factory=set)
    devices: dict[str, list[PreparedDevice]] = field(default_factory=dict)
    """Driver -> its devices, once prepared."""
    prepared: bool = False

    def cdi_devices(self, request: str) -> list[str]:
        """``cdiDevicesAsList``: the CDI names of the devices for ``request`` ("" = all)."""
        names: list[str] = []
        for devices in self.devices.values():
            for device in devices:
                served = {name.split("/")[0] for name in device.request_names}
                if not request or not device.request_names or request in served:
                    names.extend(device.cdi_device_ids)
        return names


def _socket_identity(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    if not stat.S_ISSOCK(info.st_mode):
        return None
    return info.st_ino, info.st_mtime_ns


class DraManager:
    """The DRA half of a :class:`~tessera.devcluster.kubelet.SimulatedKubelet`."""

    def __init__(
        self,
        *,
        api: ApiObjects,
        node: str,
        registry_dir: Path,
        cdi_dirs: Iterable[Path],
        poll_s: float = 0.2,
        call_timeout_s: float = CLIENT_TIMEOUT_S,
    ) -> None:
        self.api = api
        self.node = node
        self.registry_dir = registry_dir
        self.cdi_dirs = tuple(cdi_dirs)
        self.cdi_cache = cdi.SpecCache()
        self.poll_s = poll_s
        self.call_timeout_s = call_timeout_s
        self.plugins: dict[str, list[Plugin]] = {}
        """Driver -> its registered plugins, oldest first."""
        self.claims: dict[tuple[str, str], ClaimInfo] = {}
        """(namespace, name) -> the claim info cache."""
        self.registrations = 0
        self.refusals: list[str] = []
        """Why plugins were refused registration (as told to them)."""
        self._sockets: dict[Path, tuple[int, int]] = {}
        self._listed_at: int | None = None
        """The registry directory's mtime at the last listing: unchanged, nothing to list."""
        self._unanswered: set[Path] = set()
        """Sockets whose GetInfo failed (warned about once)."""
        self._watcher: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        await self.scan()
        self._watcher = asyncio.create_task(self._watch(), name=f"dra-{self.node}")

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        for plugins in self.plugins.values():
            for plugin in plugins:
                with contextlib.suppress(Exception):
                    await plugin.channel.close()
        self.plugins.clear()
        self._sockets.clear()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.scan()
            except Exception:  # a bug here must not stop the node's plugin watcher
                log.exception("DRA plugin watcher failed", extra={"node": self.node})

    async def scan(self) -> None:
        """One pass of the plugin watcher over the registry directory (a socket added, removed
        or replaced changes the directory's mtime; nothing else needs a listing)."""
        try:
            modified = self.registry_dir.stat().st_mtime_ns
        except FileNotFoundError:
            modified = None
        if modified is not None and modified == self._listed_at:
            return
        self._listed_at = modified
        present: dict[Path, tuple[int, int]] = {}
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.registry_dir):
                if name.startswith("."):
                    continue
                path = self.registry_dir / name
                identity = _socket_identity(path)
                if identity is not None:
                    present[path] = identity
        for path in list(self._sockets):
            if present.get(path) != self._sockets[path]:
                await self._deregister(path)
        for path, identity in present.items():
            if self._sockets.get(path) != identity:
                self._sockets[path] = identity
                await self._register(path)

    async def wait_registered(self, driver: str, timeout: float = 30.0) -> None:
        """Wait until a plugin of ``driver`` is registered."""
        async with asyncio.timeout(timeout):
            while not self.plugins.get(driver):
                self._changed.clear()
                await self._changed.wait()

    # --- registration ---------------------------------------------------------------------------

    async def _register(self, path: Path) -> None:
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            stub = registration_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(
                    registration_pb2.InfoRequest(), timeout=REGISTRATION_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as error:
                log.log(
                    logging.DEBUG if path in self._unanswered else logging.WARNING,
                    "plugin registration: GetInfo failed",
                    extra={"node": self.node, "socket": str(path), "error": str(error.code())},
                )
                self._unanswered.add(path)
                self._sockets.pop(path, None)  # not serving (yet): try again next pass
                self._listed_at = None
                return
            self._unanswered.discard(path)
            problem = self._problem(info, path)
            if not problem:
                plugin_channel = grpc.aio.insecure_channel(f"unix:{info.endpoint}")
                self.plugins.setdefault(info.name, []).append(
                    Plugin(
                        driver=info.name,
                        endpoint=info.endpoint,
                        service=next(s for s in info.supported_versions if s in SERVICES),
                        registration_socket=path,
                        channel=plugin_channel,
                        stub=dra_grpc.DRAPluginStub(plugin_channel),
                    )
                )
                self.registrations += 1
                self._changed.set()
                log.info(
                    "DRA plugin registered",
                    extra={"node": self.node, "driver": info.name, "endpoint": info.endpoint},
                )
            else:
                self.refusals.append(problem)
                log.warning("DRA plugin refused", extra={"node": self.node, "reason": problem})
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.NotifyRegistrationStatus(
                    registration_pb2.RegistrationStatus(
                        plugin_registered=not problem, error=problem
                    ),
                    timeout=REGISTRATION_TIMEOUT_S,
                )

    def _problem(self, info: Any, path: Path) -> str:
        """Why the plugin cannot be registered ("" when it can): the plugin watcher's and the
        DRA handler's checks."""
        if info.type != PLUGIN_TYPE:
            return f"no handler registered for plugin type: {info.type} at socket {path}"
        where = f"invalid supported gRPC versions of DRA driver plugin {info.name} at endpoint"
        services = list(info.supported_versions)
        if not services:
            return (
                f"{where} {info.endpoint}: empty list of supported gRPC services (aka supported "
                "versions)"
            )
        if not any(s in SERVICES for s in services):
            listed = " ".join(f'"{s}"' for s in services)
            known = " ".join(f'"{s}"' for s in SERVICES)
            return (
                f"{where} {info.endpoint}: none of services supported by the plugin ([{listed}]) "
                f"are supported by the kubelet ([{known}])"
            )
        if any(p.endpoint == info.endpoint for p in self.plugins.get(info.name, [])):
            return f"endpoint {info.endpoint} already registered for DRA driver plugin {info.name}"
        return ""

    async def _deregister(self, path: Path) -> None:
        self._sockets.pop(path, None)
        for driver, plugins in list(self.plugins.items()):
            for plugin in [p for p in plugins if p.registration_socket == path]:
                plugins.remove(plugin)
                with contextlib.suppress(Exception):
                    await plugin.channel.close()
                log.info("DRA plugin unregistered", extra={"node": self.node, "driver": driver})
            if not plugins:
                del self.plugins[driver]

    def plugin(self, driver: str) -> Plugin:
        """``GetPlugin``: the newest registered plugin of ``driver``."""
        if not driver:
            raise DraError("DRA driver name is empty")
        plugins = self.plugins.get(driver)
        if not plugins:
            raise DraError(f"DRA driver {driver} is not registered")
        return plugins[-1]

    # --- prepare --------------------------------------------------------------------------------

    def _claims_of(self, pod: Obj) -> list[tuple[Obj, Obj]]:
        """(pod claim entry, claim) for each claim the pod needs, checked as the kubelet does
        before it changes anything."""
        meta = pod["metadata"]
        found: list[tuple[Obj, Obj]] = []
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            name, check_owner, problem = dra.claim_name(pod, pod_claim)
            if problem:
                raise DraError(problem)
            if name is None:
                continue
            claim = self.api.find(RESOURCE_CLAIM, meta["namespace"], name)
            if claim is None:
                raise DraError(
                    f'fetch ResourceClaim {name}: resourceclaims.resource.k8s.io "{name}" not found'
                )
            if check_owner and not dra.owned_by(claim, pod):
                raise DraError(
                    f"ResourceClaim {meta['namespace']}/{name} was not created for pod "
                    f"{meta['namespace']}/{meta['name']} (pod is not owner)"
                )
            if not dra.reserved_for(claim, meta["uid"]):
                raise DraError(
                    f"pod {meta['name']} ({meta['uid']}) is not allowed to use ResourceClaim "
                    f"{name} ({claim['metadata']['uid']})"
                )
            for driver in _drivers(claim):
                self.plugin(driver)
            found.append((pod_claim, claim))
        return found

    async def prepare(self, pod: Obj) -> None:
        """``PrepareResources`` for every claim of ``pod``; DraError when the pod cannot start."""
        try:
            await self._prepare(pod)
        except DraError as error:
            raise DraError(f"prepare dynamic resources: {error}") from None

    async def _prepare(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        batches: dict[str, list[ClaimInfo]] = {}
        for _, claim in self._claims_of(pod):
            meta = claim["metadata"]
            key = (meta["namespace"], meta["name"])
            info = self.claims.get(key)
            if info is None:
                info = ClaimInfo(meta["uid"], meta["namespace"], meta["name"], _drivers(claim))
                self.claims[key] = info
            elif info.uid != meta["uid"]:
                raise DraError(
                    f"old ResourceClaim with same name {meta['name']} and different UID "
                    f"{info.uid} still exists (previous pod force-deleted?!)"
                )
            info.pods.add(uid)
            if info.prepared:
                continue
            for driver in info.drivers:
                batches.setdefault(driver, []).append(info)
        for driver, infos in batches.items():
            await self._prepare_batch(driver, infos)
        for infos in batches.values():
            for info in infos:
                info.prepared = True

    async def _call(self, method: str, driver: str, infos: list[ClaimInfo]) -> Any:
        """One ``NodePrepareResources`` or ``NodeUnprepareResources`` call for ``infos``; its
        answer checked as the kubelet checks it: an RPC error, an entry for a claim it did not
        ask about, a claim's error, or a claim left out is a DraError (the last after the
        others' results are taken, by the caller, from the returned answer)."""
        plugin = self.plugin(driver)
        request_type = getattr(dra_pb2, f"{method}Request")
        request = request_type(
            claims=[dra_pb2.Claim(namespace=i.namespace, uid=i.uid, name=i.name) for i in infos]
        )
        try:
            response = await grpccalls.answer(
                getattr(plugin.stub, method)(request, timeout=self.call_timeout_s)
            )
        except grpc.aio.AioRpcError as error:
            raise DraError(f"{method}: {_rpc_text(error)}") from None
        by_uid = {i.uid: i for i in infos}
        for claim_uid, result in response.claims.items():
            info = by_uid.get(claim_uid)
            if info is None:
                raise DraError(f"{method} returned result for unknown claim UID {claim_uid}")
            if result.error:
                raise DraError(f"{method} failed for ResourceClaim {info.name}: {result.error}")
        return response

    async def _prepare_batch(self, driver: str, infos: list[ClaimInfo]) -> None:
        response = await self._call("NodePrepareResources", driver, infos)
        by_uid = {i.uid: i for i in infos}
        for claim_uid, result in response.claims.items():
            by_uid[claim_uid].devices[driver] = [
                PreparedDevice(
                    driver=driver,
                    pool=d.pool_name,
                    device=d.device_name,
                    request_names=tuple(d.request_names),
                    cdi_device_ids=tuple(d.cdi_device_ids),
                    share_id=d.share_id if d.HasField("share_id") else None,
                )
                for d in result.devices
            ]
        _all_answered("NodePrepareResources", infos, response)

    def cdi_devices(self, pod: Obj, container: Obj) -> dict[str, list[str]]:
        """``GetResources``: claim name -> the CDI device names ``container`` gets from it."""
        wanted: dict[str, list[str]] = {}
        for claim in (container.get("resources") or {}).get("claims") or []:
            wanted.setdefault(claim.get("name", ""), []).append(claim.get("request") or "")
        found: dict[str, list[str]] = {}
        namespace = pod["metadata"]["namespace"]
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            requests = wanted.get(pod_claim.get("name", ""))
            if requests is None:
                continue
            name, _, problem = dra.claim_name(pod, pod_claim)
            if problem:
                raise DraError(problem)
            if name is None:
                continue
            info = self.claims.get((namespace, name))
            if info is None:
                raise DraError(
                    f"internal error: unable to get claim info for ResourceClaim {name} in "
                    f"namespace {namespace}"
                )
            for request in requests:
                found.setdefault(name, []).extend(info.cdi_devices(request))
        return found

    def container_records(self, pod: Obj, now: float) -> list[ContainerRecord]:
        """What each container gets from its claims once they are prepared: its CDI devices
        resolved against the CDI spec directories (``cdi.UnresolvableDevicesError`` when a
        name has no spec: the runtime cannot create the container)."""
        meta = pod["metadata"]
        spec = pod.get("spec") or {}
        records: list[ContainerRecord] = []
        for container in list(spec.get("initContainers") or []) + list(
            spec.get("containers") or []
        ):
            for claim, names in self.cdi_devices(pod, container).items():
                edits = cdi.resolve(names, self.cdi_dirs, self.cdi_cache)
                records.append(
                    ContainerRecord(
                        pod_uid=meta["uid"],
                        namespace=meta["namespace"],
                        pod=meta["name"],
                        container=container.get("name", ""),
                        resource=f"resourceclaims/{claim}",
                        device_ids=tuple(names),
                        envs=edits.env,
                        mounts=tuple(edits.mounts),
                        annotations={},
                        allocated_at=now,
                        device_nodes=tuple(edits.device_nodes),
                    )
                )
        return records

    # --- unprepare ------------------------------------------------------------------------------

    def pod_claims(self, pod_uid: str) -> list[ClaimInfo]:
        return [info for info in self.claims.values() if pod_uid in info.pods]

    async def unprepare(self, pod_uid: str) -> list[str]:
        """``UnprepareResources`` for a pod that ended: the names of the claims unprepared.
        DraError when a driver failed; the claims it kept are tried again next time."""
        batches: dict[str, list[ClaimInfo]] = {}
        done: list[ClaimInfo] = []
        for info in self.pod_claims(pod_uid):
            if len(info.pods) > 1:
                info.pods.discard(pod_uid)  # another pod here still uses it
                continue
            # Also a claim whose prepare failed half-way: the driver may have done some of it.
            done.append(info)
            for driver in info.drivers:
                batches.setdefault(driver, []).append(info)
        try:
            for driver, infos in batches.items():
                await self._unprepare_batch(driver, infos)
        except DraError as error:
            raise DraError(f"unprepare dynamic resources: {error}") from None
        for info in done:
            self.claims.pop((info.namespace, info.name), None)
        return [info.name for info in done]

    async def _unprepare_batch(self, driver: str, infos: list[ClaimInfo]) -> None:
        response = await self._call("NodeUnprepareResources", driver, infos)
        _all_answered("NodeUnprepareResources", infos, response)


def _all_answered(method: str, infos: list[ClaimInfo], response: Any) -> None:
    unfinished = len(infos) - len(response.claims)
    if unfinished:
        raise DraError(f"{method} skipped {unfinished} ResourceClaims")


def _drivers(claim: Obj) -> tuple[str, ...]:
    """The drivers of the claim's allocation, each once, in order."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return tuple(dict.fromkeys(str(r.get("driver", "")) for r in results))


def _rpc_text(error: grpc.aio.AioRpcError) -> str:
    code = error.code()
    name = code.name if code is not None else "Unknown"
    pretty = "".join(part.capitalize() for part in name.split("_"))
    return f"rpc error: code = {pretty} desc = {error.details()}"
