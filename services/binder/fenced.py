"""The cluster gateway for writers: every write first checks that this binder holds the Lease.

Reads pass through. A write from a binder that is not (or no longer) the leader raises
:class:`~services.binder.gateway.NotLeaderError` before anything is sent, so a leader that
cannot renew stops writing at once, even with work in flight.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from services.binder.gateway import (
    Answer,
    Body,
    ClusterGateway,
    Kind,
    Listing,
    NotLeaderError,
    WatchEvent,
)
from services.binder.rules.objects import Lease
from shared.kubeobjects import Pod


class FencedGateway:
    """The cluster gateway for writers: every write first checks that this binder leads."""

    def __init__(self, gateway: ClusterGateway, is_leader: Callable[[], bool]) -> None:
        self._gateway = gateway
        self._is_leader = is_leader

    def _fence(self, verb: str) -> None:
        if not self._is_leader():
            raise NotLeaderError(verb)

    async def list_objects(
        self, kind: type[Kind], *, field_selector: str = "", label_selector: str = ""
    ) -> Listing[Kind]:
        return await self._gateway.list_objects(
            kind, field_selector=field_selector, label_selector=label_selector
        )

    def watch_objects(
        self,
        kind: type[Kind],
        *,
        resource_version: str,
        field_selector: str = "",
        label_selector: str = "",
    ) -> AsyncGenerator[WatchEvent[Kind], None]:
        return self._gateway.watch_objects(
            kind,
            resource_version=resource_version,
            field_selector=field_selector,
            label_selector=label_selector,
        )

    async def read_pod(self, namespace: str, name: str) -> Pod | None:
        return await self._gateway.read_pod(namespace, name)

    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: dict[str, str]
    ) -> Answer:
        self._fence("create pods/binding")
        return await self._gateway.bind_pod(
            namespace, name, uid=uid, node=node, annotations=annotations
        )

    async def patch_pod(self, namespace: str, name: str, patch: Body) -> Answer:
        self._fence("patch pods")
        return await self._gateway.patch_pod(namespace, name, patch)

    async def patch_pod_status(self, namespace: str, name: str, patch: Body) -> Answer:
        self._fence("patch pods/status")
        return await self._gateway.patch_pod_status(namespace, name, patch)

    async def create_event(self, namespace: str, event: Body) -> Answer:
        self._fence("create events")
        return await self._gateway.create_event(namespace, event)

    async def patch_event(self, namespace: str, name: str, patch: Body) -> Answer:
        self._fence("patch events")
        return await self._gateway.patch_event(namespace, name, patch)

    async def read_lease(self, namespace: str, name: str) -> Lease | None:
        return await self._gateway.read_lease(namespace, name)

    async def create_lease(self, namespace: str, lease: Body) -> Answer:
        self._fence("create leases")
        return await self._gateway.create_lease(namespace, lease)

    async def replace_lease(self, namespace: str, name: str, lease: Body) -> Answer:
        self._fence("update leases")
        return await self._gateway.replace_lease(namespace, name, lease)

    async def close(self) -> None:
        await self._gateway.close()
