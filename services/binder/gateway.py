"""The cluster gateway port: the few Kubernetes API calls the binder makes, as plain data.

One real adapter (``kube.py``, kubernetes-asyncio) implements it; tests run that adapter against
the API test double (``tessera.devcluster.apiserver``). Outcomes the API answers (404, 409, 422,
...) are data (:class:`Answer`); transient failures (5xx, 429, timeouts, lost connections) are
retried inside the adapter with capped backoff, and only when they persist does a call raise
:class:`ApiUnavailableError`, which the shell treats as "try again later" (a JetStream message is
redelivered, an informer lists again). A watch whose resourceVersion is too old raises
:class:`WatchExpiredError`: the informer lists again.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from services.binder.rules.draobjects import ResourceClaim, ResourceClaimTemplate
from services.binder.rules.objects import Lease, Namespace, Node
from shared.kubeobjects import Pod

Kind = TypeVar("Kind", Pod, Node, Namespace, ResourceClaim, ResourceClaimTemplate)


class ApiUnavailableError(Exception):
    """The API server could not be reached or kept failing (the call may be retried later)."""

    def __init__(self, verb: str, detail: str) -> None:
        super().__init__(f"{verb}: {detail}")
        self.verb = verb
        self.detail = detail


class NotLeaderError(ApiUnavailableError):
    """A write was attempted by a binder that does not hold the lease (nothing was sent)."""

    def __init__(self, verb: str) -> None:
        super().__init__(verb, "this binder is not the leader")


class WatchExpiredError(Exception):
    """410 Gone: the watch's resourceVersion is older than the server keeps; list again."""


@dataclass(frozen=True)
class Answer:
    """The API server's answer to a write: the HTTP status and its Status reason/message."""

    code: int
    reason: str = ""
    message: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.code < 300


@dataclass(frozen=True)
class Listing(Generic[Kind]):
    items: list[Kind]
    resource_version: str


@dataclass(frozen=True)
class WatchEvent(Generic[Kind]):
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: Kind | None
    """None for a BOOKMARK."""
    resource_version: str


Body = dict[str, Any]


class ClusterGateway(Protocol):
    """The Kubernetes API as the binder uses it."""

    async def list_objects(
        self, kind: type[Kind], *, field_selector: str = "", label_selector: str = ""
    ) -> Listing[Kind]:
        """Every matching object (all pages) and the list's resourceVersion."""
        ...

    def watch_objects(
        self,
        kind: type[Kind],
        *,
        resource_version: str,
        field_selector: str = "",
        label_selector: str = "",
    ) -> AsyncGenerator[WatchEvent[Kind], None]:
        """Changes after ``resource_version`` (bookmarks included) until the server ends the
        stream or the connection drops; WatchExpiredError on 410."""
        ...

    async def read_pod(self, namespace: str, name: str) -> Pod | None:
        """The pod, or None when it does not exist."""
        ...

    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: dict[str, str]
    ) -> Answer:
        """Create the pod's Binding (201 on success; 409 when it already has a node or its uid
        differs); the annotations are merged into the pod by the API server."""
        ...

    async def patch_pod(self, namespace: str, name: str, patch: Body) -> Answer:
        """JSON merge patch of the pod."""
        ...

    async def patch_pod_status(self, namespace: str, name: str, patch: Body) -> Answer:
        """Strategic merge patch of the pod's status (conditions merge by type)."""
        ...

    async def create_event(self, namespace: str, event: Body) -> Answer:
        """Create an events.k8s.io/v1 Event."""
        ...

    async def patch_event(self, namespace: str, name: str, patch: Body) -> Answer:
        """JSON merge patch of an events.k8s.io/v1 Event."""
        ...

    async def read_lease(self, namespace: str, name: str) -> Lease | None:
        """The coordination.k8s.io/v1 Lease, or None when it does not exist."""
        ...

    async def create_lease(self, namespace: str, lease: Body) -> Answer:
        """Create the Lease (409 when it exists)."""
        ...

    async def replace_lease(self, namespace: str, name: str, lease: Body) -> Answer:
        """Replace the Lease; 409 when its ``metadata.resourceVersion`` is not the current one."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
