"""Pure: the parts of Kubernetes objects the binder reads besides pods, decoded straight from API
JSON (pods are in ``shared.kubeobjects``, which the placer's extender reads too).

msgspec Structs over the JSON the API server sends (unknown fields are skipped, so decoding is
fast and a newer API server's additions never break it).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.kubeobjects import Condition, ObjectMeta, Pod, Quantity


class NodeTaint(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    key: str = ""
    value: str | None = None
    effect: str = ""


class NodeSpec(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    unschedulable: bool | None = None
    taints: tuple[NodeTaint, ...] | None = None


class NodeStatus(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    allocatable: dict[str, Quantity] | None = None
    conditions: tuple[Condition, ...] | None = None


class Node(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ObjectMeta
    spec: NodeSpec = NodeSpec()
    status: NodeStatus = NodeStatus()


class Namespace(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """What pod-affinity namespace selectors read of a namespace: its labels."""

    metadata: ObjectMeta


class LeaseSpec(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None
    renew_time: str | None = None
    lease_transitions: int | None = None


class Lease(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ObjectMeta
    spec: LeaseSpec = LeaseSpec()


class ListMeta(msgspec.Struct, frozen=True, gc=False, kw_only=True, rename="camel"):
    resource_version: str = ""
    continue_: str | None = msgspec.field(default=None, name="continue")


class PodList(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ListMeta = ListMeta()
    items: tuple[Pod, ...] | None = None


class NodeList(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ListMeta = ListMeta()
    items: tuple[Node, ...] | None = None


class NamespaceList(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ListMeta = ListMeta()
    items: tuple[Namespace, ...] | None = None


class Status(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """``metav1.Status``: what the API answers on failure (and on a successful Binding)."""

    status: str = ""
    code: int = 0
    reason: str = ""
    message: str = ""


WatchType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]


class RawWatchEvent(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    type: WatchType
    object: msgspec.Raw


class Bookmark(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    metadata: ObjectMeta = ObjectMeta()
