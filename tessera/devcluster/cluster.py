"""A simulated cluster: the Kubernetes API test double and one simulated kubelet per node.

``async with SimulatedCluster(nodes, workdir=...) as cluster:`` serves the API (``cluster.url``,
``cluster.write_kubeconfig(path)``), creates every Node and serves every node's ``kubelet.sock``
under ``workdir/<n>/`` (short paths: unix sockets must stay under 107 bytes). The device plugins
and every other service are separate processes started by the caller (``tessera up``, tests);
each node's plugin directory is :meth:`SimulatedCluster.plugin_dir`. A DRA driver's kubelet
plugin registers in the node's ``kubelet.registry_dir`` and writes CDI specs to its
``kubelet.cdi_dir``; kube-controller-manager's claim handling runs beside the API (``claims.py``).

One in-process watch of every pod routes each change to the kubelet of the pod's node, as each
kubelet's own ``spec.nodeName`` watch would. :meth:`create_pod` records the moment it created a
pod (to the microsecond, which ``creationTimestamp`` is not), for latency reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tessera.devcluster.apiserver import ApiServer
from tessera.devcluster.claims import ClaimController
from tessera.devcluster.kubelet import NodeSpec, Overcommit, PodRecord, SimulatedKubelet
from tessera.devcluster.resources import POD, ApiError, Obj
from tessera.devcluster.store import Closed, Watcher


def _everything(_fields: Any, _labels: Any) -> bool:
    return True


class SimulatedCluster:
    """The API test double plus a simulated kubelet per node (see the module docstring)."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        *,
        workdir: Path,
        api: ApiServer | None = None,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
        kubelet_retry_s: float = 1.0,
        dra_poll_s: float = 0.2,
    ) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names repeat: {names}")
        # No token: kubectl sends no bearer token over plain http (the API listens on loopback).
        self.api = api or ApiServer(graceful_deletion=True, bookmark_interval_s=1.0, token="")
        self.workdir = workdir
        self.clock = clock
        self._host, self._port = host, port
        self.kubelets: dict[str, SimulatedKubelet] = {
            spec.name: SimulatedKubelet(
                api=self.api,
                spec=spec,
                plugin_dir=workdir / str(index),
                clock=clock,
                node_index=index,
                retry_s=kubelet_retry_s,
                dra_poll_s=dra_poll_s,
            )
            for index, spec in enumerate(nodes)
        }
        self.claims = ClaimController(self.api)
        """kube-controller-manager's part for ResourceClaims (``claims.py``)."""
        self.api.pod_logs = self._logs
        self.created_at: dict[str, float] = {}
        """Pod uid -> when :meth:`create_pod` created it."""
        self._router: asyncio.Task[None] | None = None
        self._watcher: Watcher | None = None

    @property
    def url(self) -> str:
        return self.api.url

    def plugin_dir(self, node: str) -> Path:
        return self.kubelets[node].plugin_dir

    def write_kubeconfig(self, path: str | Path) -> Path:
        return self.api.write_kubeconfig(path)

    async def start(self) -> None:
        if not self.api.url:
            await self.api.start(self._host, self._port)
        self.workdir.mkdir(parents=True, exist_ok=True)
        initial, self._watcher = self.api.store.watch(
            POD, namespace="", match=_everything, since=None
        )
        for kubelet in self.kubelets.values():
            await kubelet.start()
        self.claims.start()
        for kind, pod in initial:
            self._route(kind, pod)
        self._router = asyncio.create_task(self._route_changes(), name="cluster-pod-router")

    def expect_plugins_to_stop(self) -> None:
        """The device plugins are about to be stopped on purpose: their streams' ends are
        logged at debug level, not warned about (a kubelet would warn, as it cannot know)."""
        for kubelet in self.kubelets.values():
            kubelet.plugins_stopping = True

    async def stop(self) -> None:
        if self._router is not None:
            self._router.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._router
            self._router = None
        if self._watcher is not None:
            self.api.store.stop_watch(self._watcher)
            self._watcher = None
        await self.claims.stop()
        for kubelet in self.kubelets.values():
            await kubelet.stop()
        await self.api.stop()

    async def __aenter__(self) -> SimulatedCluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _route_changes(self) -> None:
        watcher = self._watcher
        assert watcher is not None
        while True:
            change = await watcher.queue.get()
            if isinstance(change, Closed):
                return
            seen = watcher.translate(change)
            if seen is not None:
                kind, pod = seen
                if kind == "DELETED" and change.previous is not None:
                    pod = change.previous
                self._route(kind, pod)

    def _route(self, kind: str, pod: Obj) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        kubelet = self.kubelets.get(node) if node else None
        if kubelet is not None:
            kubelet.pod_event(kind, pod)

    def _logs(self, pod: Obj, container: str) -> str:
        node = (pod.get("spec") or {}).get("nodeName")
        kubelet = self.kubelets.get(node) if node else None
        if kubelet is None:
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{pod["metadata"]["name"]}" is waiting to '
                "start: the pod is not bound to a node",
            )
        return kubelet.logs(pod, container)

    # --- helpers for callers --------------------------------------------------------------------

    def create_pod(self, pod: Obj, namespace: str = "") -> Obj:
        """Create a pod through the API (in-process) and remember when."""
        at = self.clock()
        created = self.api.create(POD, pod, namespace)
        self.created_at[created["metadata"]["uid"]] = at
        return created

    def pods(self, namespace: str = "") -> list[Obj]:
        return self.api.objects(POD, namespace)

    async def wait_registered(self, resources: dict[str, str], timeout: float = 60.0) -> None:
        """Wait until each node's plugin for ``resources[node]`` registered and listed devices."""
        await asyncio.gather(
            *(
                self.kubelets[node].registered(resource, timeout)
                for node, resource in resources.items()
            )
        )

    def pod_records(self) -> Iterable[PodRecord]:
        for kubelet in self.kubelets.values():
            yield from kubelet.pods.values()

    def overcommits(self) -> list[Overcommit]:
        return [o for kubelet in self.kubelets.values() for o in kubelet.overcommits]
