"""Builders for binder tests: Kubernetes objects as the API takes them, and the placer's side
(the placement as a record, rejections) as the placer would write it."""

from __future__ import annotations

from typing import Any

from shared.messages.assignments import AssignmentRecord
from shared.messages.base import ContainerSlices
from shared.messages.ledger import Booking
from shared.messages.placement import PlacementRejected, RejectionReason
from tests.harness import wire
from tests.harness.commits import booking_of

NODE = "gpu-1"
DECIDED_AT = wire.NOW


def container(
    name: str = "main",
    *,
    gpu: int | None = None,
    memory: int | None = None,
    percentage: int | None = None,
    cores: int | None = None,
    cpu: str | None = "500m",
    ram: str | None = "1Gi",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    for resource, value in (
        ("tessera.dev/gpu", gpu),
        ("tessera.dev/gpu-memory", memory),
        ("tessera.dev/gpu-memory-percentage", percentage),
        ("tessera.dev/gpu-cores", cores),
        ("cpu", cpu),
        ("memory", ram),
    ):
        if value is not None:
            limits[resource] = str(value)
    limits.update(extra or {})
    return {"name": name, "image": "registry.example/train:1", "resources": {"limits": limits}}


def pod(
    name: str,
    *containers: dict[str, Any],
    namespace: str = "default",
    scheduler: str = "tessera",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    node: str | None = None,
    priority: int | None = None,
    init_containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": list(containers) or [container(gpu=1, memory=4096)],
    }
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    if init_containers:
        spec["initContainers"] = init_containers
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def node(
    name: str = NODE,
    *,
    cpu: str = "64",
    memory: str = "256Gi",
    gpus: int | None = 8,
    ready: bool = True,
    unschedulable: bool = False,
    labels: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    allocatable: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus is not None:
        allocatable["tessera.dev/gpu"] = str(gpus)
    allocatable.update(extra or {})
    spec: dict[str, Any] = {"unschedulable": True} if unschedulable else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {"kubernetes.io/hostname": name}},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def slices(
    container_name: str = "main", *gpus: tuple[int, int, int], devices: int | None = None
) -> ContainerSlices:
    """Slices on GPUs given as (index, MiB, cores), of UUID ``GPU-<index:04d>``; ``devices`` =
    tessera.dev/gpu asked."""
    chosen = gpus or ((0, 4096, 25),)
    return wire.container(
        container_name,
        *(
            wire.share(i, uuid=f"GPU-{i:04d}", memory_mib=mib, cores=cores)
            for i, mib, cores in chosen
        ),
        devices=devices,
    )


def record(
    uid: str,
    name: str,
    *containers: ContainerSlices,
    node: str = NODE,
    namespace: str = "default",
    state: str = "reserved",
    decided_at: float = DECIDED_AT,
    bound_at: float | None = None,
    commit: str | None = None,
) -> AssignmentRecord:
    """A record of ``placer-test`` (one default slice unless ``containers``) of commit ``commit``
    (default ``commit-<uid>``)."""
    return wire.record(
        uid,
        *(containers or (slices(),)),
        node=node,
        name=name,
        namespace=namespace,
        state=state,  # type: ignore[arg-type]
        decided_at=decided_at,
        placer_id="placer-test",
        bound_at=bound_at,
        commit=commit,
    )


def booking(of: AssignmentRecord) -> Booking:
    """The booking a placer committed for the record ``of`` (what the binder binds)."""
    return booking_of(of)


def rejection(
    uid: str, name: str, *reasons: tuple[int, str], namespace: str = "default"
) -> PlacementRejected:
    return PlacementRejected(
        pod_uid=uid,
        namespace=namespace,
        name=name,
        reasons=tuple(RejectionReason(reason=r, nodes=n) for n, r in reasons),
        decided_at=DECIDED_AT,
        placer_id="placer-test",
    )
