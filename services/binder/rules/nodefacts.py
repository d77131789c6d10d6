"""Pure: a Kubernetes Node and what the pods on it request, as the placer's ``NodeFacts``.

The node's labels and taints go with them, and the pods on it that Tessera did not place
(``neighbours.py``): what ``nodeSelector``, affinity, tolerations and spread are judged by.

A pod's CPU and memory request is what kube-scheduler counts: the larger of the sum over its app
containers and the largest init container, plus the pod overhead; a container without a request
counts its limit (the API server defaults requests to limits). Quantities the API server would
not have accepted count as zero rather than stopping the binder.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from services.binder.rules.objects import Node
from shared import annotations as names
from shared.kubeobjects import Pod, Quantity
from shared.messages.constraints import ExistingPod, Taint
from shared.messages.nodes import NodeFacts
from shared.podspec import container_request
from shared.quantity import MIB, QuantityError, mebibytes, milli, parse_quantity, whole


class Requested(msgspec.Struct, frozen=True, kw_only=True):
    """CPU and memory requested on a node; ``tessera_*`` is the part Tessera's own pods hold."""

    cpu_milli: int = 0
    memory_mib: int = 0
    tessera_cpu_milli: int = 0
    tessera_memory_mib: int = 0

    def __add__(self, other: Requested) -> Requested:
        return Requested(
            cpu_milli=self.cpu_milli + other.cpu_milli,
            memory_mib=self.memory_mib + other.memory_mib,
            tessera_cpu_milli=self.tessera_cpu_milli + other.tessera_cpu_milli,
            tessera_memory_mib=self.tessera_memory_mib + other.tessera_memory_mib,
        )

    def __sub__(self, other: Requested) -> Requested:
        return Requested(
            cpu_milli=self.cpu_milli - other.cpu_milli,
            memory_mib=self.memory_mib - other.memory_mib,
            tessera_cpu_milli=self.tessera_cpu_milli - other.tessera_cpu_milli,
            tessera_memory_mib=self.tessera_memory_mib - other.tessera_memory_mib,
        )


def _amount(value: Quantity | None, convert: Callable[[Quantity], int]) -> int:
    if value is None:
        return 0
    try:
        return max(0, convert(value))
    except QuantityError:
        return 0


def _pod_amount(pod: Pod, resource: str, convert: Callable[[Quantity], int]) -> int:
    apps = sum(_amount(container_request(c, resource), convert) for c in pod.spec.containers)
    inits = max(
        (_amount(container_request(c, resource), convert) for c in pod.spec.init_containers or ()),
        default=0,
    )
    overhead = _amount((pod.spec.overhead or {}).get(resource), convert)
    return max(apps, inits) + overhead


def pod_requested(pod: Pod, *, ours: bool) -> Requested:
    """What ``pod`` takes from its node's allocatable CPU and memory (``ours``: a pod Tessera
    placed, whose requests the placer's bookings already count)."""
    cpu = _pod_amount(pod, "cpu", milli)
    memory = _pod_amount(pod, "memory", mebibytes)
    return Requested(
        cpu_milli=cpu,
        memory_mib=memory,
        tessera_cpu_milli=cpu if ours else 0,
        tessera_memory_mib=memory if ours else 0,
    )


def _floor_mib(value: Quantity) -> int:
    return int(parse_quantity(value) // MIB)


def extended_allocatable(node: Node) -> dict[str, int]:
    """The node's allocatable ``tessera.dev/*`` resources (what its device plugin advertises)."""
    extended = {}
    for resource, value in (node.status.allocatable or {}).items():
        if not resource.startswith(names.PREFIX):
            continue
        try:
            count = whole(value)
        except QuantityError:
            continue
        if count is not None:
            extended[resource] = count
    return extended


def node_facts(
    node: Node, requested: Requested, *, pods: tuple[ExistingPod, ...] = (), now: float
) -> NodeFacts:
    """The placer's view of ``node`` with ``requested`` summed over its non-terminated pods and
    ``pods`` (those not Tessera's) on it."""
    allocatable = node.status.allocatable or {}
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())
    return NodeFacts(
        node=node.metadata.name,
        cpu_allocatable_milli=_amount(allocatable.get("cpu"), milli),
        memory_allocatable_mib=_amount(allocatable.get("memory"), _floor_mib),
        cpu_requested_milli=requested.cpu_milli,
        memory_requested_mib=requested.memory_mib,
        tessera_cpu_requested_milli=requested.tessera_cpu_milli,
        tessera_memory_requested_mib=requested.tessera_memory_mib,
        labels=dict(node.metadata.labels or {}),
        ready=ready,
        schedulable=not node.spec.unschedulable,
        observed_at=now,
        extended_allocatable=extended_allocatable(node),
        taints=tuple(
            Taint(key=t.key, value=t.value or "", effect=t.effect) for t in node.spec.taints or ()
        ),
        pods=pods,
    )


def gone_facts(node: str, *, now: float) -> NodeFacts:
    """The facts published when ``node`` left the cluster."""
    return NodeFacts(
        node=node,
        cpu_allocatable_milli=0,
        memory_allocatable_mib=0,
        ready=False,
        schedulable=False,
        observed_at=now,
        deleted=True,
    )


def same_facts(a: NodeFacts | None, b: NodeFacts) -> bool:
    """Equal apart from when they were observed (nothing worth publishing again)."""
    return a is not None and msgspec.structs.replace(a, observed_at=b.observed_at) == b


def only_tessera_moved(published: NodeFacts, facts: NodeFacts) -> bool:
    """Whether ``facts`` differ from ``published`` only in what Tessera's own pods request.

    The placer counts the CPU and memory of Tessera's pods from its own bookings and subtracts
    the ``tessera_*`` part of what is published, so such a change leaves its view of the node
    exactly as it was: a burst of Tessera's pods need not publish the node's facts per pod.
    """
    return (
        facts.cpu_requested_milli - facts.tessera_cpu_requested_milli
        == published.cpu_requested_milli - published.tessera_cpu_requested_milli
        and facts.memory_requested_mib - facts.tessera_memory_requested_mib
        == published.memory_requested_mib - published.tessera_memory_requested_mib
        and same_facts(
            msgspec.structs.replace(
                published,
                cpu_requested_milli=facts.cpu_requested_milli,
                memory_requested_mib=facts.memory_requested_mib,
                tessera_cpu_requested_milli=facts.tessera_cpu_requested_milli,
                tessera_memory_requested_mib=facts.tessera_memory_requested_mib,
            ),
            facts,
        )
    )
